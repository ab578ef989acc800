"""Throughput and peak memory of plain training, of every ms_accum path and of PyTorch, LeNet5 on CPU.

A probe kept in the lab: its figures are in docs/performance_history.md ("Throughput: accumulation against plain
training"), measured with

    .venv/bin/python benchmarks/lab/accumulation.py --repeats 3 --seconds 6 \\
        --configs plain-b,three-cells,functional,plain-Nb,plain-b-data,driver,model-accu
    .venv/bin/python benchmarks/lab/accumulation.py --batch 256 --steps 16 --repeats 1 --seconds 15 \\
        --configs plain-b,three-cells,functional,plain-Nb,plain-b-data,driver,model-accu      # memory

and also runs as ``.venv/bin/python benchmarks/lab/accumulation.py`` (micro-batch 32 x 4, 3 processes each) or
with ``--mode pynative``.

Each configuration runs in fresh processes, taking turns (MindSpore in GRAPH_MODE, or --mode pynative, with
train.py's CPU defaults from model_zoo_lenet/src/cpu_speed.py), on Fashion-MNIST images from the bundled sample
(tiled when a batch needs more), warm-up (compilation and the first updates) excluded. Each feed is compared
with plain training fed the same way:

- tensors (the batches already in memory, a Python loop):
  plain-b (nn.TrainOneStepCell, batch b), three-cells (TrainForwardBackward x N, TrainOptim, TrainClear),
  plain-Nb (nn.TrainOneStepCell, batch N*b), functional (the MindSpore 2.x loop: value_and_grad and
  ms_accum.Accumulator inside a mindspore.jit step);
- a MindSpore dataset with callbacks (a TimeMonitor):
  plain-b-data (mindspore.train.Model over nn.TrainOneStepCell), driver (GradientAccumulation.train_process),
  model-accu (TrainAccuStepsCell through Model_ACCU.train, no sink on CPU);
- PyTorch, tensors, when the optional group is installed (pip install -e .[torch]): torch-plain-b, torch-accum
  (loss / N backward per micro-batch, one step per window), torch-plain-Nb.

It prints samples/s (median over processes), the ratio to plain training at b fed the same way and to plain
training at N*b, each process's peak resident memory (VmHWM, whole process) next to its resident memory
before the first step, and MindSpore's speed relative to PyTorch on the three matching jobs.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

# name: (what it is, the plain-at-b configuration fed the same way)
CONFIGS = {
    "plain-b": ("nn.TrainOneStepCell, batch b", "plain-b"),
    "three-cells": ("TrainForwardBackward x N, TrainOptim, TrainClear", "plain-b"),
    "plain-Nb": ("nn.TrainOneStepCell, batch N*b", "plain-b"),
    "functional": ("value_and_grad + ms_accum.Accumulator, one ms.jit step per micro-batch", "plain-b"),
    "plain-b-data": ("Model.train over nn.TrainOneStepCell, batch b, dataset", "plain-b-data"),
    "driver": ("GradientAccumulation.train_process, dataset", "plain-b-data"),
    "model-accu": ("Model_ACCU.train over TrainAccuStepsCell, dataset", "plain-b-data"),
    "torch-plain-b": ("PyTorch, batch b", "torch-plain-b"),
    "torch-accum": ("PyTorch, loss / N backward x N, one step", "torch-plain-b"),
    "torch-plain-Nb": ("PyTorch, batch N*b", "torch-plain-b"),
}
VERSUS_TORCH = (("plain-b", "torch-plain-b"), ("three-cells", "torch-accum"), ("plain-Nb", "torch-plain-Nb"))
WARMUP_UPDATES = 5


def prepare(path, batch, steps):
    """Write the benchmark's images and labels (8 large batches, from the bundled sample) to `path` (.npz)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    images, labels = harness.sample_arrays(8 * batch * steps)
    np.savez(path, images=images, labels=labels)
    harness.report({"prepared": path})


def mindspore_tensors(config, images, labels, batch, steps):
    """update(k) for the tensor-fed MindSpore configurations."""
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    size = batch * steps if config == "plain-Nb" else batch
    batches = [(Tensor(images[i:i + size]), Tensor(labels[i:i + size])) for i in range(0, len(images), size)]
    per_update = 1 if config == "plain-Nb" else steps
    if config == "three-cells":
        cells = harness.three_cells(*harness.lenet_parts())

        def update(k):
            harness.accumulated_update(cells, harness.window_of(batches, k, per_update))
            return batch * steps
        return update
    if config == "functional":
        from mindspore import nn  # pylint: disable=import-outside-toplevel
        net, loss, optimizer = harness.lenet_parts()
        step = harness.jit_step("accumulator", nn.WithLossCell(net, loss), optimizer, steps)
    else:
        step = harness.plain_step(*harness.lenet_parts())

    def update(k):
        harness.plain_updates(step, harness.window_of(batches, k, per_update))
        return batch * steps
    return update

def mindspore_dataset(config, images, labels, batch, steps, seconds):
    """Samples per second of the dataset-fed MindSpore configurations, whole epochs, after a warm-up epoch."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    big = batch * steps
    data = ds.NumpySlicesDataset({"x": images, "y": labels}, shuffle=False).batch(batch)
    warm = ds.NumpySlicesDataset({"x": images[:2 * big], "y": labels[:2 * big]}, shuffle=False).batch(batch)
    run = harness.dataset_trainer(config, steps)
    run(warm, 1)
    return harness.timed_epochs(lambda epochs: run(data, epochs), seconds, len(images))


def child(config, data_path, batch, steps, seconds, mode):
    """One measurement in this process; reports its samples/s and memory."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    arrays = np.load(data_path)
    images, labels = arrays["images"], arrays["labels"]
    if config.startswith("torch-"):
        before = harness.rss_mib()
        speed = harness.timed(harness.torch_lenet_update(config, images, labels, batch, steps), seconds,
                              WARMUP_UPDATES)
    else:
        harness.start_mindspore(mode)
        before = harness.rss_mib()
        if CONFIGS[config][1] == "plain-b-data":
            speed = mindspore_dataset(config, images, labels, batch, steps, seconds)
        else:
            speed = harness.timed(mindspore_tensors(config, images, labels, batch, steps), seconds, WARMUP_UPDATES)
    harness.report({"samples_per_s": speed, "peak_mib": harness.peak_mib(), "before_mib": before})


def run_child(args, *extra):
    """Run this script in a fresh process with the common options and `extra`; its result."""
    return harness.run_child(__file__, ["--batch", args.batch, "--steps", args.steps, "--seconds", args.seconds,
                                        "--mode", args.mode, *extra])


def pick_configs(text):
    """The configurations asked for, with PyTorch's left out (and said so) when it is not installed."""
    configs = [c for c in text.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        sys.exit(f"--configs: unknown {', '.join(unknown)}; choose from {', '.join(CONFIGS)}.")
    if importlib.util.find_spec("torch") is None and any(c.startswith("torch-") for c in configs):
        print("PyTorch is not installed: its configurations are left out (install them with "
              "`.venv/bin/pip install -e .[torch]`).", flush=True)
        configs = [c for c in configs if not c.startswith("torch-")]
    if not configs:
        sys.exit(f"--configs: nothing left to run in {text!r}; choose from {', '.join(CONFIGS)}.")
    return configs


def print_tables(args, results):
    """The Markdown tables: every configuration, then MindSpore against PyTorch."""
    median = {c: statistics.median(r["samples_per_s"] for r in runs) for c, runs in results.items()}
    b, n = args.batch, args.steps
    print(f"LeNet5, micro-batch b={b}, N={n} (effective batch {b * n}), MindSpore in {args.mode.upper()}_MODE, CPU, "
          f"median of {args.repeats} processes")
    rows = []
    for config, runs in results.items():
        what, baseline = CONFIGS[config]
        nb = "torch-plain-Nb" if config.startswith("torch-") else "plain-Nb"
        vs_b = f"{median[config] / median[baseline]:.2f} ({baseline})" if baseline in median else "-"
        vs_nb = f"{median[config] / median[nb]:.2f}" if nb in median else "-"
        peak = statistics.median(r["peak_mib"] for r in runs)
        before = statistics.median(r["before_mib"] for r in runs)
        rows.append((config, what, f"{median[config]:.0f}", vs_b, vs_nb, f"{peak:.0f} ({before:.0f})",
                     ", ".join(f"{r['samples_per_s']:.0f}" for r in runs)))
    harness.print_table(("configuration", "what runs", "samples/s", "vs plain-b, same feed", "vs plain-Nb",
                         "peak RSS MiB (before)", "runs"), rows)
    pairs = [(m, t) for m, t in VERSUS_TORCH if m in median and t in median]
    if pairs:
        print()
        harness.print_table(("job", "MindSpore samples/s", "PyTorch samples/s", "MindSpore / PyTorch"),
                            [(f"{mine} vs {theirs}", f"{median[mine]:.0f}", f"{median[theirs]:.0f}",
                              f"{median[mine] / median[theirs]:.2f}") for mine, theirs in pairs])

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size b")
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update N")
    parser.add_argument("--repeats", type=int, default=3, help="processes per configuration")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured time per process (roughly)")
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph", help="MindSpore's execution mode")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ",".join(CONFIGS))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare, args.batch, args.steps)
        return
    if args.child:
        child(args.child, args.data, args.batch, args.steps, args.seconds, args.mode)
        return
    for name in ("batch", "steps", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, but got {getattr(args, name)}.")
    configs = pick_configs(args.configs)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "lenet_batches.npz")
        run_child(args, "--prepare", data)
        results = harness.take_turns(configs, args.repeats, lambda config: run_child(args, "--child", config,
                                                                                    "--data", data))
    print_tables(args, results)


if __name__ == "__main__":
    main()
