"""The cost benchmarks (``noise_cost.py``, ``nonfinite_cost.py``, ``lab/squared_norm.py``): drivers that differ in one
setting, and the tutorial's jit step with and without a squared gradient norm, trained in rotating blocks in one
process, their time ratios printed as medians and quartiles."""
import argparse
import statistics

from .peers import step_parts
from .runner import rotate, start_mindspore
from .timing import spread, wall_and_cpu


def driver_runners(parts, variants, images, labels, batch, steps):
    """{label: run()}, one fresh ``GradientAccumulation`` on fresh ``parts()`` per variant of `variants` ({label:
    its keyword arguments}), each training one epoch of its own dataset of the micro-batches of `images` and
    `labels` per call and returning its (wall, CPU) seconds."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    runners = {}
    for label, kwargs in variants.items():
        trainer = ms_accum.GradientAccumulation(*parts(), **kwargs)
        dataset = ds.NumpySlicesDataset({"x": images, "y": labels}, shuffle=False).batch(batch)

        def run(trainer=trainer, dataset=dataset):
            losses = []

            def epoch():
                losses.extend(trainer.train_process(1, dataset, steps, ckpt_path=None, log_every=0))  # read: done
            elapsed = wall_and_cpu(epoch)
            assert len(losses) == dataset.get_dataset_size() // steps
            return elapsed
        runners[label] = run
    return runners


def tutorial_runner(parts, images, labels, batch, steps, measure=None, function=None):
    """(run(), the Parameter the squared norms are added into, gradients(): the first micro-batch's gradients as a
    mutable tuple of Tensors, computed when called): run() trains the micro-batches of `images` and `labels` once with
    the MindSpore tutorial's accumulator in an ``ms.jit`` step on fresh ``parts()``, N = `steps` micro-batches of
    `batch`, and returns its (wall, CPU) seconds. With `measure` ``"every"`` the step also adds each micro-batch's
    squared gradient norm into the Parameter (`function`, a MultitypeFuncGraph of one gradient: by default
    ``grad_ops.squared_sum``, the kernels ms_accum's measurement runs); with ``"first"`` a second jit step does so,
    which the host calls for each window's first micro-batch. Each step's result passes through a runtime branch, as
    ms_accum's micro-steps' do on CPU (``compiled.through_a_branch``: without one, MindSpore's CPU runs a jit graph
    several times slower)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Parameter, Tensor, nn, ops  # pylint: disable=import-outside-toplevel
    from ms_accum.core import grad_ops  # pylint: disable=import-outside-toplevel
    from ms_accum.core.compiled import through_a_branch  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = parts()
    grad_fn, accumulator, _ = step_parts("tutorial", nn.WithLossCell(net, loss), optimizer, steps)
    squares = Parameter(Tensor(0.0, ms.float32), name="floor_squares", requires_grad=False)
    hyper_map = ops.HyperMap()
    function = grad_ops.squared_sum if function is None else function

    def step(x, y, squared):
        loss_value, grads = grad_fn(x, y)
        if squared:  # a constant when compiled
            loss_value = ops.depend(loss_value, ops.assign_add(squares, grad_ops.sum_over(hyper_map, function,
                                                                                          grads)))
        return through_a_branch(ops.depend(loss_value, accumulator(grads)))

    @ms.jit
    def plain_step(x, y):
        return step(x, y, measure == "every")

    @ms.jit
    def measured_step(x, y):
        return step(x, y, True)

    batches = [(Tensor(images[i:i + batch]), Tensor(labels[i:i + batch])) for i in range(0, len(images), batch)]
    chosen = [measured_step if measure == "first" and index % steps == 0 else plain_step
              for index in range(len(batches))]

    def run():
        def epoch():
            for (x, y), train_step in zip(batches, chosen):
                loss_value = train_step(x, y)
            loss_value.asnumpy()  # wait for the device
        return wall_and_cpu(epoch)

    def gradients():
        _, grads = grad_fn(*batches[0])
        return ms.mutable(tuple(Tensor(g.asnumpy()) for g in grads))
    return run, squares, gradients


def compare_runners(name, args, runners, baselines):
    """Print the median ratios and quartiles over --pairs rounds in which every runner of `runners` ({label: a
    function returning (wall, CPU) seconds of a block of --windows windows}) runs once, in rotating order: the
    time of each label of `baselines` ({label: its baseline's label}) over its baseline's in the same round. The
    first baseline's window time is printed too."""
    for run in runners.values():
        run()  # compile
    times = rotate(runners, args.pairs, shift=True)
    first = next(iter(baselines.values()))
    window = statistics.median(wall for wall, _ in times[first]) / args.windows
    print(f"{name} ({args.pairs} rounds of {args.windows} windows of {args.steps} x {args.batch}; a window with "
          f"{first} takes {1000 * window:.1f} ms):", flush=True)
    for label, baseline in baselines.items():
        for clock in (0, 1):
            median, low, high = spread([t[clock] / b[clock] for t, b in zip(times[label], times[baseline])])
            print(f"  {label} / {baseline}, {('wall', 'CPU')[clock]} time = {median:.3f} "
                  f"(quartiles {low:.3f}-{high:.3f})", flush=True)


def cost_arguments(doc, models, min_steps, why_min_steps=""):
    """The cost benchmarks' command line: (arguments, the names of --models among `models`), checked, MindSpore
    started in --mode."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="lenet,mlp",
                        help=f"comma-separated: {', '.join(models)} (default: %(default)s)")
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=12, help="rounds of rotating blocks (default: %(default)s)")
    parser.add_argument("--windows", type=int, default=20, help="windows per block (default: %(default)s)")
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = [m for m in names if m not in models]
    if unknown:
        parser.error(f"--models must name models among {sorted(models)}, but got {unknown}.")
    if min(args.batch, args.steps, args.pairs, args.windows) < 1 or args.steps < min_steps:
        parser.error(f"--batch, --pairs and --windows must be >= 1 and --steps >= {min_steps}{why_min_steps}.")
    start_mindspore(args.mode)
    return args, names
