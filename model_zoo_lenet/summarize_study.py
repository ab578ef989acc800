"""Compare the runs of scripts/noise_study.sh: a Markdown table on stdout and one figure.

    python model_zoo_lenet/summarize_study.py --runs runs/noise_study --out runs/noise_study/noise_study.png

Each run directory holds telemetry.csv (ms_accum.WindowTelemetry) and eval.txt (eval.py's output). The table gives
per run the updates, the samples per update, the test accuracy and the smoothed noise scale at the end of each
epoch; the figure the smoothed noise scale and each run's batch (window samples) against the samples seen.
"""
import argparse
import os
import re
import sys

from plot_telemetry import read_rows
from src.cli import run_cli

ACCURACY = re.compile(r"'Accuracy': ([0-9.]+)")


def read_run(directory):
    """(telemetry columns, test accuracy) of one run directory."""
    columns = read_rows(os.path.join(directory, "telemetry.csv"))
    path = os.path.join(directory, "eval.txt")
    if not os.path.isfile(path):
        raise ValueError(f"'--runs' must hold run directories with eval.txt, but {directory!r} has none.")
    with open(path, encoding="utf-8") as handle:
        found = ACCURACY.search(handle.read())
    if found is None:
        raise ValueError(f"{path!r} holds no \"'Accuracy': ...\" line written by eval.py.")
    return columns, float(found.group(1))


def epoch_ends(columns):
    """The smoothed noise scale after each epoch's last window (NaN where there was no estimate yet)."""
    last = {}
    for epoch, value in zip(columns["epoch"], columns["noise_scale"]):
        last[int(epoch)] = value
    return [last[epoch] for epoch in sorted(last)]


def table(runs):
    """Markdown rows: run, updates, samples per update, accuracy, noise scale at each epoch's end."""
    epochs = max(len(epoch_ends(columns)) for columns, _ in runs.values())
    head = ("| run | updates | samples per update (mean, min-max) | test accuracy | "
            + " | ".join(f"B_simple after epoch {e + 1}" for e in range(epochs)) + " |")
    lines = [head, "|" + "---|" * (4 + epochs)]
    for name, (columns, accuracy) in runs.items():
        items = columns["items"]
        scales = " | ".join(f"{value:.0f}" if value == value else "-" for value in epoch_ends(columns))
        lines.append(f"| {name} | {len(items)} | {sum(items) / len(items):.0f} ({min(items):.0f}-{max(items):.0f}) "
                     f"| {accuracy:.4f} | {scales} |")
    return "\n".join(lines)


def plot(runs, out_path):
    """Smoothed noise scale (solid) and window samples (dotted) of every run against the samples seen."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    fig, axis = plt.subplots(figsize=(8, 4.5))
    for name, (columns, accuracy) in runs.items():
        seen, total = [], 0.0
        for items in columns["items"]:
            total += items
            seen.append(total)
        line, = axis.plot(seen, columns["noise_scale"], linewidth=1, label=f"{name}: B_simple (acc. {accuracy:.3f})")
        axis.plot(seen, columns["items"], linestyle=":", color=line.get_color(), linewidth=1)
    axis.set_yscale("log")
    axis.set_xlabel("samples seen")
    axis.set_ylabel("samples (dotted: the run's batch)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    fig.suptitle("LeNet5 on Fashion-MNIST: the smoothed noise scale against the batch used")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", required=True, help="directory of run directories (scripts/noise_study.sh's OUT)")
    parser.add_argument("--out", required=True, help="PNG file to write")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.runs):
        raise ValueError(f"'--runs' must be a directory of runs, but {args.runs!r} is not a directory.")
    names = sorted(d for d in os.listdir(args.runs) if os.path.isfile(os.path.join(args.runs, d, "telemetry.csv")))
    if not names:
        raise ValueError(f"'--runs' {args.runs!r} holds no run directory with a telemetry.csv.")
    runs = {name: read_run(os.path.join(args.runs, name)) for name in names}
    print(table(runs))
    plot(runs, args.out)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
