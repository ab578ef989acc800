"""What an error raised inside a compiled graph costs in MindSpore alone: wall and CPU seconds of the call that raises.

    .venv/bin/python benchmarks/lab/graph_error_wait.py                  # GRAPH_MODE and PYNATIVE_MODE (ms.jit)
    .venv/bin/python benchmarks/lab/graph_error_wait.py --modes graph

In each mode one small graph (a Cell whose ``construct`` raises ``ValueError`` when its input is positive, under
``ms.jit`` in PYNATIVE_MODE) is called once to compile, once to run (the time of a call that does not raise), then
once with a positive input, which raises. MindSpore's runtime then waits for its threads before it reports the
error (``GraphScheduler::Run``: a fixed wait, no setting changes it), so the raising call takes about 3 s of wall
time and almost no CPU. ms_accum raises in its graphs on purpose (a window with no items, ``nonfinite="raise"``, the
compile cache's ``Assert``): each such error costs that wait once, part of why the test suite keeps a worker more
than the machine's cores (docs/tests.md).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)


def timed(call, *args):
    """(wall seconds, CPU seconds of this process's threads, the exception's class name or None) of `call(*args)`."""
    wall, cpu, raised = time.perf_counter(), time.process_time(), None
    try:
        call(*args)
    except ValueError as error:
        raised = type(error).__name__
    return time.perf_counter() - wall, time.process_time() - cpu, raised


def measure(mode):
    """The rows of one mode: the call that runs and the call that raises."""
    harness.start_mindspore(mode)
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel

    class Refuses(nn.Cell):
        """Raises when its input is positive, else doubles it."""

        def construct(self, x):
            if x > 0:
                raise ValueError("refused")
            return x * 2

    cell = Refuses()
    call = cell if mode == "graph" else ms.jit(cell.construct)
    call(Tensor(-1.0))  # compiled
    runs = timed(lambda: call(Tensor(-2.0)).asnumpy())
    raises = timed(call, Tensor(1.0))
    if raises[2] is None:
        raise RuntimeError(f"{mode}: the graph did not raise")
    return [(mode, "runs", *runs[:2]), (mode, "raises", *raises[:2])]


def main():
    args, modes = harness.mode_arguments(__doc__, ("graph", "pynative"))
    if args.child:
        harness.report({"rows": measure(args.child)})
        return
    print("| mode | call | wall s | CPU s |\n|---|---|---|---|")
    for mode in modes:  # each mode in a fresh process: MindSpore's mode is set once per process here
        for row in harness.run_child(__file__, ["--child", mode])["rows"]:
            print(f"| {row[0]} | {row[1]} | {row[2]:.3f} | {row[3]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
