"""The start-up floor's two graphs written as two ``ms.jit`` functions (``harness.two_graph_steps``,
benchmarks/peers.py's ``checked-two-graphs``) against the same two graphs as two Cells, in GRAPH_MODE, each in fresh
processes taking turns:

    .venv/bin/python benchmarks/lab/floor_as_cells.py --starts 4

Each process builds the model (MindCV's EdgeNeXt-XX-Small at 64 x 64 by default, micro-batches of 8, N = 4) and
times its first update (both graphs compiled), its next 3 windows and 8 windows after those (the steady time per
window). The two variants run the same operations on the same Parameters (the tutorial's buffers and the checked
window end of ``harness.checked_window_end``); only the way MindSpore is handed them differs
(``harness.two_graph_steps``, with and without ``cells``).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

VARIANTS = ("jit-functions", "cells")


def one_start(args):
    """This process: one variant's first update, next 3 windows and steady seconds per window."""
    harness.start_mindspore("graph")
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = harness.build(args.model, args.classes)
    loss_net = nn.WithLossCell(net, loss)
    micro_step, window_end = harness.two_graph_steps(loss_net, optimizer, args.steps, checked=True,
                                                     cells=args.variant == "cells")
    batches = harness.random_batches(args, 12 * args.steps, seed=1)
    data = list(harness.dataset_of(batches).create_tuple_iterator(num_epochs=1))

    def windows(first, last):
        began = time.perf_counter()
        for index in range(first * args.steps, last * args.steps):
            micro_step(*data[index])
            if index % args.steps == args.steps - 1:
                window_end()
        float(optimizer.parameters[-1].asnumpy().sum())  # wait for the last update
        return time.perf_counter() - began
    harness.report({"first_update_s": windows(0, 1), "next_3_s": windows(1, 4), "steady_s": windows(4, 12) / 8})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=harness.model_name, default="edgenext_xx_small",
                        help="a MindCV model name, or 'lenet'")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="N")
    parser.add_argument("--starts", type=harness.argtypes().positive_int, default=4, help="fresh processes per variant")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        one_start(args)
        return
    argv = sys.argv[1:]
    results = harness.take_turns(VARIANTS, args.starts,
                                 lambda variant: harness.run_child(__file__, [*argv, "--variant", variant],
                                                                   timeout=1800))
    print(f"\n{args.model}, micro-batch {args.micro_batch} x {args.steps}, GRAPH_MODE; medians of {args.starts} "
          f"fresh processes (range)\n")
    print("| variant | first update (s) | next 3 windows (s) | steady (s per window) |")
    print("|---|---|---|---|")
    for variant in VARIANTS:
        cells = []
        for key in ("first_update_s", "next_3_s", "steady_s"):
            values = [result[key] for result in results[variant]]
            cells.append(f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})")
        print(f"| {variant} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
