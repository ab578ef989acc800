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
parameters, convolutions: much compute per parameter) and the wide MLP of benchmarks/data_parallel.py (1024 ->
2048 -> 2048 -> 10, 6.3 million parameters: the least compute per parameter, so the extra pass over the gradient
weighs most).
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


def block_runner(parts, trainer_kwargs, dataset, steps):
    """A function training one epoch of `dataset` (its time in seconds) with a fresh driver on fresh parts."""
    import ms_accum  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = parts()
    trainer = ms_accum.GradientAccumulation(net, loss, optimizer, **trainer_kwargs)

    def run():
        start, cpu = time.perf_counter(), time.process_time()
        losses = trainer.train_process(1, dataset, steps, ckpt_path=None, log_every=0)  # read: the device is done
        assert len(losses) == dataset.get_dataset_size() // steps
        return time.perf_counter() - start, time.process_time() - cpu
    return run


def compare_variants(name, args, variants, baseline):
    """Median ratios (each variant's time / the `baseline` variant's) and their quartiles over --pairs rounds of
    rotating blocks, one fresh driver per variant of `variants` ({label: GradientAccumulation keyword arguments}),
    each on its own dataset."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    images, labels = sample_arrays(args.windows * args.steps * args.batch)
    runners = {label: block_runner(MODELS[name], kwargs, ds.NumpySlicesDataset(
        {"x": images, "y": labels}, shuffle=False).batch(args.batch), args.steps) for label, kwargs in variants.items()}
    for run in runners.values():
        run()  # compile
    order = list(runners)
    ratios = {(label, clock): [] for label in order if label != baseline for clock in (0, 1)}
    seconds = []
    for round_index in range(args.pairs):
        shift = round_index % len(order)
        times = {label: runners[label]() for label in order[shift:] + order[:shift]}
        for (label, clock), values in ratios.items():
            values.append(times[label][clock] / times[baseline][clock])
        seconds.append(times[baseline][0] / args.windows)
    print(f"{name} ({args.pairs} rounds of {args.windows} windows of {args.steps} x {args.batch}; a window with "
          f"{baseline} takes {1000 * statistics.median(seconds):.1f} ms):", flush=True)
    for (label, clock), values in ratios.items():
        quartiles = statistics.quantiles(values, n=4)
        print(f"  {label} / {baseline}, {('wall', 'CPU')[clock]} time = {statistics.median(values):.3f} "
              f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f})", flush=True)


def measure_model(name, args):
    """The driver with noise_scale=True and "first" against without."""
    compare_variants(name, args, {"noise_scale=False": {}, "noise_scale=True": {"noise_scale": True},
                                  "noise_scale='first'": {"noise_scale": "first"}}, "noise_scale=False")


def cost_arguments(doc, min_steps, why_min_steps=""):
    """The cost benchmarks' command line: (arguments, model names), checked, MindSpore started in --mode."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="lenet,mlp", help="comma-separated: lenet, mlp (default: %(default)s)")
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=12, help="rounds of rotating blocks (default: %(default)s)")
    parser.add_argument("--windows", type=int, default=20, help="windows per block (default: %(default)s)")
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"--models must name models among {sorted(MODELS)}, but got {unknown}.")
    if min(args.batch, args.steps, args.pairs, args.windows) < 1 or args.steps < min_steps:
        parser.error(f"--batch, --pairs and --windows must be >= 1 and --steps >= {min_steps}{why_min_steps}.")
    start_mindspore(args.mode)
    return args, models


def main():
    args, models = cost_arguments(__doc__, 2, " (a window of one micro-batch has no estimate)")
    for name in models:
        measure_model(name, args)


if __name__ == "__main__":
    main()
