"""Throughput and peak memory of plain training and of every ms_accum path, LeNet5 on CPU, side by side.

    .venv/bin/python benchmarks/accumulation.py                          # micro-batch 32 x 4, 3 processes each
    .venv/bin/python benchmarks/accumulation.py --batch 256 --steps 16 --repeats 1 --seconds 20   # memory

Each configuration runs in fresh processes (GRAPH_MODE, train.py's CPU defaults), on Fashion-MNIST images from
the bundled sample (tiled when a batch needs more), warm-up (compilation and the first updates) excluded:

- plain-b:       nn.TrainOneStepCell on batches of b
- three-cells:   TrainForwardBackward x N, TrainOptim, TrainClear, called from a Python loop
- driver:        GradientAccumulation.train_process over a MindSpore dataset (data pipeline and callbacks on)
- model-accu:    TrainAccuStepsCell trained by Model_ACCU.train (no sink on CPU)
- plain-Nb:      nn.TrainOneStepCell on batches of N*b

It prints samples/s (median over processes), the ratio to plain-b and to plain-Nb, and each process's peak
resident memory (ru_maxrss, whole process) next to its resident memory before the first step.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(ROOT, "model_zoo_lenet")
CONFIGS = ("plain-b", "three-cells", "driver", "model-accu", "plain-Nb")


def rss_mib():
    """Current resident memory of this process, MiB."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def child(config, batch, steps, seconds):
    """One measurement in this process; prints a JSON line."""
    sys.path.insert(0, ZOO)
    from src.cpu_speed import apply_env_defaults  # pylint: disable=import-outside-toplevel
    apply_env_defaults()
    import numpy as np  # pylint: disable=import-outside-toplevel
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    from src.dataset import create_dataset  # pylint: disable=import-outside-toplevel
    from src.lenet import LeNet5  # pylint: disable=import-outside-toplevel

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    sample = create_dataset(os.path.join(ZOO, "data", "fashion_mnist_sample"), 1000, "train", shuffle=False)
    images = np.concatenate([x.asnumpy() for x, _ in sample.create_tuple_iterator(num_epochs=1)])
    labels = np.concatenate([y.asnumpy() for _, y in sample.create_tuple_iterator(num_epochs=1)])
    big = batch * steps
    reps = -(-8 * big // len(images))
    images, labels = np.tile(images, (reps, 1, 1, 1))[:8 * big], np.tile(labels, reps)[:8 * big]
    net = LeNet5()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    before = rss_mib()

    if config in ("plain-b", "plain-Nb", "three-cells"):
        size = big if config == "plain-Nb" else batch
        xs = [Tensor(images[i:i + size]) for i in range(0, len(images), size)]
        ys = [Tensor(labels[i:i + size]) for i in range(0, len(labels), size)]
        if config == "three-cells":
            grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
            fb = ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), opt, grad_sum)
            optim, clear = ms_accum.TrainOptim(opt, grad_sum), ms_accum.TrainClear(grad_sum)

            def update(k):
                for s in range(steps):
                    fb(xs[(k * steps + s) % len(xs)], ys[(k * steps + s) % len(ys)])
                optim().asnumpy()
                clear()
        else:
            step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
            per = 1 if config == "plain-Nb" else steps

            def update(k):
                for s in range(per):
                    out = step(xs[(k * per + s) % len(xs)], ys[(k * per + s) % len(ys)])
                out.asnumpy()
        for k in range(5):
            update(k)
        updates, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            update(5 + updates)
            updates += 1
        elapsed = time.perf_counter() - start
    else:
        data = ds.NumpySlicesDataset({"x": images, "y": labels}, shuffle=False).batch(batch)
        warm = ds.NumpySlicesDataset({"x": images[:2 * big], "y": labels[:2 * big]}, shuffle=False).batch(batch)
        epoch_updates = len(images) // big
        if config == "driver":
            trainer = ms_accum.GradientAccumulation(net, loss, opt)

            def run(dataset, epochs):
                trainer.train_process(epochs, dataset, steps, ckpt_path=None, log_every=0,
                                      callbacks=[ms.train.TimeMonitor()])
        else:
            model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt,
                                                                    accumulation_steps=steps))

            def run(dataset, epochs):
                model.train(epochs, dataset, callbacks=[ms.train.TimeMonitor()], dataset_sink_mode=False)
        run(warm, 1)
        start = time.perf_counter()
        run(data, 1)  # also sizes the measured run
        epochs = max(1, round(seconds / (time.perf_counter() - start)))
        start = time.perf_counter()
        run(data, epochs)
        elapsed = time.perf_counter() - start
        updates = epochs * epoch_updates
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"samples_per_s": updates * big / elapsed, "peak_mib": peak, "before_mib": before}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size b")
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update N")
    parser.add_argument("--repeats", type=int, default=3, help="processes per configuration")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured time per process (roughly)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ",".join(CONFIGS))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batch, args.steps, args.seconds)
        return
    configs = args.configs.split(",")
    results = {c: [] for c in configs}
    for _ in range(args.repeats):  # configurations interleaved against slow spells of a shared machine
        for config in configs:
            out = subprocess.run([sys.executable, __file__, "--child", config, "--batch", str(args.batch),
                                  "--steps", str(args.steps), "--seconds", str(args.seconds)],
                                 capture_output=True, text=True, check=True)
            results[config].append(json.loads(out.stdout.strip().splitlines()[-1]))
    median = {c: statistics.median(r["samples_per_s"] for r in runs) for c, runs in results.items()}
    b, n = args.batch, args.steps
    print(f"LeNet5, micro-batch b={b}, N={n} (effective batch {b * n}), GRAPH_MODE CPU, median of {args.repeats}")
    print("| configuration | samples/s | vs plain-b | vs plain-Nb | peak RSS MiB (before training) |")
    print("|---|---|---|---|---|")
    for config, runs in results.items():
        vs_b = f"{median[config] / median['plain-b']:.2f}" if "plain-b" in median else "-"
        vs_nb = f"{median[config] / median['plain-Nb']:.2f}" if "plain-Nb" in median else "-"
        peak = statistics.median(r["peak_mib"] for r in runs)
        before = statistics.median(r["before_mib"] for r in runs)
        print(f"| {config} | {median[config]:.0f} | {vs_b} | {vs_nb} | {peak:.0f} ({before:.0f}) |")


if __name__ == "__main__":
    main()
