"""Changing the batch during a run: samples and wall-clock seconds to a target test accuracy, configurations side by
side.

    .venv/bin/python benchmarks/batch_schedules.py --devices 2 --configs n1,n4,n16,goodput --repeats 2
    .venv/bin/python benchmarks/batch_schedules.py --devices 1 --model mlp --repeats 1     # every configuration

Fashion-MNIST (``--data``, train/ and test/ as model_zoo_lenet's create_dataset reads them), LeNet5
(model_zoo_lenet/src/lenet.py), an MLP (1024-256-10) or a wide MLP (``wide``: 1024-2048-2048-10, 6.3 million
parameters, a 24 MiB gradient to reduce every window: the case where a window's fixed cost is large), micro-batch b
per device, GRAPH_MODE, Momentum(0.9). The
configurations, each on a fresh network of the same initial weights, taking turns in every repeat:

- ``n1``, ``n4``, ``n16``: a fixed N;
- ``warmup-linear``, ``warmup-sqrt``, ``warmup-adascale``: a batch-size warm-up ``{0: 1, w: 4, w': 16}`` (N 1 for
  the first ``--warmup_samples`` samples, 4 for as many, then 16) under each learning-rate rule;
- ``adaptive``: ``AdaptiveAccumulation`` with a decision every 10 windows;
- ``goodput``: ``GoodputAccumulation`` with a decision every 10 windows, calibrating over 10 windows at each of two N.

A policy's smallest window is G0, as N = 1's, and its largest 16 G0, as N = 16's. On 2 workers the policies run
micro-batches of b, within N 1 to 16 (``min_steps=1``: a window of N = 1 holds a micro-batch a device, and so a
noise estimate), the goodput policy calibrating at N 1 and 8. On one device a window needs two micro-batches for an
estimate (``min_steps`` >= 2), so the policies run micro-batches of b / 2 (``--policy_micro_batch``), within N 2
to 32, the goodput policy calibrating at N 2 and 16.

All but the warm-ups use one rule, ``--rule`` (AdaScale by default), and all one schedule on progress (reference
steps of G0 = b x devices): a linear warm-up over the first 5 % of the budget, then a cosine to 0 at its end, so
that every configuration follows the same learning rate per sample seen at N = 1 and what differs is N.

One device trains through the driver (``GradientAccumulation.train_process``); ``--devices 2`` launches this script
on 2 msrun workers (DATA_PARALLEL, ``Model_ACCU`` over ``TrainAccuStepsCell``), each sharding the data. Every
``--eval_every`` samples the test accuracy is evaluated (on 2 workers each evaluates half the test set) with the
clock stopped: the seconds reported are training's wall clock alone, compilation included. A configuration stops at
the target unless ``--full``. Prints a table per repeat and the medians; writes a JSON of every run (``--out``) and
a PNG of G, the learning rate, the noise scale and the accuracy against samples (``--img_dir``).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import harness

CONFIGS = ("n1", "n4", "n16", "warmup-linear", "warmup-sqrt", "warmup-adascale", "adaptive", "goodput")
FIXED = ("n1", "n4", "n16")
TARGETS = {"lenet": 0.88, "mlp": 0.85, "wide": 0.85}


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--devices", type=int, choices=[1, 2], default=1)
    parser.add_argument("--model", choices=sorted(TARGETS), default="lenet")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    types = harness.argtypes()
    parser.add_argument("--repeats", type=types.positive_int, default=1)
    parser.add_argument("--epochs", type=types.positive_int, default=3,
                        help="the budget, in epochs of the training set")
    parser.add_argument("--micro_batch", type=int, default=32, help="b, per device")
    parser.add_argument("--policy_micro_batch", type=int, default=None,
                        help="the micro-batch of adaptive and goodput (default: b on 2 workers, b / 2 on one)")
    parser.add_argument("--lr", type=float, default=0.01, help="the peak rate at G0 = b x devices")
    parser.add_argument("--rule", choices=["linear", "sqrt", "adascale"], default="adascale")
    parser.add_argument("--warmup_samples", type=int, default=12000, help="each warm-up stage's samples")
    parser.add_argument("--eval_every", type=int, default=6000, help="samples between evaluations")
    parser.add_argument("--target", type=float, default=None,
                        help="test accuracy (default: 0.88 LeNet, 0.85 the MLPs)")
    parser.add_argument("--full", action="store_true", help="train the whole budget, past the target")
    parser.add_argument("--data", default=os.path.join(harness.ROOT, "data", "fashion-mnist"),
                        help="Fashion-MNIST's train/ and test/ (bash scripts/fashion_mnist.sh .venv/bin/python lays "
                             "them out here; model_zoo_lenet/data/fashion_mnist_sample for a quick run)")
    parser.add_argument("--train_samples", type=int, default=None, help="use only this many (a quick run)")
    parser.add_argument("--out", default=None, help="the runs' JSON (default: none kept)")
    parser.add_argument("--img_dir", default=os.path.join(harness.ROOT, "docs", "img"))
    parser.add_argument("--results_file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.target = args.target or TARGETS[args.model]
    args.policy_micro_batch = args.policy_micro_batch or (args.micro_batch if args.devices > 1
                                                          else max(1, args.micro_batch // 2))
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        parser.error(f"--configs takes {', '.join(CONFIGS)}, but got {', '.join(sorted(unknown))}")
    if not all(os.path.isdir(os.path.join(args.data, split)) for split in ("train", "test")):
        parser.error(f"--data must be a directory holding Fashion-MNIST's train/ and test/, but got {args.data!r}: "
                     f"lay them out there with 'bash scripts/fashion_mnist.sh .venv/bin/python', or pass --data "
                     f"model_zoo_lenet/data/fashion_mnist_sample for a quick run")
    return args


# ------------------------------------------------------------------------------------------------ a worker's runs
def load_split(args, split):
    """(images, labels) of `split` as create_dataset prepares them (train/ cut to --train_samples)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    from src.dataset import create_dataset  # pylint: disable=import-outside-toplevel
    count = args.train_samples if split == "train" else None
    data = create_dataset(args.data, 1000 if count is None else min(1000, count), split, shuffle=False,
                          drop_remainder=False, num_samples=count)
    pairs = list(data.create_tuple_iterator(num_epochs=1, output_numpy=True))
    return np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])


def network(model):
    """LeNet5, the MLP or the wide MLP, seeded: the same initial weights in every configuration."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    ms.set_seed(0)
    if model == "lenet":
        from src.lenet import LeNet5  # pylint: disable=import-outside-toplevel
        return LeNet5()
    if model == "wide":
        return nn.SequentialCell(nn.Flatten(), nn.Dense(1024, 2048), nn.ReLU(), nn.Dense(2048, 2048), nn.ReLU(),
                                 nn.Dense(2048, 10))
    return nn.SequentialCell(nn.Flatten(), nn.Dense(1024, 256), nn.ReLU(), nn.Dense(256, 10))


def micro_batch_of(config, args):
    """The micro-batch of `config`: b, or b / 2 for a policy (see the module's docstring)."""
    return args.policy_micro_batch if config in ("adaptive", "goodput") else args.micro_batch


def steps_of(config, args, world):
    """The N argument of `config`."""
    import ms_accum  # pylint: disable=import-outside-toplevel
    if config in FIXED:
        return int(config[1:])
    # the policies' N for windows of G0 to 16 G0 (see the module's docstring)
    low = max(1, round(args.micro_batch / args.policy_micro_batch))
    if config == "adaptive":
        return ms_accum.AdaptiveAccumulation(min_steps=low, max_steps=16 * low, interval=10)
    if config == "goodput":
        return ms_accum.GoodputAccumulation(min_steps=low, max_steps=16 * low, interval=10, calibration_windows=10,
                                            calibration_steps=(low, 8 * low))
    first = max(1, args.warmup_samples // (args.micro_batch * world))
    return {0: 1, first: 4, first + max(1, first // 4): 16}


def rates(args, world, samples):
    """One rate per reference step of the budget: a linear warm-up over 5 %, then a cosine to 0 at the end."""
    total = math.ceil(args.epochs * samples / (args.micro_batch * world)) + 2
    warm = max(1, total // 20)
    return [args.lr * min(1.0, (i + 1) / warm) * 0.5 * (1.0 + math.cos(math.pi * min(i, total) / total))
            for i in range(total)]


def accuracy(net, test, rank, world):
    """Test accuracy, each of `world` workers evaluating every world-th sample (counts gathered)."""
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    from ms_accum.trainers.state import gather_ints  # pylint: disable=import-outside-toplevel
    images, labels = test[0][rank::world], test[1][rank::world]
    correct = sum(int((net(Tensor(images[i:i + 1000])).asnumpy().argmax(1) == labels[i:i + 1000]).sum())
                  for i in range(0, len(labels), 1000))
    rows = gather_ints([correct, len(labels)], world)
    return sum(r[0] for r in rows) / sum(r[1] for r in rows)


def clock_callback(args, net, test, rank, world, micro_batch):
    """A callback that evaluates every --eval_every samples with the clock stopped, and stops at the target."""
    from mindspore.train import Callback  # pylint: disable=import-outside-toplevel

    class Clock(Callback):
        def __init__(self):
            super().__init__()
            self.evals, self.reached, self.seconds, self.started = [], None, 0.0, time.perf_counter()
            self.samples, self.next_eval = 0, args.eval_every

        def on_train_step_end(self, run_context):
            cb_params = run_context.original_args()
            self.samples = cb_params.micro_batches_done * micro_batch * world
            if self.samples >= self.next_eval:
                self.evaluate(cb_params.cur_step_num)
                self.next_eval += args.eval_every
                if self.reached and not args.full:
                    run_context.request_stop()

        def evaluate(self, updates):
            self.seconds += time.perf_counter() - self.started
            acc = accuracy(net, test, rank, world)
            self.evals.append([self.samples, self.seconds, acc, updates])
            if acc >= args.target and self.reached is None:
                self.reached = [self.samples, self.seconds, updates]
            self.started = time.perf_counter()

    return Clock()


def run_config(config, args, train, test, rank, world):
    """One configuration trained from the same initial weights; its figures and series."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    net = network(args.model)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=rates(args, world, len(train[1])), momentum=0.9)
    rule = config[len("warmup-"):] if config.startswith("warmup-") else args.rule
    ds.config.set_seed(1)
    shards = dict(num_shards=world, shard_id=rank) if world > 1 else {}
    data = ds.NumpySlicesDataset({"image": train[0], "label": train[1]}, shuffle=True, **shards)
    data = data.batch(micro_batch_of(config, args), drop_remainder=True)
    telemetry = ms_accum.WindowTelemetry()
    clock = clock_callback(args, net, test, rank, world, micro_batch_of(config, args))
    steps, reference = steps_of(config, args, world), args.micro_batch * world
    if world == 1:
        driver = ms_accum.GradientAccumulation(net, loss, optimizer, noise_scale=True, lr_scaling=rule,
                                               reference_batch=reference)
        clock.started = time.perf_counter()
        driver.train_process(args.epochs, data, steps, callbacks=[telemetry, clock], ckpt_path=None, log_every=0)
    else:
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=steps,
                                           noise_scale=True, lr_scaling=rule, reference_batch=reference)
        clock.started = time.perf_counter()
        ms_accum.Model_ACCU(cell).train(args.epochs, data, callbacks=[telemetry, clock], dataset_sink_mode=False)
    if not clock.evals or clock.evals[-1][0] != clock.samples:
        clock.evaluate(len(telemetry.records))
    records = telemetry.records
    return {"config": config, "evals": clock.evals, "reached": clock.reached, "updates": len(records),
            "samples": clock.samples, "seconds": clock.seconds, "final_accuracy": clock.evals[-1][2],
            "series": {"G": [r.items for r in records], "lr": [r.learning_rate for r in records],
                       "noise": [None if math.isnan(r.noise_scale) else r.noise_scale for r in records]},
            "constants": list(steps.device_constants) if config == "goodput" else None}


def worker(args):
    """Every repeat of every configuration, taking turns, on this process (one of --devices); rank 0 writes the
    runs to ``--results_file`` (a JSON path)."""
    harness.start_mindspore("graph")
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    rank, world = 0, 1
    if args.devices > 1:
        from mindspore.communication import get_group_size, get_rank, init  # pylint: disable=C0415
        init()
        rank, world = get_rank(), get_group_size()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                     device_num=world)
    train, test = load_split(args, "train"), load_split(args, "test")
    runs = []
    for repeat in range(args.repeats):
        for config in args.configs.split(","):
            run = run_config(config, args, train, test, rank, world)
            run["repeat"] = repeat
            runs.append(run)
            print(f"rank {rank}: repeat {repeat} {config}: {run['seconds']:.1f} s, reached {run['reached']}, "
                  f"accuracy {run['final_accuracy']:.4f}", flush=True)
    if rank == 0:
        with open(args.results_file, "w", encoding="utf-8") as file:
            json.dump(runs, file)


def launch(args, argv, path):
    """This script with `argv` on --devices msrun workers (127.0.0.1), which write the runs to `path`."""
    cmd = harness.msrun_command(args.devices, f"{path}.logs",
                                [os.path.abspath(__file__), *argv, f"--results_file={path}"])
    env = dict(os.environ, MS_RETRY_INTERVAL_LOWER="1", MS_RETRY_INTERVAL_UPPER="2")
    done = subprocess.run(cmd, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"msrun exited {done.returncode}; the workers' logs are in {path}.logs")


# ------------------------------------------------------------------------------------------------- the report
def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def print_tables(args, runs):
    """A table per repeat, then the medians, then the claim's ratios per repeat."""
    configs = args.configs.split(",")
    header = ["config", f"samples to {args.target}", "seconds to it", "updates to it", "updates", "samples",
              "seconds", "final accuracy"]
    for repeat in range(args.repeats):
        print(f"\nRepeat {repeat + 1} of {args.repeats} ({args.model}, {args.devices} device(s), b {args.micro_batch},"
              f" rule {args.rule}):\n")
        rows = []
        for run in (r for r in runs if r["repeat"] == repeat):
            reached = run["reached"] or [None, None, None]
            rows.append([run["config"], fmt(reached[0], "d"), fmt(reached[1], ".1f"), fmt(reached[2], "d"),
                         run["updates"], run["samples"], f"{run['seconds']:.1f}", f"{run['final_accuracy']:.4f}"])
        harness.print_table(header, rows)
    print(f"\nMedians over {args.repeats} repeat(s) (- : a repeat did not reach {args.target}):\n")
    rows = []
    for config in configs:
        mine = [r for r in runs if r["config"] == config]
        reached = [r["reached"] for r in mine]
        whole = all(reached)
        rows.append([config, fmt(statistics.median(r[0] for r in reached) if whole else None, ".0f"),
                     fmt(statistics.median(r[1] for r in reached) if whole else None, ".1f"),
                     f"{statistics.median(r['final_accuracy'] for r in mine):.4f}"])
    harness.print_table(["config", f"samples to {args.target}", "seconds to it", "final accuracy"], rows)
    if "goodput" in configs and all(c in configs for c in FIXED):
        print()
        for repeat in range(args.repeats):
            seconds = {r["config"]: r["reached"][1] if r["reached"] else math.inf for r in runs
                       if r["repeat"] == repeat}
            fixed, mine = sorted(seconds[c] for c in FIXED), seconds["goodput"]
            print(f"repeat {repeat + 1}: goodput {shown(mine)}; best fixed N {shown(fixed[0])} (goodput / best "
                  f"{ratio(mine, fixed[0])}); median fixed N {shown(fixed[1])} (median / goodput "
                  f"{ratio(fixed[1], mine)})")


def shown(seconds):
    return f"{seconds:.1f} s" if math.isfinite(seconds) else "not reached"


def ratio(top, bottom):
    return f"{top / bottom:.2f}" if math.isfinite(top) and math.isfinite(bottom) else "-"


def plot(args, runs):
    """G, the learning rate, the noise scale and the accuracy against samples, the first repeat's runs."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    figure, axes = plt.subplots(2, 2, figsize=(12, 8))
    for index, run in enumerate(r for r in runs if r["repeat"] == 0):
        style = dict(label=run["config"], color=f"C{index}")  # one colour a configuration in every panel
        seen, total = [], 0.0
        for items in run["series"]["G"]:
            total += items
            seen.append(total)
        axes[0][0].plot(seen, run["series"]["G"], **style)
        axes[0][1].plot(seen, run["series"]["lr"], **style)
        noise = [(s, b) for s, b in zip(seen, run["series"]["noise"]) if b is not None and b > 0]
        if noise:
            axes[1][0].plot(*zip(*noise), **style)
        axes[1][1].plot([e[0] for e in run["evals"]], [e[2] for e in run["evals"]], marker=".", **style)
    for axis, title, log in ((axes[0][0], "G, samples per update", True), (axes[0][1], "learning rate", False),
                             (axes[1][0], "noise scale B_simple (smoothed), samples", True),
                             (axes[1][1], "test accuracy", False)):
        axis.set_title(title)
        axis.set_xlabel("samples seen")
        if log:
            axis.set_yscale("log")
        axis.legend(fontsize=7)
    axes[1][1].axhline(args.target, color="grey", linestyle=":")
    figure.suptitle(f"{args.model}, {args.devices} device(s), b {args.micro_batch}, rule {args.rule} (repeat 1)")
    figure.tight_layout()
    os.makedirs(args.img_dir, exist_ok=True)
    path = os.path.join(args.img_dir, f"batch_schedules_{args.model}_{args.devices}dev.png")
    figure.savefig(path, dpi=90)
    print(f"plot: {path}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = parse(argv)
    if args.results_file:
        worker(args)
        return
    path = args.out or os.path.join("/tmp", f"batch_schedules_{os.getpid()}.json")
    if args.devices == 1:
        args.results_file = path
        worker(args)
    else:
        launch(args, argv, path)
    with open(path, encoding="utf-8") as file:
        runs = json.load(file)
    print_tables(args, runs)
    plot(args, runs)


if __name__ == "__main__":
    main()
