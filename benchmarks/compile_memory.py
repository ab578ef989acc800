"""What a jit step holds once compiled, and what training adds: the MindSpore 2.x tutorial's accumulator against
``ms_accum.Accumulator`` in the same step, compilation and training measured apart, each in a fresh process.

    .venv/bin/python benchmarks/compile_memory.py                       # MindCV ResNet18, 192 x 192, b 8, N 8
    .venv/bin/python benchmarks/compile_memory.py --model tiny          # an MLP 1024-16-10: 64 KiB of parameters
    .venv/bin/python benchmarks/compile_memory.py --model block         # 4 transformer encoder layers (d 256)

The step is value_and_grad and the accumulator, as in ``benchmarks/peers.py``'s jit step, written as a Cell so that
it can be compiled before it runs (``Cell.compile``; an ``ms.jit`` function compiles on its first call, the same
graph). Each process builds the network, its optimizer and the micro-batches, notes the resident memory, then
reports in MiB above it:

- built: the accumulator built (the tutorial's two clones are resident at once; ``Accumulator``'s buffers, made by
  ``initializer("zeros")``, when the graph first holds them);
- compiled: after ``compile``, before any step (the graph, its kernels and runtime structures, and buffers that
  become resident while it is compiled, as ``Accumulator``'s do);
- trained: after --windows windows (the resident memory the steps add, activations and buffers);
- peak: the process's peak resident memory (VmHWM) at the end.

``benchmarks/memory.py`` gives the whole-run figures of every path; this one says which part of a difference is
compilation. GRAPH_MODE only.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from lenet_cells import start_mindspore  # noqa: E402  (no MindSpore import; puts the project on sys.path)
import memory  # noqa: E402

CONFIGS = ("tutorial", "accumulator")


def step_cell(config, loss_net, optimizer, steps):
    """The jit step of `config` (``peers.step_parts``) as a Cell."""
    from mindspore import nn, ops  # pylint: disable=import-outside-toplevel
    from peers import step_parts  # pylint: disable=import-outside-toplevel

    class Step(nn.Cell):
        """value_and_grad and the accumulator in one graph."""

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.grad_fn, self.accumulator, self.weighted = step_parts(config, loss_net, optimizer, steps)

        def construct(self, x, y):
            loss_value, grads = self.grad_fn(x, y)
            if self.weighted:
                return ops.depend(loss_value, self.accumulator(grads, x.shape[0]))
            return ops.depend(loss_value, self.accumulator(grads))
    return Step()


def child(config, args):
    """Measure one configuration in this process; print one JSON line."""
    start_mindspore("graph")
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = memory.build(args)
    copy_mib = memory.copy_mib_of(net)
    tensors = [(Tensor(x), Tensor(y)) for x, y in memory.micro_batches(args, args.windows * args.steps)]
    loss_net = nn.WithLossCell(net, loss)
    before = [p.asnumpy().copy() for p in optimizer.parameters]
    base = memory.rss_mib()
    step = step_cell(config, loss_net, optimizer, args.steps)
    built = memory.rss_mib() - base
    step.compile(*tensors[0])
    compiled = memory.rss_mib() - base
    for x, y in tensors:
        step(x, y)
    moved = max(float(abs(p.asnumpy() - b).max()) for p, b in zip(optimizer.parameters, before))
    if not moved > 0.0:
        raise RuntimeError(f"compile_memory.py: {config} did not update the parameters")
    print(json.dumps({"config": config, "built": built, "compiled": compiled, "trained": memory.rss_mib() - base,
                      "peak": memory.peak_mib() - base, "copy": copy_mib}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    memory.add_model_arguments(parser, CONFIGS, windows=2)
    args = parser.parse_args()
    results = memory.measure_each(__file__, args, child, strict=True)
    if results is None:
        return
    copy = next(iter(results.values()))["copy"]
    print(f"\n{args.model}, micro-batch {args.micro_batch}, N = {args.steps}, GRAPH_MODE; one float32 copy of the "
          f"trainable parameters: {copy:.2f} MiB\n")
    print("| configuration | built | compiled | trained | peak |")
    print("|---|---|---|---|---|")
    for config, row in results.items():
        print(f"| {config} | {row['built']:.1f} | {row['compiled']:.1f} | {row['trained']:.1f} | {row['peak']:.1f} |")
    if "tutorial" in results and "accumulator" in results:
        first, second = results["tutorial"], results["accumulator"]
        training = (second['trained'] - second['compiled']) - (first['trained'] - first['compiled'])
        print(f"\naccumulator - tutorial: compiled {second['compiled'] - first['compiled']:+.1f} MiB, "
              f"training after it {training:+.1f} MiB, peak {second['peak'] - first['peak']:+.1f} MiB "
              f"({(second['peak'] - first['peak']) / copy:+.1f} copies)")


if __name__ == "__main__":
    main()
