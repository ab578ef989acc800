"""MindSpore's own limit, shown without ms_accum: on CPU a jit graph without control flow runs slower per call than
the same graph with one runtime branch, in PYNATIVE_MODE and in GRAPH_MODE alike (LeNet5, 2026-11-25: 7.6 and 8.5
times the branched step's mean time per call).

    .venv/bin/python benchmarks/jit_branch.py                 # LeNet5, micro-batch 8, PYNATIVE_MODE, 8 rounds
    .venv/bin/python benchmarks/jit_branch.py --mode graph --rounds 30

Two `ms.jit` steps over the same LeNet5 and micro-batches, each `value_and_grad` of the loss and an `assign_add`
of the gradients into buffers (a micro-step of gradient accumulation): `straight` as written, `branched` with
`if loss == loss: loss = loss * 1` after it (a runtime branch that changes no value). They take turns on 16
micro-batches a round; each call waits for its loss. Printed: the median and mean time per call and the calls
over three times the median, for each, and the ratio of their means. ms_accum passes every micro-step it compiles
in PYNATIVE_MODE, and in GRAPH_MODE on CPU, through such a branch (`ms_accum/core/compiled.py`).
"""
import argparse
import statistics
import time

import numpy as np

import harness


def _step(grad_fn, buffers, branched):
    """One jitted micro-step: loss and gradients, the gradients added into `buffers`; `branched` adds the branch."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import ops  # pylint: disable=import-outside-toplevel
    add = ops.HyperMap()

    def straight(x, y):
        loss, grads = grad_fn(x, y)
        return ops.depend(loss, add(ops.partial(ops.assign_add), buffers, grads))

    def with_branch(x, y):
        loss, grads = grad_fn(x, y)
        loss = ops.depend(loss, add(ops.partial(ops.assign_add), buffers, grads))
        if loss == loss:  # pylint: disable=comparison-with-itself
            loss = loss * 1
        return loss
    return ms.jit(with_branch if branched else straight)


def steps():
    """{name: jitted step(x, y) -> loss} on two identical LeNet5s."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    from src.lenet import LeNet5  # pylint: disable=import-outside-toplevel
    made = {}
    for name in ("straight", "branched"):
        ms.set_seed(0)
        net = LeNet5()
        loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        loss_net.set_train(True)
        weights = net.trainable_params()
        buffers = ms.ParameterTuple(weights).clone(prefix=f"sum_{name}", init="zeros")
        made[name] = _step(ms.value_and_grad(loss_net, None, weights), buffers, name == "branched")
    return made


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--mode", choices=["pynative", "graph"], default="pynative")
    args = parser.parse_args()
    if args.micro_batch < 1 or args.rounds < 1:
        parser.error(f"--micro-batch and --rounds must be >= 1, but got {args.micro_batch} and {args.rounds}.")
    harness.start_mindspore(args.mode)
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    data = [(Tensor(rng.normal(size=(args.micro_batch, 1, 32, 32)).astype(np.float32)),
             Tensor(rng.integers(0, 10, size=args.micro_batch).astype(np.int32))) for _ in range(16)]
    made = steps()
    for step in made.values():  # compile
        for x, y in data[:2]:
            float(step(x, y).asnumpy())

    def ms_per_call(step):
        """The milliseconds of each call on the 16 micro-batches, each call waiting for its loss."""
        times = []
        for x, y in data:
            began = time.perf_counter()
            float(step(x, y).asnumpy())
            times.append((time.perf_counter() - began) * 1000)
        return times

    rounds = harness.rotate({name: lambda step=step: ms_per_call(step) for name, step in made.items()}, args.rounds)
    times = {name: [t for calls in values for t in calls] for name, values in rounds.items()}
    print(f"\nLeNet5, micro-batch {args.micro_batch}, {args.mode.upper()}_MODE, {args.rounds} rounds of 16 calls "
          f"each\n")
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        slow = sum(value > 3 * median for value in values)
        rows.append((name, f"{median:.1f}", f"{statistics.mean(values):.1f}", f"{slow}/{len(values)}"))
    harness.print_table(("jit step", "median ms per call", "mean ms", "calls over 3x the median"), rows)
    print(f"\nstraight / branched, mean time per call: "
          f"{statistics.mean(times['straight']) / statistics.mean(times['branched']):.2f}")


if __name__ == "__main__":
    main()
