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
weighs most); with `--models resnet18`, MindCV's ResNet18 (11.2 million parameters under convolutions).

The floor, in the same rotation: the MindSpore tutorial's accumulator in an `ms.jit` step over the same
micro-batches (as Tensors), without and with the squared norm of every micro-batch's gradient added into a
Parameter in that step (the kernels ms_accum's measurement runs, `grad_ops.squared_sum` over each gradient and
one AddN, and nothing else). Its ratio is what the pass over the gradient costs by itself, in the user's own step.
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


def resnet18_parts():
    """A fresh (MindCV's ResNet18 on 1 x 32 x 32 images and 10 classes, loss, optimizer): 11.2 million parameters
    under convolutions, much compute per parameter, as in most image models."""
    import mindcv  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    net = mindcv.create_model("resnet18", num_classes=10, in_channels=1)
    return (net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            nn.Momentum(net.trainable_params(), 0.01, 0.9))


MODELS = {"lenet": lenet_parts, "mlp": wide_mlp_parts, "resnet18": resnet18_parts}
FLOOR_BASE = "jit step"  # the floor's labels: the tutorial's jit step, without and with the squared norms
FLOOR = "jit step + squared norms"


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


def jit_step_runner(parts, measure, images, labels, batch, steps):
    """A function training the `images` once (its time in seconds) with the MindSpore tutorial's accumulator in an
    ``ms.jit`` step on fresh `parts`, N = `steps` micro-batches of `batch`; with `measure` the step also adds each
    micro-batch's squared gradient norm into a Parameter, with the kernels ms_accum's measurement runs."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Parameter, Tensor, nn, ops  # pylint: disable=import-outside-toplevel
    from ms_accum.core import grad_ops  # pylint: disable=import-outside-toplevel
    from peers import step_parts  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = parts()
    grad_fn, accumulator, _ = step_parts("tutorial", nn.WithLossCell(net, loss), optimizer, steps)
    squares = Parameter(Tensor(0.0, ms.float32), name="floor_squares", requires_grad=False)
    hyper_map = ops.HyperMap()

    @ms.jit
    def train_step(x, y):
        loss_value, grads = grad_fn(x, y)
        if measure:  # a constant when compiled
            loss_value = ops.depend(loss_value, ops.assign_add(squares, grad_ops.sum_over(
                hyper_map, grad_ops.squared_sum, grads)))
        return ops.depend(loss_value, accumulator(grads))

    batches = [(Tensor(images[i:i + batch]), Tensor(labels[i:i + batch])) for i in range(0, len(images), batch)]

    def run():
        start, cpu = time.perf_counter(), time.process_time()
        for x, y in batches:
            loss_value = train_step(x, y)
        loss_value.asnumpy()  # wait for the device
        elapsed = time.perf_counter() - start, time.process_time() - cpu
        if measure and not float(squares.asnumpy()) > 0.0:
            raise RuntimeError(f"The floor's jit step summed no squared gradient norms (got {squares.asnumpy()}).")
        return elapsed
    return run


def driver_runners(name, args, variants, images, labels):
    """{label: a block_runner}, one fresh driver per variant of `variants` ({label: GradientAccumulation keyword
    arguments}), each on its own dataset of the micro-batches of `images` and `labels`."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    return {label: block_runner(MODELS[name], kwargs, ds.NumpySlicesDataset(
        {"x": images, "y": labels}, shuffle=False).batch(args.batch), args.steps) for label, kwargs in variants.items()}


def compare_variants(name, args, variants, baseline):
    """Median ratios (each variant's time / the `baseline` variant's) and their quartiles over --pairs rounds of
    rotating blocks, one fresh driver per variant of `variants` ({label: GradientAccumulation keyword
    arguments})."""
    arrays = sample_arrays(args.windows * args.steps * args.batch)
    compare_runners(name, args, driver_runners(name, args, variants, *arrays),
                    {label: baseline for label in variants if label != baseline})


def compare_runners(name, args, runners, baselines):
    """Median ratios and quartiles over --pairs rounds in which every runner of `runners` ({label: a function
    returning (wall, CPU) seconds of a block}) runs once, in rotating order: the time of each label of `baselines`
    ({label: its baseline's label}) over its baseline's in the same round. The first baseline's window time is
    printed."""
    for run in runners.values():
        run()  # compile
    order = list(runners)
    ratios = {(label, clock): [] for label in baselines for clock in (0, 1)}
    first = next(iter(baselines.values()))
    seconds = []
    for round_index in range(args.pairs):
        shift = round_index % len(order)
        times = {label: runners[label]() for label in order[shift:] + order[:shift]}
        for (label, clock), values in ratios.items():
            values.append(times[label][clock] / times[baselines[label]][clock])
        seconds.append(times[first][0] / args.windows)
    print(f"{name} ({args.pairs} rounds of {args.windows} windows of {args.steps} x {args.batch}; a window with "
          f"{first} takes {1000 * statistics.median(seconds):.1f} ms):", flush=True)
    for (label, clock), values in ratios.items():
        quartiles = statistics.quantiles(values, n=4)
        print(f"  {label} / {baselines[label]}, {('wall', 'CPU')[clock]} time = {statistics.median(values):.3f} "
              f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f})", flush=True)


def measure_model(name, args):
    """The driver with noise_scale=True and "first" against without, and the floor: the tutorial's jit step with
    the squared norms against without."""
    off, every, first = "noise_scale=False", "noise_scale=True", "noise_scale='first'"
    images, labels = sample_arrays(args.windows * args.steps * args.batch)
    runners = driver_runners(name, args, {off: {}, every: {"noise_scale": True}, first: {"noise_scale": "first"}},
                             images, labels)
    for label, measure in ((FLOOR_BASE, False), (FLOOR, True)):
        runners[label] = jit_step_runner(MODELS[name], measure, images, labels, args.batch, args.steps)
    compare_runners(name, args, runners, {every: off, first: off, FLOOR: FLOOR_BASE})


def cost_arguments(doc, min_steps, why_min_steps=""):
    """The cost benchmarks' command line: (arguments, model names), checked, MindSpore started in --mode."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="lenet,mlp",
                        help="comma-separated: lenet, mlp, resnet18 (default: %(default)s)")
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
