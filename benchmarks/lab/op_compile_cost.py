"""What one use of a MindSpore function costs to compile, in MindSpore alone: a scalar Tensor made once against
the functions that make one in the graph.

    .venv/bin/python benchmarks/lab/op_compile_cost.py                  # 16 uses a graph, 3 rounds
    .venv/bin/python benchmarks/lab/op_compile_cost.py --uses 32 --rounds 5

A probe kept in the lab: its figures are in docs/performance.md ("Compiling ms_accum's graphs"). Each way is a Cell
whose construct adds the same scalar `--uses` times over, one after another (so that no use can be shared), written
into a file of its own and compiled in GRAPH_MODE at its first call; the ways take turns within each round, in one
process. Printed: each way's median first call and its cost per use, beyond the graph that only returns its input,
in wall time and in the process's CPU time (which other processes on the machine move less: the test reads it).
"""
import argparse
import gc
import importlib.util
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

# each way's statement, on the running value `v` (a float32 scalar); CONSTANT is a Tensor made once, at import
WAYS = {
    "nothing": "v = v",
    "a Tensor made once": "v = v + CONSTANT",
    "ops.fill": "v = v + ops.fill(mstype.float32, (), 1.0)",
    "ops.scalar_to_tensor": "v = v + ops.scalar_to_tensor(1.0, mstype.float32)",
    "ops.zeros": "v = v + ops.zeros((), mstype.float32)",
    "ops.zeros_like": "v = v + ops.zeros_like(v)",
    "ops.ones_like": "v = v * ops.ones_like(v)",
}
HEADER = """import math
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

CONSTANT = Tensor(1.0, mstype.float32)


class Net(nn.Cell):
    def construct(self, v):
"""


def way_class(index, statement, uses, folder):
    """The Cell class of one way: `statement` `uses` times in its construct, from a file of its own (MindSpore
    reads a construct's source)."""
    path = os.path.join(folder, f"op_compile_way_{index}.py")
    with open(path, "w", encoding="utf-8") as out:
        out.write(HEADER + "".join(f"        {statement}\n" for _ in range(uses)) + "        return v\n")
    name = os.path.splitext(os.path.basename(path))[0]  # MindSpore imports the construct's module by its name
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.Net


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uses", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if min(args.uses, args.rounds) < 1:
        parser.error(f"--uses and --rounds must be >= 1, but got --uses {args.uses} --rounds {args.rounds}.")
    harness.start_mindspore("graph")
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    from mindspore import dtype as mstype  # pylint: disable=import-outside-toplevel
    value = Tensor(0.5, mstype.float32)
    with tempfile.TemporaryDirectory() as folder:
        classes = {name: way_class(index, statement, args.uses, folder)
                   for index, (name, statement) in enumerate(WAYS.items())}
        seconds = {name: [] for name in WAYS}
        cpu = {name: [] for name in WAYS}
        for _ in range(args.rounds):
            for name, cls in classes.items():
                net = cls()
                gc.collect()
                start, start_cpu = time.perf_counter(), time.process_time()
                net(value).asnumpy()
                seconds[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    base, base_cpu = statistics.median(seconds["nothing"]), statistics.median(cpu["nothing"])
    print(f"GRAPH_MODE, {args.uses} uses a graph, medians of {args.rounds} rounds\n")
    print("| way | first call (s) | per use (ms) | per use, CPU (ms) |")
    print("|---|---|---|---|")
    for name, times in seconds.items():
        median, median_cpu = statistics.median(times), statistics.median(cpu[name])
        print(f"| {name} | {median:.3f} | {(median - base) / args.uses * 1000:.1f} | "
              f"{(median_cpu - base_cpu) / args.uses * 1000:.1f} |")


if __name__ == "__main__":
    main()
