"""Where a LeNet5 training step spends its time, per kind of kernel, in MindSpore and (if installed) PyTorch.

    .venv/bin/python benchmarks/lab/op_profile.py              # batch 32, 100 profiled steps, GRAPH_MODE

A probe kept in the lab: its figures are in docs/performance_history.md ("The gap to PyTorch, and where the time
goes"), measured with the command above.

One plain training step (forward, backward, Momentum update) on the bundled Fashion-MNIST images, profiled
after a warm-up: MindSpore with its Profiler (kernel times from the CPU framework's op table), PyTorch with
torch.profiler (self CPU time of each aten operator). Kernels are grouped into convolution forward, convolution
backward, max-pool forward, max-pool backward, dense layers and the rest; the figures are milliseconds per step.
This explains the ratio to PyTorch that benchmarks/lab/accumulation.py measures.
"""
import argparse
import csv
import glob
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

GROUPS = ("conv forward", "conv backward", "max-pool forward", "max-pool backward", "dense", "other")
MINDSPORE_GROUPS = {"Conv2D": "conv forward", "Conv2DBackpropInput": "conv backward",
                    "Conv2DBackpropFilter": "conv backward", "MaxPool": "max-pool forward",
                    "MaxPoolGrad": "max-pool backward", "MatMul": "dense"}
TORCH_GROUPS = {"aten::mkldnn_convolution": "conv forward", "aten::convolution_backward": "conv backward",
                "aten::max_pool2d_with_indices": "max-pool forward",
                "aten::max_pool2d_with_indices_backward": "max-pool backward", "aten::addmm": "dense",
                "aten::mm": "dense"}


def images(batch):
    """One batch of the bundled sample, normalised as train.py feeds it (numpy)."""
    from src.dataset import create_dataset  # pylint: disable=import-outside-toplevel
    data = create_dataset(harness.SAMPLE, batch, "train", shuffle=False)
    return next(data.create_tuple_iterator(num_epochs=1, output_numpy=True))


def mindspore_profile(batch, steps, out_dir):
    """ms per step of each kernel group, MindSpore GRAPH_MODE on CPU."""
    harness.start_mindspore("graph")
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    x, y = (Tensor(a) for a in images(batch))
    step = harness.plain_step(*harness.lenet_parts())
    for _ in range(20):
        step(x, y).asnumpy()
    profiler = ms.Profiler(output_path=out_dir)
    start = time.perf_counter()
    for _ in range(steps):
        loss = step(x, y)
    loss.asnumpy()
    wall = (time.perf_counter() - start) * 1e3 / steps
    profiler.stop()
    profiler.analyse()
    tables = glob.glob(os.path.join(out_dir, "**", "cpu_op_type_info_0.csv"), recursive=True)
    if len(tables) != 1:
        raise RuntimeError(f"expected one cpu_op_type_info_0.csv under {out_dir}, found {tables}")
    times = dict.fromkeys(GROUPS, 0.0)
    with open(tables[0], newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            times[MINDSPORE_GROUPS.get(row["op_type"], "other")] += float(row["total_compute_time"]) / steps
    return times, wall


def torch_profile(batch, steps):
    """ms per step of each kernel group, PyTorch on CPU (self CPU time of the aten operators)."""
    import torch  # pylint: disable=import-outside-toplevel
    x, y = images(batch)
    update = harness.torch_lenet_update("torch-plain-b", x, y, batch, 1)  # one step on this batch per call

    def step():
        update(0)

    for _ in range(20):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    wall = (time.perf_counter() - start) * 1e3 / steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    times = dict.fromkeys(GROUPS, 0.0)
    for event in prof.key_averages():
        times[TORCH_GROUPS.get(event.key, "other")] += event.self_cpu_time_total / 1e3 / steps
    return times, wall


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--child", choices=["mindspore", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            times, wall = (mindspore_profile(args.batch, args.steps, tmp) if args.child == "mindspore"
                           else torch_profile(args.batch, args.steps))
        harness.report({"times": times, "wall": wall})
        return
    frameworks = ["mindspore"]
    try:
        import torch  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
        frameworks.append("torch")
    except ImportError:
        print("PyTorch is not installed (`.venv/bin/pip install -e .[torch]`): MindSpore only.")
    results = {}
    for framework in frameworks:  # one process each: the two frameworks' thread pools stay apart
        result = harness.run_child(__file__, ["--child", framework, "--batch", args.batch, "--steps", args.steps])
        results[framework] = result["times"], result["wall"]
    print(f"LeNet5 training step, batch {args.batch}, CPU, ms per step ({args.steps} profiled steps)")
    rows = []
    for group in GROUPS + ("sum of kernels", "wall time per step, unprofiled"):
        row = []
        for times, wall in results.values():
            row.append(sum(times.values()) if group == "sum of kernels" else
                       wall if group.startswith("wall") else times[group])
        ratio = ([f"{row[0] / row[1]:.1f}" if row[1] > 0 else "-"] if len(row) == 2 else [])
        rows.append((group, *(f"{value:.2f}" for value in row), *ratio))
    harness.print_table(("kernels", *results) + (("MindSpore / PyTorch",) if len(results) == 2 else ()), rows)


if __name__ == "__main__":
    main()
