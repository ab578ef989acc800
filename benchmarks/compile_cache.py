"""Start-up with MindSpore's compile cache: the three cells' first calls, without the cache, then a first and a
second run with it (MS_COMPILER_CACHE_ENABLE=1), each in a fresh process.

    .venv/bin/python benchmarks/compile_cache.py                        # MindCV EdgeNeXt xx_small, 64 x 64, b 8
    .venv/bin/python benchmarks/compile_cache.py --model resnet18

Each process builds the network, then times the first call of TrainForwardBackward (its graph holds the network),
TrainOptim and TrainClear (the window's end), GRAPH_MODE. Without the cache each process compiles all three; with
it the first run compiles and stores them, the second loads them.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from lenet_cells import start_mindspore  # noqa: E402  (no MindSpore import; puts the project on sys.path)


def child(args):
    """Time the three cells' first calls in this process; print one JSON line."""
    start_mindspore("graph")
    import numpy as np  # pylint: disable=import-outside-toplevel
    import mindcv  # pylint: disable=import-outside-toplevel
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    ms.set_seed(0)
    net = mindcv.create_model(args.model, num_classes=10)
    loss = mindcv.create_loss(name="CE", label_smoothing=0.1)
    optimizer = mindcv.create_optimizer(net.trainable_params(), opt="momentum", lr=0.01, momentum=0.9,
                                        weight_decay=1e-4)
    grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), optimizer, grad_sum)
    optim, clear = ms_accum.TrainOptim(optimizer, grad_sum), ms_accum.TrainClear(grad_sum)
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((args.micro_batch, 3, args.image_size, args.image_size), dtype=np.float32))
    y = Tensor(rng.integers(0, 10, args.micro_batch).astype(np.int32))
    times = {}
    for name, call in (("forward-backward", lambda: forward_backward(x, y)), ("optim", optim), ("clear", clear)):
        start = time.perf_counter()
        out = call()
        (out[0] if isinstance(out, tuple) else out).asnumpy()
        times[name] = time.perf_counter() - start
    print("RESULT " + json.dumps(times), flush=True)


def run(argv, env):
    proc = subprocess.run([sys.executable, __file__, *argv, "--child"], capture_output=True, text=True, env=env,
                          check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"compile_cache.py: a run exited {proc.returncode}:\n{proc.stdout[-2000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="edgenext_xx_small", help="a mindcv.create_model name")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    argv = ["--model", args.model, "--image_size", str(args.image_size), "--micro_batch", str(args.micro_batch)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MS_COMPILER_CACHE")}
    rows = {"no cache": run(argv, env)}
    with tempfile.TemporaryDirectory() as cache:
        cached = dict(env, MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=cache)
        rows["cache, first run"] = run(argv, cached)
        rows["cache, second run"] = run(argv, cached)
    print(f"\n{args.model}, {args.image_size}x{args.image_size}, micro-batch {args.micro_batch}, GRAPH_MODE: seconds "
          f"to each cell's first result, compilation included, a fresh process per row\n")
    print("| run | TrainForwardBackward | TrainOptim | TrainClear | all three |")
    print("|---|---|---|---|---|")
    for name, times in rows.items():
        cells = [times["forward-backward"], times["optim"], times["clear"]]
        print(f"| {name} | " + " | ".join(f"{t:.2f}" for t in cells) + f" | {sum(cells):.2f} |")


if __name__ == "__main__":
    main()
