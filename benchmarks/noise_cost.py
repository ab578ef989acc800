"""The cost of measuring the gradient noise scale: the driver with noise_scale=True and "first" against without.

    .venv/bin/python benchmarks/noise_cost.py                  # GRAPH_MODE, LeNet5 and the wide MLP, b = 32, N = 4
    .venv/bin/python benchmarks/noise_cost.py --models mlp --pairs 12 --windows 30

Three `GradientAccumulation` trainers on identical fresh networks: not measuring, `noise_scale=True` (one squared
norm of every micro-batch's gradient, a few scalars per window) and `noise_scale="first"` (the squared norm of
each window's first micro-batch only), run in rotating blocks of --windows windows of N micro-batches of b
samples from a dataset (Fashion-MNIST sample images), in one process, after a warm-up block each (the
compilation); each round of neighbouring blocks gives one ratio per measuring trainer (measuring / not), and the
median ratio is printed with its quartiles, per model, for wall time and for the process's CPU time (all its
threads: less sensitive to other load on a shared machine, which steals wall time but not CPU time). The
models: LeNet5 (61,706 parameters, convolutions: much compute per parameter) and the wide MLP of
benchmarks/data_parallel.py (1024 -> 2048 -> 2048 -> 10, 6.3 million parameters: the least compute per
parameter, so the extra pass over the gradient weighs most); with `--models resnet18`, MindCV's ResNet18 (11.2
million parameters under convolutions).

The floors, in the same rotation: the MindSpore tutorial's accumulator in an `ms.jit` step over the same
micro-batches (as Tensors), without and with the squared norm of every micro-batch's gradient added into a
Parameter in that step (the kernels ms_accum's measurement runs, `grad_ops.squared_sum` over each gradient and
one AddN, and nothing else): what the pass over the gradient costs by itself, in the user's own step. And the
floor for `"first"`: the squared norm of each window's first micro-batch only, the best way MindSpore alone
allows, with no branch to choose it in the graph: two jit steps, with and without the squared norms, the host
calling the one that measures on a window's first micro-batch. Every floor step passes its loss through a runtime
branch that changes nothing (`compiled.through_a_branch`), as ms_accum's micro-steps do: on CPU MindSpore runs a
jit graph without control flow several times slower (benchmarks/jit_branch.py), and whether a step is in that slow
regime must not decide the ratio.
"""
import harness

FLOOR_BASE = "jit step"  # the floor's labels: the tutorial's jit step, without and with the squared norms
FLOOR = "jit step + squared norms"
FLOOR_FIRST = "jit step + first squared norm"


def floor_runner(parts, measure, images, labels, batch, steps):
    """A function training the `images` once (its wall and CPU seconds) with the tutorial's jit step,
    ``harness.tutorial_runner`` (`measure` None, ``"every"`` or ``"first"``), raising if a measuring step summed no
    squared norm."""
    run, squares, _ = harness.tutorial_runner(parts, images, labels, batch, steps, measure)

    def checked():
        elapsed = run()
        if measure and not float(squares.asnumpy()) > 0.0:
            raise RuntimeError(f"The floor's jit step summed no squared gradient norms (got {squares.asnumpy()}).")
        return elapsed
    return checked


def measure_model(name, args):
    """The driver with noise_scale=True and "first" against without, and the floor: the tutorial's jit step with
    the squared norms against without."""
    off, every, first = "noise_scale=False", "noise_scale=True", "noise_scale='first'"
    parts = harness.COST_MODELS[name]
    images, labels = harness.sample_arrays(args.windows * args.steps * args.batch)
    runners = harness.driver_runners(parts, {off: {}, every: {"noise_scale": True}, first: {"noise_scale": "first"}},
                                     images, labels, args.batch, args.steps)
    for label, measure in ((FLOOR_BASE, None), (FLOOR, "every"), (FLOOR_FIRST, "first")):
        runners[label] = floor_runner(parts, measure, images, labels, args.batch, args.steps)
    harness.compare_runners(name, args, runners, {every: off, first: off, FLOOR: FLOOR_BASE,
                                                   FLOOR_FIRST: FLOOR_BASE})


def main():
    args, models = harness.cost_arguments(__doc__, harness.COST_MODELS, 2,
                                          " (a window of one micro-batch has no estimate)")
    for name in models:
        measure_model(name, args)


if __name__ == "__main__":
    main()
