"""What a jit step holds once compiled, and what training adds: the MindSpore 2.x tutorial's accumulator against
``ms_accum.Accumulator`` in the same step, compilation and training measured apart, each in a fresh process.

    .venv/bin/python benchmarks/compile_memory.py                       # MindCV ResNet18, 192 x 192, b 8, N 8
    .venv/bin/python benchmarks/compile_memory.py --model tiny          # an MLP 1024-16-10: 64 KiB of parameters
    .venv/bin/python benchmarks/compile_memory.py --model block         # 4 transformer encoder layers (d 256)

The step is value_and_grad and the accumulator, as in ``benchmarks/peers.py``'s jit step, written as a Cell
(``harness.step_cell``) so that it can be compiled before it runs (``Cell.compile``; an ``ms.jit`` function
compiles on its first call, the same graph). Each process builds the network, its optimizer and the
micro-batches, notes the resident memory, then reports in MiB above it:

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

import harness

CONFIGS = ("tutorial", "accumulator")


def child(config, args):
    """Measure one configuration in this process; report its result."""
    harness.start_mindspore("graph")
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = harness.build(args.model, args.classes, args.width, args.optimizer)
    copy_mib = harness.copy_mib_of(net)
    tensors = [(Tensor(x), Tensor(y)) for x, y in harness.random_batches(args, args.windows * args.steps, seed=1)]
    loss_net = nn.WithLossCell(net, loss)
    before = [p.asnumpy().copy() for p in optimizer.parameters]
    base = harness.rss_mib()
    step = harness.step_cell(config, loss_net, optimizer, args.steps)
    built = harness.rss_mib() - base
    step.compile(*tensors[0])
    compiled = harness.rss_mib() - base
    for x, y in tensors:
        step(x, y)
    moved = max(float(abs(p.asnumpy() - b).max()) for p, b in zip(optimizer.parameters, before))
    if not moved > 0.0:
        raise RuntimeError(f"compile_memory.py: {config} did not update the parameters")
    harness.report({"config": config, "built": built, "compiled": compiled, "trained": harness.rss_mib() - base,
                    "peak": harness.peak_mib() - base, "copy": copy_mib})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_model_arguments(parser, CONFIGS, windows=2, known=harness.STEP_NAMES)
    args = parser.parse_args()
    results = harness.measure_each(__file__, args, child, strict=True)
    if results is None:
        return
    copy = next(iter(results.values()))["copy"]
    print(f"\n{args.model}, micro-batch {args.micro_batch}, N = {args.steps}, GRAPH_MODE; one float32 copy of the "
          f"trainable parameters: {copy:.2f} MiB\n")
    harness.print_table(("configuration", "built", "compiled", "trained", "peak"),
                        [(config, *(f"{row[k]:.1f}" for k in ("built", "compiled", "trained", "peak")))
                         for config, row in results.items()])
    if "tutorial" in results and "accumulator" in results:
        first, second = results["tutorial"], results["accumulator"]
        training = (second['trained'] - second['compiled']) - (first['trained'] - first['compiled'])
        print(f"\naccumulator - tutorial: compiled {second['compiled'] - first['compiled']:+.1f} MiB, "
              f"training after it {training:+.1f} MiB, peak {second['peak'] - first['peak']:+.1f} MiB "
              f"({(second['peak'] - first['peak']) / copy:+.1f} copies)")


if __name__ == "__main__":
    main()
