"""The cost of measuring the gradient noise scale: the driver with noise_scale=True against without, in one process.

    .venv/bin/python benchmarks/noise_cost.py                  # GRAPH_MODE, LeNet5 and the wide MLP, b = 32, N = 4
    .venv/bin/python benchmarks/noise_cost.py --models mlp --pairs 12 --windows 30

Three `GradientAccumulation` trainers on identical fresh networks: not measuring, `noise_scale=True` (one squared
norm of every micro-batch's gradient, a few scalars per window) and `noise_scale="first"` (the squared norm of
each window's first micro-batch only), run in rotating blocks of --windows windows of N micro-batches of b
samples from a dataset (Fashion-MNIST sample images), after a warm-up block each (the compilation); each round of
three neighbouring blocks gives one ratio per measuring trainer (measuring / not), and the median ratio is
printed with its quartiles, per model, for wall time and for the process's CPU time (all its threads: less
sensitive to other load on a shared machine, which steals wall time but not CPU time). The models: LeNet5 (61,706
parameters, convolutions: much compute per parameter) and the wide MLP of benchmarks/data_parallel.py (1024 -> 2048 -> 2048 -> 10, 6.3 million parameters: the least
compute per parameter, so the extra pass over the gradient weighs most).
"""
import argparse
import statistics
import time

from lenet_cells import lenet_parts, sample_arrays, start_mindspore


def wide_mlp_parts(hidden=2048):
    """A fresh (wide MLP, loss, optimizer) on flattened 32 x 32 images."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    net = nn.SequentialCell(nn.Flatten(), nn.Dense(1024, hidden), nn.ReLU(), nn.Dense(hidden, hidden), nn.ReLU(),
                            nn.Dense(hidden, 10))
    return (net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            nn.Momentum(net.trainable_params(), 0.01, 0.9))


MODELS = {"lenet": lenet_parts, "mlp": wide_mlp_parts}


def block_runner(parts, measure, dataset, steps):
    """A function training one epoch of `dataset` (its time in seconds) with a fresh driver on fresh parts."""
    import ms_accum  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = parts()
    trainer = ms_accum.GradientAccumulation(net, loss, optimizer, noise_scale=measure)

    def run():
        start, cpu = time.perf_counter(), time.process_time()
        losses = trainer.train_process(1, dataset, steps, ckpt_path=None, log_every=0)  # read: the device is done
        assert len(losses) == dataset.get_dataset_size() // steps
        return time.perf_counter() - start, time.process_time() - cpu
    return run


def measure_model(name, args):
    """Median ratios (each way of measuring / not measuring) and their quartiles over --pairs rounds."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    images, labels = sample_arrays(args.windows * args.steps * args.batch)
    datasets = [ds.NumpySlicesDataset({"x": images, "y": labels}, shuffle=False).batch(args.batch) for _ in range(2)]
    datasets.append(ds.NumpySlicesDataset({"x": images, "y": labels}, shuffle=False).batch(args.batch))
    runners = {measure: block_runner(MODELS[name], measure, dataset, args.steps)
               for measure, dataset in zip((False, True, "first"), datasets)}
    for run in runners.values():
        run()  # compile
    order = list(runners)
    ratios = {(measure, clock): [] for measure in (True, "first") for clock in (0, 1)}
    seconds = []
    for round_index in range(args.pairs):
        rotated = order[round_index % 3:] + order[:round_index % 3]
        times = {measure: runners[measure]() for measure in rotated}
        for (measure, clock), values in ratios.items():
            values.append(times[measure][clock] / times[False][clock])
        seconds.append(times[False][0] / args.windows)
    print(f"{name} ({args.pairs} rounds of {args.windows} windows of {args.steps} x {args.batch}; a window without "
          f"measuring takes {1000 * statistics.median(seconds):.1f} ms):", flush=True)
    for (measure, clock), values in ratios.items():
        quartiles = statistics.quantiles(values, n=4)
        print(f"  noise_scale={measure!r} / False, {('wall', 'CPU')[clock]} time = {statistics.median(values):.3f} "
              f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f})", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="lenet,mlp", help="comma-separated: lenet, mlp (default: %(default)s)")
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=12, help="rounds of three blocks (default: %(default)s)")
    parser.add_argument("--windows", type=int, default=20, help="windows per block (default: %(default)s)")
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"--models must name models among {sorted(MODELS)}, but got {unknown}.")
    if min(args.batch, args.steps, args.pairs, args.windows) < 1 or args.steps < 2:
        parser.error("--batch, --pairs and --windows must be >= 1 and --steps >= 2 (a window of one micro-batch "
                     "has no estimate).")
    start_mindspore(args.mode)
    for name in models:
        measure_model(name, args)


if __name__ == "__main__":
    main()
