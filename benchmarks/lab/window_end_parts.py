"""What each part of a window's end costs to compile, in MindSpore alone, on one model's parameters.

    .venv/bin/python benchmarks/lab/window_end_parts.py --starts 2       # EdgeNeXt xx_small, 2 fresh processes a part
    .venv/bin/python benchmarks/lab/window_end_parts.py --starts 1 --parts optimizer,all
    .venv/bin/python benchmarks/lab/window_end_parts.py --starts 3 --parts all,engine --passes   # MindSpore's phases

A probe kept in the lab: its figures are in docs/performance_history.md ("Start-up: where the time goes", the
window's end part by part), measured with the first command, and in docs/performance.md (start-up), measured with
``--starts 3 --parts optimizer,all,engine`` and ``--starts 3 --parts all,records,engine``.

Each part is one graph over the model's optimizer and a buffer per parameter, compiled and run once in a fresh
process (the parts take turns, so that a slow spell of the machine hits them all). ``optimizer`` is the tutorial's
window end: the optimizer on the buffers and their reset from a zeros copy through ``HyperMap``. Every other part
adds one of ms_accum's steps to it, written with ms_accum's own per-parameter helpers (``core/grad_ops.py``):
``norm`` the gradient's global norm (each buffer's squares through a row view, no temporary of its size);
``division`` the buffers divided in place through ``HyperMap``; ``branch`` the optimizer in a run-time branch that a
non-finite norm skips; ``clear`` the buffers zeroed one after another (``grad_ops.clear_in_turn``, one parameter's
zeros at a time) instead of from the zeros copy; ``all`` every one of them together, ms_accum's window end without
its records; ``records`` ``all`` with ten scalar Parameters written after the branch, as many as the engine's
window end writes besides its window count (the window's items, norm and clipping, three skip records, four
counters reset). ``engine`` is TrainAccuStepsCell's own window end (``end_window`` after one micro-batch, whose
compile is not counted). The figure is the first call's seconds (compile and one run); the second call's is beside it.
With ``--passes`` the first call runs with MindSpore's compile profile on, and a second table gives the seconds of
each of MindSpore's compile phases for the window end's graph (those of 0.05 s or more in some part).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

PARTS = ("optimizer", "norm", "division", "branch", "clear", "all", "records", "engine")
STEPS = {"norm": ("norm",), "division": ("division",), "branch": ("norm", "branch"), "clear": ("clear",),
         "all": ("norm", "division", "branch", "clear"), "optimizer": ()}
STEPS["records"] = STEPS["all"] + ("records",)
RECORDS = 10  # the scalars the engine's window end writes: 3 of the window, 3 skip records, 4 counters reset


def window_end(steps, optimizer):
    """A Cell whose call is the tutorial's window end with `steps` of ms_accum's added (see the module's text)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Parameter, ParameterTuple, Tensor, nn, ops  # pylint: disable=import-outside-toplevel
    from ms_accum.core import grad_ops  # pylint: disable=import-outside-toplevel

    class WindowEnd(nn.Cell):
        """The parts of a window's end named in `steps`."""

        def __init__(self):
            super().__init__()
            self.optimizer = optimizer
            self.buffers = optimizer.parameters.clone(prefix="buffer_", init="zeros")
            self.zeros = optimizer.parameters.clone(prefix="zeros_", init="zeros")
            self.items = Parameter(Tensor(4.0, ms.float32), "items")
            self.last_norm = Parameter(Tensor(0.0, ms.float32), "last_norm")
            self.map = ops.HyperMap()
            self.norm, self.division = "norm" in steps, "division" in steps
            self.branch, self.clear = "branch" in steps, "clear" in steps
            self.records = ParameterTuple([Parameter(Tensor(0.0, ms.float32), f"record_{index}")
                                           for index in range(RECORDS if "records" in steps else 0)])

        def construct(self):
            result = self.items * 1.0
            if self.norm:
                result = ops.depend(result, ops.assign(self.last_norm, grad_ops.global_norm(self.map, self.buffers)))
            if self.division:
                result = ops.depend(result, self.map(ops.partial(grad_ops.scale_in_place, 1.0 / result),
                                                     self.buffers))
            if self.branch:
                if ops.logical_not(ops.isfinite(self.last_norm)):
                    result = result + 1.0
                else:
                    result = ops.depend(result, self.optimizer(self.buffers))
            else:
                result = ops.depend(result, self.optimizer(self.buffers))
            for record in self.records:
                result = ops.depend(result, ops.assign_add(record, result))
            if self.clear:
                return ops.depend(result, grad_ops.clear_in_turn(self.buffers, result))
            return ops.depend(result, self.map(ops.partial(ops.assign), self.buffers, self.zeros))
    return WindowEnd()


def child(args):
    """One part in this process: its first call's seconds, its second call's, and with --passes the first call's
    compile phases."""
    harness.start_mindspore("graph")
    if args.passes:
        harness.profile_compiles()
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = harness.build(args.model, args.classes)
    if args.child == "engine":
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=2)
        cell.set_train(True)
        x, y = harness.random_batches(args, 1, seed=1)[0]
        cell.set_accumulation(True)
        cell(Tensor(x), Tensor(y))
        call = cell.end_window
    else:
        call = window_end(STEPS[args.child], optimizer)
    phases = {}

    def first_call():
        if args.passes:
            phases.update(harness.compile_phases(call)[1])
        else:
            call()
    first, _ = harness.wall_and_cpu(first_call)
    second, _ = harness.wall_and_cpu(call)
    harness.report({"first_s": first, "second_s": second, "parameters": len(optimizer.parameters),
                    "phases": phases})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", type=harness.model_name, default="edgenext_xx_small",
                        help="a MindCV model name, or a model the project builds ('lenet', 'block', ...)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--starts", type=int, default=3, help="fresh processes a part (default 3)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ", ".join(PARTS))
    parser.add_argument("--passes", action="store_true",
                        help="also time MindSpore's compile phases of each part's graph (its compile profile)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    parts = [part for part in args.parts.split(",") if part]
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    if args.starts < 1:
        parser.error(f"--starts must be >= 1, but got {args.starts}")
    argv = ["--model", args.model, "--classes", args.classes, "--image_size", args.image_size,
            "--micro_batch", args.micro_batch] + (["--passes"] if args.passes else [])
    started = time.perf_counter()
    results = harness.take_turns(parts, args.starts, lambda part: harness.run_child(__file__, [*argv, "--child", part],
                                                                                     timeout=1800))
    base = statistics.median(r["first_s"] for r in results[parts[0]])
    rows = []
    for part in parts:
        first = statistics.median(r["first_s"] for r in results[part])
        rows.append((part, f"{first:.2f}", f"{first - base:+.2f}",
                     f"{statistics.median(r['second_s'] for r in results[part]) * 1000:.0f}"))
    print(f"{args.model}, {results[parts[0]][0]['parameters']} parameters, medians of {args.starts} fresh processes "
          f"({time.perf_counter() - started:.0f} s)")
    harness.print_table(("part", "first call s", f"against {parts[0]}", "second call ms"), rows)
    if args.passes:
        print_phases(parts, results)


def print_phases(parts, results):
    """Each part's median seconds in each of MindSpore's compile phases of its window end's graph."""
    order = {}  # every phase, in MindSpore's order (each phase's passes after it)
    for part in parts:
        for r in results[part]:
            order.update(dict.fromkeys(r["phases"]))
    if not order:
        raise RuntimeError("--passes: MindSpore printed no compile profile (its COMPILE_PROFILE switch)")
    medians = {part: {name: statistics.median(r["phases"].get(name, 0.0) for r in results[part]) for name in order}
               for part in parts}
    names = [name for name in order if name == "total" or max(medians[part][name] for part in parts) >= 0.05]
    print("MindSpore's compile phases of the window end's graph, seconds (medians)")
    harness.print_table(("phase", *parts),
                        [(name, *(f"{medians[part][name]:.2f}" for part in parts)) for name in names])


if __name__ == "__main__":
    main()
