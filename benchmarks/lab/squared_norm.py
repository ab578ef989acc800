"""What one squared-norm pass over a model's gradients costs, each way MindSpore offers, against a window of the
tutorial's accumulation: the floor under noise_scale="first", which makes that pass once a window.

    .venv/bin/python benchmarks/lab/squared_norm.py                  # the wide MLP and LeNet5, b = 32, N = 4
    .venv/bin/python benchmarks/lab/squared_norm.py --models mlp --pairs 24

A probe kept in the lab: its figures are in docs/noise_scale.md ("Cost"), measured with the command above.

In one process, GRAPH_MODE, in rotating blocks of --windows: the MindSpore tutorial's accumulator in an ``ms.jit``
step over N micro-batches of b samples a window (the window), and a jit function per way of computing
sum(|g|^2) over one micro-batch's gradients (Tensors computed once), called once a window:

- ``rows``: ms_accum's ``grad_ops.squared_sum``, each gradient viewed as rows dotted with themselves (BatchMatMul);
- ``squares``: the square of each gradient, then summed (a temporary of its size);
- ``l2loss``: twice MindSpore's ``L2Loss`` of each gradient;
- ``flat-matmul``: each gradient flattened, one MatMul with itself;
- ``norm``: ``ops.norm`` of each gradient, squared;

and ``empty``: a jit function of the same input returning a constant, what calling a graph costs by itself. Every
function passes its result through a runtime branch that changes nothing (``compiled.through_a_branch``), as
ms_accum's steps do: on CPU MindSpore runs a jit graph without control flow several times slower
(benchmarks/jit_branch.py). The gradients are the same Tensors at every call, so they may sit in the CPU's caches
more than a fresh gradient does: the figures are a lower bound of what the pass costs inside a step.

Printed per model: each way's pass (its call's time less ``empty``'s in the same round) as a share of a window,
median and quartiles over --pairs rounds, wall and CPU time, and its relative error against float64 numpy.
"""
import math
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

WAYS = ("rows", "squares", "l2loss", "flat-matmul", "norm")
COLD_MIB = 256  # the gradients' copies a cold pass goes through in turn: several times any CPU cache


def way_functions():
    """{way: a MultitypeFuncGraph of one gradient Tensor giving sum(g ** 2) as a float32 scalar Tensor}."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import ops  # pylint: disable=import-outside-toplevel
    from ms_accum.core import grad_ops  # pylint: disable=import-outside-toplevel
    l2_loss = ops.L2Loss()

    def rows(grad):
        return grad_ops.squared_sum(grad)

    def squares(grad):
        return grad_ops.element_sum(grad * grad)

    def l2loss(grad):
        return 2 * l2_loss(grad)

    def flat_matmul(grad):
        flat = grad.reshape(1, -1)
        return ops.matmul(flat, flat.T).reshape(())

    def norm(grad):
        return ops.square(ops.norm(grad.reshape(-1)))

    def empty(grad):
        return ops.zeros((), ms.float32)
    functions = {}
    for way, function in (("rows", rows), ("squares", squares), ("l2loss", l2loss),
                          ("flat-matmul", flat_matmul), ("norm", norm), ("empty", empty)):
        functions[way] = ops.MultitypeFuncGraph(way)
        functions[way].register("Tensor")(function)
    return functions


def pass_runner(function, copies, windows):
    """(run(), the value): run() calls a jit function summing `function` over a tuple of gradients `windows` times,
    taking the tuples of `copies` in turn, and returns its (wall, CPU) seconds."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import ops  # pylint: disable=import-outside-toplevel
    from ms_accum.core import grad_ops  # pylint: disable=import-outside-toplevel
    from ms_accum.core.compiled import through_a_branch  # pylint: disable=import-outside-toplevel
    hyper_map = ops.HyperMap()

    @ms.jit
    def total(grads):
        return through_a_branch(grad_ops.sum_over(hyper_map, function, grads))
    turn = [0]

    def run():
        def block():
            for _ in range(windows):
                value = total(copies[turn[0] % len(copies)])
                turn[0] += 1
            value.asnumpy()  # wait for the device
        return harness.wall_and_cpu(block)
    return run, float(total(copies[0]).asnumpy())


def cold_copies(grads):
    """Copies of `grads` (Tensors) that together exceed :data:`COLD_MIB`, at most 64: a pass over each in turn
    reads its gradients from memory, not from the CPU's caches, as a pass over a fresh gradient mostly does."""
    from mindspore import Tensor, mutable  # pylint: disable=import-outside-toplevel
    size_mib = sum(g.size * 4 for g in grads) / 2 ** 20
    count = min(64, max(2, math.ceil(COLD_MIB / size_mib)))
    return [mutable(tuple(Tensor(g.asnumpy().copy()) for g in grads)) for _ in range(count)]


def shares(times, label, base, windows, steps=1):
    """Table cells of `label`'s time less `base`'s in each round, over a window's time (over `steps` passes):
    wall and CPU, median (quartiles)."""
    cells = []
    for clock in (0, 1):
        median, low, high = harness.spread([(t[clock] - b[clock]) / w[clock] / steps for t, b, w in zip(
            times[label], times[base], times["window"])])
        cells.append(f"{100 * median:.1f}% ({100 * low:.1f}-{100 * high:.1f})")
    passed = 1000 * statistics.median(t[0] - b[0] for t, b in zip(times[label], times[base])) / windows / steps
    return cells + [f"{passed:.2f}"]


def measure_model(name, args):
    """Print each way's pass as a share of the window, called alone and inside the step, and its relative error."""
    images, labels = harness.sample_arrays(args.windows * args.steps * args.batch)
    parts = harness.COST_MODELS[name]
    window, _, gradients = harness.tutorial_runner(parts, images, labels, args.batch, args.steps)
    grads = gradients()
    truth = sum(float(np.sum(np.square(g.asnumpy().astype(np.float64)))) for g in grads)
    runners, errors, cold = {"window": window}, {}, cold_copies(grads)
    functions = way_functions()
    for way, function in functions.items():
        runners[way], value = pass_runner(function, [grads], args.windows)
        runners[f"cold {way}"], _ = pass_runner(function, cold, args.windows)
        errors[way] = abs(value - truth) / truth
        if way != "empty":
            runners[f"step+{way}"], _, _ = harness.tutorial_runner(parts, images, labels, args.batch, args.steps,
                                                                   "every", function)
    for label, function in (("two graphs", functions["empty"]), ("two graphs + rows", functions["rows"])):
        runners[label], _, _ = harness.tutorial_runner(parts, images, labels, args.batch, args.steps, "first",
                                                       function)
    for run in runners.values():
        run()  # compile
    times = harness.rotate(runners, args.pairs, shift=True)
    window_ms = 1000 * statistics.median(wall for wall, _ in times["window"]) / args.windows
    empty_ms = 1000 * statistics.median(wall for wall, _ in times["empty"]) / args.windows
    print(f"{name} ({sum(g.size for g in grads):,} gradient elements; {args.pairs} rounds of {args.windows} windows "
          f"of {args.steps} x {args.batch}; a window takes {window_ms:.1f} ms, calling an empty graph "
          f"{empty_ms:.2f} ms). One pass as a share of a window, median (quartiles), and its milliseconds: called "
          f"alone over the same gradients (warm: from the caches) and over {len(cold)} copies in turn (cold: from "
          f"memory), less the empty graph's call; and inside the step, on every micro-batch (its extra time over "
          f"N):", flush=True)
    print("| way | alone, warm: wall | alone, cold: wall | in the step: wall | in the step: CPU | relative error |")
    print("|---|---|---|---|---|---|")
    for way in WAYS:
        warm = shares(times, way, "empty", args.windows)
        cold_pass = shares(times, f"cold {way}", "cold empty", args.windows)
        inside = shares(times, f"step+{way}", "window", args.windows, args.steps)
        print(f"| {way} | {warm[0]}, {warm[2]} ms | {cold_pass[0]}, {cold_pass[2]} ms | {inside[0]}, {inside[2]} ms "
              f"| {inside[1]} | {errors[way]:.1e} |", flush=True)
    print("What noise_scale='first' does, in MindSpore alone: two jit steps, the host calling the second for each "
          "window's first micro-batch; its extra time over the one step's, a share of a window:")
    for label, second in (("two graphs", "the second adds 0.0 to a Parameter"),
                          ("two graphs + rows", "the second also takes the squared norm, rows")):
        wall, cpu, passed = shares(times, label, "window", args.windows)
        print(f"  {label} ({second}): wall {wall}, CPU {cpu}, {passed} ms a window", flush=True)


def main():
    args, models = harness.cost_arguments(__doc__, harness.COST_MODELS, 1)
    for name in models:
        measure_model(name, args)


if __name__ == "__main__":
    main()
