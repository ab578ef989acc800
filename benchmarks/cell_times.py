"""Milliseconds per call of each cell: plain TrainOneStepCell against the three accumulation cells.

    .venv/bin/python benchmarks/cell_times.py                  # GRAPH_MODE, LeNet5, batch 32
    .venv/bin/python benchmarks/cell_times.py --mode pynative

All four cells live in one process and take turns in rounds (a slow spell of a shared machine hits them all);
each round times --calls calls of one cell after a short warm-up, waiting for the device at the end, and the
median over rounds is printed. Plain `TrainOneStepCell` and `TrainForwardBackward` run on one batch each call;
`TrainOptim` and `TrainClear` run once per update, so an update of N micro-batches costs about
N * forward-backward + optim + clear against N * plain. With --sync every call waits for its result, as a loop
that reads each loss does: then a call also pays its launch and the readback, which a row of calls overlaps.
"""
import argparse
import statistics
import time

import harness


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--sync", action="store_true", help="wait for each call's result before the next call")
    args = parser.parse_args()
    if min(args.batch, args.rounds, args.calls) < 1:
        parser.error("--batch, --rounds and --calls must be >= 1.")
    harness.start_mindspore(args.mode)
    import numpy as np  # pylint: disable=import-outside-toplevel
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    x = Tensor(rng.normal(size=(args.batch, 1, 32, 32)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, size=args.batch).astype(np.int32))
    plain, forward_backward, optim, clear = harness.plain_and_three_cells()

    def optim_again():  # times TrainOptim on one window, again and again: it refuses that in a training loop
        optim.window.applied = False
        return optim()

    cells = {"TrainOneStepCell (plain step)": lambda: plain(x, y),
             "TrainForwardBackward": lambda: forward_backward(x, y),
             "TrainOptim": optim_again,
             "TrainClear": clear}

    def ms_per_call(call):
        for _ in range(5):
            out = call()
        out.asnumpy()
        start = time.perf_counter()
        for _ in range(args.calls):
            out = call()
            if args.sync:
                out.asnumpy()
        out.asnumpy()
        return (time.perf_counter() - start) * 1e3 / args.calls

    times = harness.rotate({name: lambda call=call: ms_per_call(call) for name, call in cells.items()},
                           args.rounds)
    print(f"LeNet5, batch {args.batch}, {args.mode.upper()}_MODE CPU, median of {args.rounds} rounds of "
          f"{args.calls} calls{', each waited for' if args.sync else ''}")
    harness.print_table(("cell", "ms per call", "rounds"),
                        [(name, f"{statistics.median(values):.2f}", ", ".join(f"{v:.2f}" for v in values))
                         for name, values in times.items()])


if __name__ == "__main__":
    main()
