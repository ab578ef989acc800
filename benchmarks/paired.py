"""Accumulation against plain training in one process, in alternating blocks: the ratio with less noise.

    .venv/bin/python benchmarks/paired.py                      # GRAPH_MODE, b = 32, N = 4, 20 block pairs
    .venv/bin/python benchmarks/paired.py --mode pynative
    .venv/bin/python benchmarks/paired.py --path model-accu --updates 30   # or --path driver: fed by a dataset

On a shared machine the speed of a process drifts by tens of percent over a minute, more than the few percent
that separate accumulation from plain training. Here both run in one process on the same batches: a block of
plain `TrainOneStepCell` updates (N steps of b each), then a block of three-cell updates (`TrainForwardBackward`
x N, `TrainOptim`, `TrainClear`), then a block of the N forward-backward micro-steps alone (the limit: what the
three cells would reach if the update and the clear cost nothing), and so on; each pair of neighbouring plain and
three-cell blocks gives one ratio, and the median ratio is printed with its spread and the median limit. A fourth
block, the floor, runs the same N micro-steps and then two calls of the smallest compiled graphs (a scalar added,
behind a runtime branch, as every ms_accum graph called from Python on CPU has, and called as ms_accum's cells
are), with no ms_accum in them: what MindSpore charges the three cells' shape for its two graph calls per window,
whatever they compute. Each
block reads the loss from the device once per update, as a training loop that reports it does. With `--path
driver` or `--path model-accu` a block is one epoch over a dataset of --updates windows, trained by `Model.train`
over `TrainOneStepCell` or by the driver or `Model_ACCU` (no limit block: the data feed is part of each step).
"""
import argparse
import statistics
import time

import harness


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--path", choices=["three-cells", "driver", "model-accu"], default="three-cells",
                        help="the ms_accum path against plain training fed the same way: three-cells against "
                             "TrainOneStepCell on batches in memory (default), driver or model-accu against "
                             "Model.train over the same dataset")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=20, help="block pairs (default: %(default)s)")
    parser.add_argument("--updates", type=int, default=15, help="updates per block (default: %(default)s)")
    args = parser.parse_args()
    if min(args.batch, args.steps, args.pairs, args.updates) < 1:
        parser.error("--batch, --steps, --pairs and --updates must be >= 1.")
    harness.start_mindspore(args.mode)
    blocks = in_memory_blocks(args) if args.path == "three-cells" else dataset_blocks(args)
    block_samples = args.updates * args.steps * args.batch

    def block(update):
        start = time.perf_counter()
        update()
        return block_samples / (time.perf_counter() - start)

    runners = {name: lambda update=update: block(update)
               for name, update in zip(("plain", "accumulated", "limit", "floor"), blocks) if update}
    for run in runners.values():  # warm-up: compilation
        run()
    speeds = harness.rotate(runners, args.pairs)
    plain_speeds, accumulated_speeds = speeds["plain"], speeds["accumulated"]
    ratios = [a / p for a, p in zip(accumulated_speeds, plain_speeds)]
    _, low, high = harness.spread(ratios)
    print(f"LeNet5, {args.mode.upper()}_MODE CPU, micro-batch {args.batch} x {args.steps}, {args.pairs} block pairs "
          f"of {args.updates} updates, path {args.path}")
    print(f"plain: median {statistics.median(plain_speeds):.0f} samples/s; {args.path}: median "
          f"{statistics.median(accumulated_speeds):.0f} samples/s")
    print(f"{args.path} / plain, per block pair: median {statistics.median(ratios):.3f}, quartiles "
          f"{low:.3f} to {high:.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
    if "limit" in speeds:
        limits = [m / p for m, p in zip(speeds["limit"], plain_speeds)]
        floors = [f / p for f, p in zip(speeds["floor"], plain_speeds)]
        print(f"limit, the N forward-backward micro-steps alone (no TrainOptim, no TrainClear) / plain: median "
              f"{statistics.median(limits):.3f}")
        print(f"floor, the N micro-steps and two of MindSpore's smallest graph calls / plain: median "
              f"{statistics.median(floors):.3f}")
        against = [r / m for r, m in zip(ratios, limits)]
        floor_against = [f / m for f, m in zip(floors, limits)]
        print(f"against the limit, per block: {args.path} {statistics.median(against):.3f}, floor "
              f"{statistics.median(floor_against):.3f}")


def smallest_graphs():
    """Two Cells, each adding 1 to a scalar Parameter behind a runtime branch: the least a compiled graph call can
    do, called as ms_accum's cells are (``core/compiled.py``): compiled by the Cell in GRAPH_MODE, through
    ``mindspore.jit`` in PYNATIVE_MODE."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Parameter, Tensor, nn, ops  # pylint: disable=import-outside-toplevel

    class Tick(nn.Cell):
        """count += 1, behind a branch taken at run time."""

        def __init__(self, name):
            super().__init__()
            self.count = Parameter(Tensor(0.0, ms.float32), name=name, requires_grad=False)

        def construct(self):
            out = self.count * 1.0
            if out >= 0.0:
                out = ops.depend(out, ops.assign_add(self.count, ops.ones_like(out)))
            return out

    ticks = Tick("floor_first"), Tick("floor_second")
    if ms.get_context("mode") == ms.PYNATIVE_MODE:
        return tuple(ms.jit(tick) for tick in ticks)
    return ticks


def in_memory_blocks(args):
    """(plain block, three-cell block, limit block, floor block) on the batches held as Tensors, each of --updates
    updates."""
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    images, labels = harness.sample_arrays()
    batches = [(Tensor(images[i:i + args.batch]), Tensor(labels[i:i + args.batch]))
               for i in range(0, len(images) - args.batch + 1, args.batch)]
    plain, *cells = harness.plain_and_three_cells()
    n, done = args.steps, [0]  # done: updates so far, all kinds

    def run(one_update):
        for _ in range(args.updates):
            one_update(harness.window_of(batches, done[0], n))
            done[0] += 1

    def micro_steps_only(window):
        """The limit: the window's N forward-backward micro-steps with no update and no clear (the buffers just
        keep growing), reading the loss back once, as the other blocks do."""
        for batch in window:
            out = cells[0](*batch)
        out.asnumpy()

    first, second = smallest_graphs()

    def micro_steps_and_two_graphs(window):
        """The floor: the micro-steps, then two of the smallest graph calls where TrainOptim (its result read
        back) and TrainClear run."""
        harness.accumulated_update((cells[0], first, second), window)

    return (lambda: run(lambda window: harness.plain_updates(plain, window)),
            lambda: run(lambda window: harness.accumulated_update(cells, window)),
            lambda: run(micro_steps_only),
            lambda: run(micro_steps_and_two_graphs))


def dataset_blocks(args):
    """(plain block, accumulation block, None, None): one epoch of a dataset of --updates windows per block, through
    Model.train over TrainOneStepCell and through the driver or Model_ACCU."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    images, labels = harness.sample_arrays(args.updates * args.steps * args.batch)
    datasets = [ds.NumpySlicesDataset({"x": images, "y": labels}, shuffle=False).batch(args.batch)
                for _ in range(2)]  # one each: Model.train refuses a dataset another Model trained on
    plain, accumulated = (harness.dataset_trainer("plain-b-data", args.steps),
                          harness.dataset_trainer(args.path, args.steps))
    return lambda: plain(datasets[0], 1), lambda: accumulated(datasets[1], 1), None, None


if __name__ == "__main__":
    main()
