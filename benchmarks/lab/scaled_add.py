"""The in-place weighted add of Accumulator (ApplyMomentum with the buffer as its variable and its accumulation:
``ms_accum/core/grad_ops.py``) against a plain ``assign_add`` of the gradient and against ``assign_add`` of the
gradient times the weight (the product a temporary of the parameter's size), each alone in an ``ms.jit`` graph
over buffers and gradients of a model's parameter shapes, written with MindSpore alone.

    .venv/bin/python benchmarks/lab/scaled_add.py                       # block model's shapes, 6 rounds
    .venv/bin/python benchmarks/lab/scaled_add.py --model mlp --rounds 10

The three take turns, `--calls` calls a round each, every call waiting for its result; printed: each one's median
time per call over the rounds with its quartiles, and its ratio to the plain add in each round (median and
quartiles). A ratio above 1 is slower than the plain add.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)


def adders(buffers):
    """The three adds into `buffers` (a ParameterTuple), each a jit function of (grads, weight)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import ops  # pylint: disable=import-outside-toplevel
    hyper_map, fused = ops.HyperMap(), ops.ApplyMomentum()

    def in_place(weight, buffer, grad):
        return fused(buffer, buffer, 1.0 - weight, grad, 1.0 / weight)

    def plain(buffer, grad):
        return ops.assign_add(buffer, grad)

    def product(weight, buffer, grad):
        return ops.assign_add(buffer, grad * weight)

    def add_in_place(grads, weight):
        return hyper_map(ops.partial(in_place, weight), buffers, grads)

    def add_plain(grads, weight):  # pylint: disable=unused-argument
        return hyper_map(plain, buffers, grads)

    def add_product(grads, weight):
        return hyper_map(ops.partial(product, weight), buffers, grads)

    return {"apply-momentum": ms.jit(add_in_place), "assign-add": ms.jit(add_plain),
            "assign-add-product": ms.jit(add_product)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="block", choices=["block", "mlp", "text"])
    parser.add_argument("--mode", default="pynative", choices=["pynative", "graph"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    harness.start_mindspore(args.mode)
    from mindspore import Parameter, ParameterTuple, Tensor  # pylint: disable=import-outside-toplevel
    net = harness.build(args.model, 10, optimizer="momentum")[0]
    shapes = [p.shape for p in net.trainable_params()]
    elements = sum(int(np.prod(s)) for s in shapes)
    buffers = ParameterTuple(Parameter(Tensor(np.zeros(shape, np.float32)), name=f"buffer_{i}")
                             for i, shape in enumerate(shapes))
    rng = np.random.default_rng(0)
    grads = tuple(Tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes)
    weight = Tensor(np.float32(1.0))
    runs = adders(buffers)
    for run in runs.values():  # compile
        run(grads, weight)[0].asnumpy()
    times = {name: [] for name in runs}
    for round_ in range(args.rounds):
        order = list(runs)[round_ % 3:] + list(runs)[:round_ % 3]
        for name in order:
            start = time.perf_counter()
            for _ in range(args.calls):
                runs[name](grads, weight)[0].asnumpy()
            times[name].append((time.perf_counter() - start) / args.calls)
    print(f"{args.model} model's parameter shapes: {len(shapes)} tensors, {elements * 4 / 2 ** 20:.1f} MiB float32; "
          f"{args.mode}, {args.rounds} rounds of {args.calls} calls")
    rows = []
    for name, values in times.items():
        ratios = [v / p for v, p in zip(values, times["assign-add"])]
        rows.append([name, "%.2f ms (%.2f-%.2f)" % tuple(1e3 * v for v in harness.spread(values)),
                     "%.3f (%.3f-%.3f)" % harness.spread(ratios)])
    harness.print_table(["add", "time per call (quartiles)", "to assign-add (quartiles)"], rows)


if __name__ == "__main__":
    main()
