"""Accumulation against plain training in one process, in alternating blocks: the ratio with less noise.

    .venv/bin/python benchmarks/paired.py                      # GRAPH_MODE, b = 32, N = 4, 20 block pairs
    .venv/bin/python benchmarks/paired.py --mode pynative

On a shared machine the speed of a process drifts by tens of percent over a minute, more than the few percent
that separate accumulation from plain training. Here both run in one process on the same batches: a block of
plain `TrainOneStepCell` updates (N steps of b each), then a block of three-cell updates (`TrainForwardBackward`
x N, `TrainOptim`, `TrainClear`), then a block of the N forward-backward micro-steps alone (the limit: what the
three cells would reach if the update and the clear cost nothing), and so on; each pair of neighbouring plain and
three-cell blocks gives one ratio, and the median ratio is printed with its spread and the median limit. Each
block reads the loss from the device once per update, as a training loop that reports it does.
"""
import argparse
import os
import statistics
import time

from lenet_cells import ROOT, accumulated_update, plain_and_three_cells, plain_updates, start_mindspore, window_of


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=20, help="block pairs (default: %(default)s)")
    parser.add_argument("--updates", type=int, default=15, help="updates per block (default: %(default)s)")
    args = parser.parse_args()
    if min(args.batch, args.steps, args.pairs, args.updates) < 1:
        parser.error("--batch, --steps, --pairs and --updates must be >= 1.")
    start_mindspore(args.mode)
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    from src.dataset import create_dataset  # pylint: disable=import-outside-toplevel
    data = create_dataset(os.path.join(ROOT, "model_zoo_lenet", "data", "fashion_mnist_sample"), args.batch,
                          "train", shuffle=False)
    batches = [tuple(Tensor(a) for a in pair) for pair in data.create_tuple_iterator(num_epochs=1,
                                                                                     output_numpy=True)]
    plain, *cells = plain_and_three_cells()
    n, done = args.steps, [0]  # done: updates so far, both kinds

    def plain_update():
        plain_updates(plain, window_of(batches, done[0], n))
        done[0] += 1

    def accumulated():
        accumulated_update(cells, window_of(batches, done[0], n))
        done[0] += 1

    def block(update):
        start = time.perf_counter()
        for _ in range(args.updates):
            update()
        return args.updates * n * args.batch / (time.perf_counter() - start)

    def micro_steps_only():
        """The limit: the window's N forward-backward micro-steps with no update and no clear (the buffers just
        keep growing), reading the loss back once, as the other blocks do."""
        forward_backward = cells[0]
        for batch in window_of(batches, done[0], n):
            out = forward_backward(*batch)
        out.asnumpy()
        done[0] += 1

    block(plain_update)  # warm-up: compilation
    block(accumulated)
    block(micro_steps_only)
    ratios, plain_speeds, accumulated_speeds, limits = [], [], [], []
    for _ in range(args.pairs):
        plain_speeds.append(block(plain_update))
        accumulated_speeds.append(block(accumulated))
        limits.append(block(micro_steps_only) / plain_speeds[-1])
        ratios.append(accumulated_speeds[-1] / plain_speeds[-1])
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(f"LeNet5, {args.mode.upper()}_MODE CPU, micro-batch {args.batch} x {args.steps}, {args.pairs} block pairs "
          f"of {args.updates} updates")
    print(f"plain TrainOneStepCell: median {statistics.median(plain_speeds):.0f} samples/s; three cells: median "
          f"{statistics.median(accumulated_speeds):.0f} samples/s")
    print(f"three cells / plain, per block pair: median {statistics.median(ratios):.3f}, quartiles "
          f"{quartiles[0]:.3f} to {quartiles[2]:.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
    print(f"limit, the N forward-backward micro-steps alone (no TrainOptim, no TrainClear) / plain: median "
          f"{statistics.median(limits):.3f}")


if __name__ == "__main__":
    main()
