"""Plot a telemetry CSV written by train.py --telemetry_csv (ms_accum.WindowTelemetry) to a PNG.

    python model_zoo_lenet/plot_telemetry.py --csv runs/lenet/telemetry.csv --out runs/lenet/telemetry.png

Four panels against the update number: the window's mean loss, the gradient's global norm, the learning rate,
and the loss scale with skipped windows marked. When the run measured the noise scale (--noise_scale), a fifth
shows the smoothed noise scale B_simple in samples beside the window's samples (the batch actually used), and the
micro-batches per window N.
"""
import argparse
import csv
import os
import sys

from src.cli import run_cli

NUMERIC = ("update", "loss", "grad_norm", "learning_rate", "loss_scale", "skipped")
NOISE = ("noise_scale", "items", "micro_batches", "epoch")


def read_rows(path):
    """The CSV's columns as lists of floats (overflow as 0/1)."""
    if not os.path.isfile(path):
        raise ValueError(f"'--csv' must be a telemetry CSV file, but {path!r} does not exist.")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"'--csv' {path!r} holds no updates.")
    missing = [c for c in NUMERIC + ("overflow",) if c not in rows[0]]
    if missing:
        raise ValueError(f"'--csv' must have the columns of ms_accum.WindowTelemetry, but {path!r} lacks {missing}.")
    columns = {c: [float(r[c]) for r in rows] for c in NUMERIC}
    columns["overflow"] = [r["overflow"] == "True" for r in rows]
    for column in NOISE:  # noise_scale is NaN when not measured (and absent from older CSVs)
        columns[column] = [float(r.get(column) or "nan") for r in rows]
    return columns


def plot(columns, out_path):
    """Draw the four panels (five with the noise scale) into `out_path` (PNG; ``.png`` added to a name without a
    suffix, as matplotlib does); return the path written."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    measured = any(value == value for value in columns["noise_scale"])  # NaN != NaN
    fig, axes = plt.subplots(5 if measured else 4, 1, figsize=(8, 11 if measured else 9), sharex=True)
    x = columns["update"]
    for axis, key, label in zip(axes, ("loss", "grad_norm", "learning_rate", "loss_scale"),
                                ("window mean loss", "gradient global norm", "learning rate", "loss scale")):
        axis.plot(x, columns[key], linewidth=1)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    skipped = [u for u, o in zip(x, columns["overflow"]) if o]
    if skipped:
        axes[3].scatter(skipped, [columns["loss_scale"][x.index(u)] for u in skipped], color="red", s=12,
                        label=f"{len(skipped)} skipped windows")
        axes[3].legend()
    if measured:
        _plot_noise(axes[4], x, columns)
    axes[-1].set_xlabel("update")
    fig.suptitle("ms_accum window telemetry")
    fig.tight_layout()
    if not os.path.splitext(out_path)[1]:  # what matplotlib writes for a name without a suffix
        out_path += ".png"
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def _plot_noise(axis, x, columns):
    """The smoothed noise scale against the window's items (log scale), and N on a second axis."""
    axis.plot(x, columns["noise_scale"], linewidth=1, label="noise scale B_simple (smoothed)")
    axis.plot(x, columns["items"], linewidth=1, label="window items (batch used)")
    axis.set_yscale("log")
    axis.set_ylabel("items")
    axis.grid(alpha=0.3)
    steps = axis.twinx()
    steps.step(x, columns["micro_batches"], where="post", color="grey", linewidth=0.8, label="N (micro-batches)")
    steps.set_ylabel("N")
    lines = axis.get_legend_handles_labels()
    more = steps.get_legend_handles_labels()
    axis.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", required=True, help="telemetry CSV written by train.py --telemetry_csv")
    parser.add_argument("--out", required=True, help="PNG file to write")
    args = parser.parse_args(argv)
    print(f"wrote {plot(read_rows(args.csv), args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
