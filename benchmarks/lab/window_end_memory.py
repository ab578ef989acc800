"""Where the engine's window end holds memory beyond the tutorial's: peak resident memory window by window.

    .venv/bin/python benchmarks/lab/window_end_memory.py                  # the text model, nn.Momentum, b 8, N 8
    .venv/bin/python benchmarks/lab/window_end_memory.py --model mlp --width 4096

A probe kept in the lab: its figures are in docs/performance.md ("Memory"), measured with the command above.

Each variant in a fresh process (``harness.measure_each``), GRAPH_MODE, over the same micro-batches as Tensors
(``harness.random_batches``, as benchmarks/memory.py's): the MindSpore tutorial's accumulator in a ``jit`` step, and
``TrainAccuStepsCell`` in its automatic mode with the window's end as by default (the buffers divided in place by the
window's items, ``nonfinite="skip"``) and without each part: ``average=False`` (``no-division``), ``nonfinite="apply"``
(``no-skip-branch``), both (``neither``). The peak (VmHWM) above the built network and data is printed after each
window's first and last micro-batch, in copies of the trainable parameters: what a window's end adds shows at its last
micro-batch.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

VARIANTS = {"tutorial": None, "engine": {}, "no-division": {"average": False},
            "no-skip-branch": {"nonfinite": "apply"}, "neither": {"average": False, "nonfinite": "apply"}}


def child(variant, args):
    """Train --windows windows of `variant` and report its peaks."""
    harness.start_mindspore("graph")
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = harness.build(args.model, args.classes, args.width, args.optimizer)
    batches = [(Tensor(x), Tensor(y)) for x, y in harness.random_batches(args, args.steps, seed=1)]
    copy, base = harness.copy_mib_of(net), harness.peak_mib()
    settings = VARIANTS[variant]
    if settings is None:
        step = harness.jit_step("tutorial", nn.WithLossCell(net, loss), optimizer, args.steps)
    else:
        step = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, accumulation_steps=args.steps,
                                           **settings)
        step.set_train()
    peaks = []
    for _ in range(args.windows):
        for index, (x, y) in enumerate(batches):
            step(x, y).asnumpy()
            if index in (0, args.steps - 1):
                peaks.append(round((harness.peak_mib() - base) / copy, 2))
    harness.report({"peaks": peaks, "copy_mib": round(copy, 1)})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_model_arguments(parser, VARIANTS, windows=3)
    parser.set_defaults(model="text", optimizer="momentum")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error(f"argument --steps: must be an int >= 2 (a window's first and last micro-batch), but got "
                     f"{args.steps}")
    results = harness.measure_each(__file__, args, child, strict=True)
    if results is None:
        return
    copy = next(iter(results.values()))["copy_mib"]
    print(f"{args.model}, b {args.micro_batch}, N {args.steps}, {args.optimizer}, GRAPH_MODE; peak above the built "
          f"network and data, in copies of the parameters ({copy} MiB), after each window's first and last "
          f"micro-batch:")
    header = [f"window {w}, {where}" for w in range(args.windows) for where in ("first", "last")]
    harness.print_table(["variant"] + header, [[variant] + [f"{peak:+.2f}" for peak in result["peaks"]]
                                               for variant, result in results.items()])


if __name__ == "__main__":
    main()
