"""Whether a trainer is freed once dropped, in MindSpore alone and in ms_accum: a Cell alive after ``del`` and
``gc.collect()``, by the way it ran.

    .venv/bin/python benchmarks/lab/kept_cells.py                       # PYNATIVE_MODE and GRAPH_MODE

Each way builds ``nn.TrainOneStepCell`` over a small network (``nn.Dense(8, 10)``, its loss and ``nn.Momentum``),
runs it twice, drops every name of it and collects, then reads a weak reference to it. MindSpore's ways: eager
(PYNATIVE_MODE, nothing compiled), ``ms.jit(cell)`` kept on the cell (as ms_accum's cells compile their step in
PYNATIVE_MODE, ``core/compiled.py``), ``ms.jit(cell)`` not kept, a ``@ms.jit`` function that calls the cell (the
MindSpore tutorial's way), the same followed by ``mindspore.ms_memory_recycle()``, and GRAPH_MODE. ms_accum's way:
``TrainAccuStepsCell`` (N = 2) in the process's mode. Each mode runs in a fresh process. A cell that a compiled graph
ran is kept for the life of the process, with its Parameters (docs/performance.md, "Trainers built one after
another"); a user who builds many in one process holds each.
"""
import gc
import os
import sys
import weakref

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

WAYS = {"pynative": ("eager", "jit-cell-kept", "jit-cell", "jit-function", "jit-function-recycled", "ms_accum"),
        "graph": ("graph", "ms_accum")}


def jit_calling(cell):
    """A ``@ms.jit`` function that calls `cell` (the MindSpore tutorial's train step)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel

    @ms.jit
    def train_step(a, b):
        return cell(a, b)
    return train_step


def kept(way):
    """Whether the trainer run `way` is still alive after ``del`` and ``gc.collect()``."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel
    from ms_accum import TrainAccuStepsCell  # pylint: disable=import-outside-toplevel

    x, y = Tensor(np.ones((4, 8), np.float32)), Tensor(np.zeros(4, np.int32))
    net = nn.Dense(8, 10)
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    optimizer = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    if way == "ms_accum":
        cell = TrainAccuStepsCell(loss, optimizer, accumulation_steps=2)
    else:
        cell = nn.TrainOneStepCell(loss, optimizer)
    step = cell
    if way == "jit-cell-kept":
        cell.step = step = ms.jit(cell)
    elif way == "jit-cell":
        step = ms.jit(cell)
    elif way.startswith("jit-function"):
        step = jit_calling(cell)
    for _ in range(2):
        step(x, y)
    alive = weakref.ref(cell)
    del net, loss, optimizer, cell, step
    gc.collect()
    if way.endswith("recycled"):
        ms.ms_memory_recycle()
        gc.collect()
    return alive() is not None


def main():
    args, modes = harness.mode_arguments(__doc__, tuple(WAYS))
    if args.child:
        harness.start_mindspore(args.child)
        harness.report({"rows": [[args.child, way, kept(way)] for way in WAYS[args.child]]})
        return
    print("| mode | way | alive after del and gc.collect() |\n|---|---|---|")
    for mode in modes:  # each mode in a fresh process: MindSpore's mode is set once per process here
        for mode_name, way, alive in harness.run_child(__file__, ["--child", mode])["rows"]:
            print(f"| {mode_name} | {way} | {'yes' if alive else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
