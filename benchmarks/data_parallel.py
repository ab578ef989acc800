"""Data parallel on 2 msrun CPU workers: one gradient reduction per window against one per micro-batch.

    .venv/bin/python benchmarks/data_parallel.py                         # N = 1, 2, 4, 8, 16; about 10 minutes
    .venv/bin/python benchmarks/data_parallel.py --steps 1,4 --micro_batches 64 --hidden 1024
    .venv/bin/python benchmarks/data_parallel.py --frameworks torch     # the peer: PyTorch DDP on gloo

A wide MLP (1024 -> H -> H -> 10, H = 2048 by default: 6.3 million parameters, 25 MB of float32 gradient) on the
bundled Fashion-MNIST sample, micro-batch b, GRAPH_MODE, fed by a MindSpore dataset through `Model.train`:

- plain: `nn.TrainOneStepCell` under DATA_PARALLEL (its gradient reducer: one AllReduce per micro-batch, an update
  per micro-batch), through `mindspore.train.Model`;
- accu N: `ms_accum.TrainAccuStepsCell` through `ms_accum.Model_ACCU` (one AllReduce and one update per window
  of N micro-batches).

Each configuration runs on 2 workers started by msrun on 127.0.0.1, each worker pinned to its own core, and on
one worker alone (pinned to one core, no communication: the bound). Scaling efficiency is the 2-worker
throughput over twice the 1-worker throughput. Each worker also times the AllReduce of a gradient-sized tuple by
itself (the same `DistributedGradReducer` the cells use), which gives the time per window spent in
communication: one reduction per window for accu N, N for plain.

With `pip install -e ".[torch]"`, `--frameworks torch` (or `mindspore,torch`) measures PyTorch's
DistributedDataParallel on gloo with `no_sync()` for the first N - 1 micro-batches of each window (the peer's
way), the same MLP, batch and pinning, its AllReduce timed the same way.

Each measurement is one process (or one pair of processes); the machine's speed drifts by tens of percent over
minutes, so compare ratios within a row (2 workers against 1, measured back to back) more than across rows.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import harness


def updates_to_time(args, steps):
    """Updates timed after two warm-up updates: --micro_batches worth, at least 3 (every rank runs as many)."""
    return max(3, args.micro_batches // max(steps, 1))


def pin_to_one_core(rank):
    """Run this process (and the threads it starts later) on one core of those available, chosen by rank."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


def flat_sample():
    """The bundled sample's training images as train.py prepares them, flattened to float32 (count, 1024), and
    their int32 labels."""
    images, labels = harness.sample_arrays()
    return images.reshape(len(images), -1), labels


# ----------------------------------------------------------------------------------------------------- MindSpore
def mindspore_worker(args):
    """One worker (or the lone bound): time --micro_batches after two warm-up updates, write the result (rank 0)
    as JSON."""
    distributed = "MS_ROLE" in os.environ
    rank = int(os.environ.get("RANK_ID", "0"))
    pin_to_one_core(rank)
    from src.cpu_speed import apply_env_defaults  # pylint: disable=import-outside-toplevel
    apply_env_defaults()
    import numpy as np  # pylint: disable=import-outside-toplevel
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    from mindspore.train import Callback, Model  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    world = 1
    if distributed:
        from mindspore.communication import get_group_size, get_rank, init  # pylint: disable=import-outside-toplevel
        init()
        rank, world = get_rank(), get_group_size()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                     device_num=world)
    ms.set_seed(0)
    images, labels = flat_sample()
    net, loss, optimizer = harness.plain_parts(harness.wide_mlp(args.hidden, inputs=images.shape[1]))
    dataset = ds.NumpySlicesDataset({"x": images, "y": labels}, shuffle=False, num_shards=world,
                                    shard_id=rank).batch(args.batch, drop_remainder=True)
    steps = args.config_steps
    if steps == 0:
        model, micro_per_call = Model(nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)), 1
    else:
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, accumulation_steps=steps)
        model, micro_per_call = ms_accum.Model_ACCU(cell), steps

    class Clock(Callback):
        """Time of every update's end (one per micro-batch for plain, per window for Model_ACCU)."""

        def __init__(self):
            super().__init__()
            self.ends = []

        def on_train_step_end(self, run_context):
            self.ends.append(time.perf_counter())
            if len(self.ends) == 2 + updates_to_time(args, steps):  # the same count on every rank
                run_context.request_stop()

    clock = Clock()
    model.train(10 ** 6, dataset, callbacks=[clock], dataset_sink_mode=False)
    timed = len(clock.ends) - 2  # from the end of the second update (compiled, warm) to the last
    samples_per_s = timed * micro_per_call * args.batch * world / (clock.ends[-1] - clock.ends[1])
    result = {"samples_per_s": samples_per_s, "updates_timed": timed, "world": world,
              "parameters": int(sum(p.size for p in net.trainable_params()))}
    if distributed:
        result["allreduce_ms"] = allreduce_ms(ms, nn, np, net)  # every rank takes part
    if rank == 0:
        with open(args.result, "w", encoding="utf-8") as f:
            json.dump(result, f)


def allreduce_ms(ms, nn, np, net, calls=10):
    """Median milliseconds of one averaging AllReduce of a gradient-sized tuple (the cells' reducer)."""
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    params = net.trainable_params()
    reducer = nn.DistributedGradReducer(params, mean=True)

    class Reduce(nn.Cell):
        def __init__(self):
            super().__init__()
            self.reducer = reducer

        def construct(self, grads):
            return self.reducer(grads)

    step = Reduce()
    grads = tuple(Tensor(np.ones(p.shape, np.float32)) for p in params)
    times = []
    for _ in range(calls + 2):
        start = time.perf_counter()
        out = step(grads)
        out[0].asnumpy()
        times.append((time.perf_counter() - start) * 1000)
    times = sorted(times[2:])
    return times[len(times) // 2]


# ----------------------------------------------------------------------------------------------------- PyTorch
def torch_worker(rank, world, port, args, steps, result_path):
    """DDP on gloo (world > 1) or one process; no_sync for the first N - 1 micro-batches of a window."""
    pin_to_one_core(rank)
    import numpy as np  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    from contextlib import nullcontext  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(1)
    torch.manual_seed(0)
    images, labels = flat_sample()
    images, labels = images[rank::world], labels[rank::world].astype(np.int64)
    model = torch.nn.Sequential(torch.nn.Linear(images.shape[1], args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 10))
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = max(steps, 1)
    batches = [(torch.from_numpy(images[i:i + args.batch]), torch.from_numpy(labels[i:i + args.batch]))
               for i in range(0, len(images) - args.batch + 1, args.batch)]
    ends, k = [], 0
    while len(ends) < 2 + updates_to_time(args, steps):  # the same count on every rank
        for s in range(n):
            x, y = batches[k % len(batches)]
            k += 1
            sync = world == 1 or s == n - 1
            with (nullcontext() if sync else model.no_sync()):
                (loss_fn(model(x), y) / n).backward()
        optimizer.step()
        optimizer.zero_grad()
        ends.append(time.perf_counter())
    timed = len(ends) - 2
    result = {"samples_per_s": timed * n * args.batch * world / (ends[-1] - ends[1]), "updates_timed": timed,
              "world": world, "parameters": int(sum(p.numel() for p in model.parameters()))}
    if world > 1:
        tensors = [torch.ones_like(p) for p in model.parameters()]
        times = []
        for _ in range(12):  # what DDP's buckets carry per reduction, timed alone: one all_reduce per tensor
            start = time.perf_counter()
            for tensor in tensors:
                dist.all_reduce(tensor)
            times.append((time.perf_counter() - start) * 1000)
        result["allreduce_ms"] = sorted(times[2:])[len(times[2:]) // 2]
        dist.destroy_process_group()
    if rank == 0:
        with open(result_path, "w", encoding="utf-8") as f:
            json.dump(result, f)


def run_torch(args, steps, world, result_path):
    import torch.multiprocessing as tmp  # pylint: disable=import-outside-toplevel
    port = harness.free_port()
    if os.path.exists(result_path):
        os.remove(result_path)  # an earlier run's figures must not stand in for this one's
    tmp.spawn(torch_worker, args=(world, port, args, steps, result_path), nprocs=world, join=True)
    with open(result_path, encoding="utf-8") as f:
        return json.load(f)


# ----------------------------------------------------------------------------------------------------- launcher
def run_mindspore(args, steps, world, out_dir):
    """One configuration on `world` workers (msrun when 2); rank 0's result."""
    tag = f"{'plain' if steps == 0 else f'accu{steps}'}_w{world}"
    result = os.path.join(out_dir, f"{tag}.json")
    worker = [__file__, "--run_worker", "--config_steps", str(steps), "--result", result, "--batch", str(args.batch),
              "--hidden", str(args.hidden), "--micro_batches", str(args.micro_batches)]
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    if world == 1:
        cmd = [sys.executable, *worker]
    else:
        cmd = harness.msrun_command(world, os.path.join(out_dir, tag + "_logs"), worker)
    if os.path.exists(result):
        os.remove(result)  # an earlier run's figures must not stand in for this one's
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 or not os.path.exists(result):
        raise RuntimeError(f"{tag} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    with open(result, encoding="utf-8") as f:
        return json.load(f)


def parse_steps(text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be comma-separated ints >= 1, such as 1,4,16, but got {text!r}")
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size per worker (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=2048, help="MLP width H (default: %(default)s)")
    parser.add_argument("--steps", type=parse_steps, default=[1, 2, 4, 8, 16],
                        help="accumulation steps N to measure (default: 1,2,4,8,16)")
    parser.add_argument("--micro_batches", type=int, default=256,
                        help="micro-batches timed per worker and run, after 2 warm-up updates (default: %(default)s)")
    parser.add_argument("--frameworks", default="mindspore", choices=["mindspore", "torch", "mindspore,torch"],
                        help="mindspore (default), torch (PyTorch DDP with no_sync; needs torch) or both")
    parser.add_argument("--out", default=os.path.join(harness.ROOT, "runs", "data_parallel_bench"),
                        help="results and msrun logs (default: runs/data_parallel_bench)")
    parser.add_argument("--run_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config_steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_worker:
        mindspore_worker(args)
        return
    if min(args.batch, args.hidden, args.micro_batches) < 1:
        parser.error(f"--batch, --hidden and --micro_batches must be >= 1, but got {args.batch}, {args.hidden}, "
                     f"{args.micro_batches}.")
    if len(os.sched_getaffinity(0)) < 2:
        parser.error("2 workers pinned to their own cores need at least 2 CPU cores available.")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for steps in ([0] + args.steps) if "mindspore" in args.frameworks else []:
        name = "plain `TrainOneStepCell`" if steps == 0 else f"ms_accum N = {steps}"
        alone = run_mindspore(args, steps, 1, args.out)
        pair = run_mindspore(args, steps, 2, args.out)
        rows.append((name, steps, alone, pair))
        print(f"{name}: 1 worker {alone['samples_per_s']:.0f}/s, 2 workers {pair['samples_per_s']:.0f}/s, "
              f"efficiency {pair['samples_per_s'] / (2 * alone['samples_per_s']):.3f}, "
              f"AllReduce {pair['allreduce_ms']:.1f} ms", flush=True)
    if "torch" in args.frameworks:
        for steps in args.steps:
            alone = run_torch(args, steps, 1, os.path.join(args.out, f"torch_{steps}_w1.json"))
            pair = run_torch(args, steps, 2, os.path.join(args.out, f"torch_{steps}_w2.json"))
            rows.append((f"PyTorch DDP, no_sync, N = {steps}", steps, alone, pair))
            print(f"torch N = {steps}: efficiency {pair['samples_per_s'] / (2 * alone['samples_per_s']):.3f}",
                  flush=True)
    table(args, rows)


def table(args, rows):
    """Markdown: throughput alone and in pairs, efficiency, and the communication per window (per micro-batch for
    plain training, which reduces every micro-batch) against the window's time on 2 workers."""
    params = rows[0][3]["parameters"]
    print(f"\nwide MLP 1024-{args.hidden}-{args.hidden}-10 ({params / 1e6:.1f} M parameters, "
          f"{params * 4 / 2 ** 20:.0f} MiB of float32 gradient), micro-batch {args.batch} per worker "
          f"(MindSpore in GRAPH_MODE)\n")
    cells = []
    for name, steps, alone, pair in rows:
        efficiency = pair["samples_per_s"] / (2 * alone["samples_per_s"])
        comm = "-"
        if "allreduce_ms" in pair:
            window_ms = max(steps, 1) * args.batch * 2 / pair["samples_per_s"] * 1000
            comm = f"{pair['allreduce_ms']:.1f} of {window_ms:.1f} ({pair['allreduce_ms'] / window_ms:.0%})"
        cells.append((name, f"{alone['samples_per_s']:.0f}", f"{pair['samples_per_s']:.0f}", f"{efficiency:.3f}", comm))
    harness.print_table(("configuration", "1 worker samples/s", "2 workers samples/s", "scaling efficiency",
                         "communication per window: ms of ms (share)"), cells)

if __name__ == "__main__":
    main()
