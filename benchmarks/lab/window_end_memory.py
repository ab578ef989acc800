"""Where the engine's window end holds memory beyond the tutorial's: peak resident memory window by window.

    .venv/bin/python benchmarks/lab/window_end_memory.py                  # the text model, nn.Momentum, b 8, N 8
    .venv/bin/python benchmarks/lab/window_end_memory.py --model mlp --width 4096

A probe kept in the lab: its figures are in docs/performance.md ("Memory"), measured with the command above.

Each variant in a fresh process, GRAPH_MODE, over the same micro-batches as Tensors: the MindSpore tutorial's
accumulator in a ``jit`` step, and ``TrainAccuStepsCell`` in its automatic mode with the window's end as by default
(the buffers divided in place by the window's items, ``nonfinite="skip"``) and without each part: ``average=False``
(no division), ``nonfinite="apply"`` (no skip branch), both. The peak (VmHWM) above the built network and data is
printed after each window's first and last micro-batch, in copies of the trainable parameters: what a window's end
adds shows at its last micro-batch.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

VARIANTS = {"tutorial": None, "engine": {}, "no division": {"average": False},
            "no skip branch": {"nonfinite": "apply"}, "neither": {"average": False, "nonfinite": "apply"}}


def child(args):
    """Train --windows windows of the variant --child and report its peaks."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    harness.start_mindspore("graph")
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = harness.build(args.model, 10, width=args.width, optimizer="momentum")
    rng = np.random.default_rng(0)
    if args.model == "text":
        inputs = [rng.integers(0, harness.TEXT_VOCAB, (args.micro_batch, 32)).astype(np.int32)
                  for _ in range(args.steps)]
    else:
        inputs = [rng.standard_normal((args.micro_batch, 1024)).astype(np.float32) for _ in range(args.steps)]
    batches = [(Tensor(x), Tensor(rng.integers(0, 10, (args.micro_batch,)).astype(np.int32))) for x in inputs]
    copy, base = harness.copy_mib_of(net), harness.peak_mib()
    settings = VARIANTS[args.child]
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
    parser.add_argument("--model", choices=["text", "mlp"], default="text")
    parser.add_argument("--width", type=int, default=2048, help="the MLP's width (default: %(default)s)")
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8, help="N (default: %(default)s)")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.micro_batch, args.steps, args.windows) < 1 or args.steps < 2:
        parser.error("--micro_batch and --windows must be >= 1 and --steps >= 2.")
    if args.child:
        child(args)
        return
    argv = [f"--model={args.model}", f"--width={args.width}", f"--micro_batch={args.micro_batch}",
            f"--steps={args.steps}", f"--windows={args.windows}"]
    rows, copy = [], None
    for variant in VARIANTS:
        result = harness.run_child(__file__, argv + [f"--child={variant}"])
        copy = result["copy_mib"]
        rows.append([variant] + [f"{peak:+.2f}" for peak in result["peaks"]])
    print(f"{args.model}, b {args.micro_batch}, N {args.steps}, nn.Momentum, GRAPH_MODE; peak above the built network "
          f"and data, in copies of the parameters ({copy} MiB), after each window's first and last micro-batch:")
    header = [f"window {w}, {where}" for w in range(args.windows) for where in ("first", "last")]
    harness.print_table(["variant"] + header, rows)


if __name__ == "__main__":
    main()
