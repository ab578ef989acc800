"""Start-up with MindSpore's compile cache: the three cells' first calls, without the cache, then a first and a
second run with it (MS_COMPILER_CACHE_ENABLE=1), each in a fresh process.

    .venv/bin/python benchmarks/compile_cache.py                        # MindCV EdgeNeXt xx_small, 64 x 64, b 8
    .venv/bin/python benchmarks/compile_cache.py --model resnet18

Each process builds the network, then times the first call of TrainForwardBackward (its graph holds the network),
TrainOptim and TrainClear (the window's end), GRAPH_MODE. Without the cache each process compiles all three; with
it the first run compiles and stores them, the second loads them.
"""
import argparse
import os
import tempfile
import time

import harness


def child(args):
    """Time the three cells' first calls in this process; report the seconds of each."""
    harness.start_mindspore("graph")
    import numpy as np  # pylint: disable=import-outside-toplevel
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    forward_backward, optim, clear = harness.three_cells(*harness.build(args.model, 10))
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((args.micro_batch, 3, args.image_size, args.image_size), dtype=np.float32))
    y = Tensor(rng.integers(0, 10, args.micro_batch).astype(np.int32))
    times = {}
    for name, call in (("forward-backward", lambda: forward_backward(x, y)), ("optim", optim), ("clear", clear)):
        start = time.perf_counter()
        out = call()
        (out[0] if isinstance(out, tuple) else out).asnumpy()
        times[name] = time.perf_counter() - start
    harness.report(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=harness.model_name, default="edgenext_xx_small",
                        help="a mindcv.create_model name, or a model the project builds ('lenet', 'block', ...)")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    argv = ["--model", args.model, "--image_size", args.image_size, "--micro_batch", args.micro_batch, "--child"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MS_COMPILER_CACHE")}
    rows = {"no cache": harness.run_child(__file__, argv, env)}
    with tempfile.TemporaryDirectory() as cache:
        cached = dict(env, MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=cache)
        rows["cache, first run"] = harness.run_child(__file__, argv, cached)
        rows["cache, second run"] = harness.run_child(__file__, argv, cached)
    print(f"\n{args.model}, {args.image_size}x{args.image_size}, micro-batch {args.micro_batch}, GRAPH_MODE: seconds "
          f"to each cell's first result, compilation included, a fresh process per row\n")
    cells = {name: [times["forward-backward"], times["optim"], times["clear"]] for name, times in rows.items()}
    harness.print_table(("run", "TrainForwardBackward", "TrainOptim", "TrainClear", "all three"),
                        [(name, *(f"{t:.2f}" for t in values), f"{sum(values):.2f}") for name, values in cells.items()])


if __name__ == "__main__":
    main()
