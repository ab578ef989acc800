"""Does train.py's data pipeline keep up with training? Dataset throughput against training throughput, on CPU.

    .venv/bin/python benchmarks/lab/data_pipeline.py                       # data/fashion-mnist, else the sample
    .venv/bin/python benchmarks/lab/data_pipeline.py --workers 1,2 --repeats 3

A probe kept in the lab: its figures are in docs/performance_history.md ("The data pipeline keeps up"), measured
with ``.venv/bin/python benchmarks/lab/data_pipeline.py --repeats 2 --seconds 8``.

For each map-worker count (create_dataset's num_parallel_workers; train.py keeps its default), in fresh
processes taking turns:

- pipeline alone: samples/s of iterating train.py's pipeline (MnistDataset, resize to 32x32, rescale, normalise,
  HWC2CHW, batch 32) without training;
- training: samples/s of train.py's configuration (GradientAccumulation, LeNet5, micro-batch 32 x 4, GRAPH_MODE,
  train.py's CPU defaults) fed by that pipeline.

and once, as the reference, training fed by the same images already decoded and normalised in memory (a
NumpySlicesDataset), which no pipeline setting can beat. Training at the in-memory reference means the pipeline
does not starve it; the pipeline alone should run well above training.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

BATCH, STEPS = 32, 4


def child(kind, workers, data_path, seconds):
    """One measurement in this process; reports its samples/s."""
    harness.start_mindspore("graph")
    import numpy as np  # pylint: disable=import-outside-toplevel
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    from src.dataset import create_dataset  # pylint: disable=import-outside-toplevel
    data = create_dataset(data_path, BATCH, "train", num_parallel_workers=workers, seed=1)
    samples = data.get_dataset_size() * BATCH
    if kind == "pipeline":
        iterator = data.repeat(-1).create_tuple_iterator(num_epochs=1)
        next(iterator)
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            next(iterator)
            count += BATCH
        harness.report({"samples_per_s": count / (time.perf_counter() - start)})
        return
    if kind == "in-memory":
        pairs = list(data.create_tuple_iterator(num_epochs=1, output_numpy=True))
        data = ds.NumpySlicesDataset({"image": np.concatenate([x for x, _ in pairs]),
                                      "label": np.concatenate([y for _, y in pairs])}, shuffle=False).batch(BATCH)
    trainer = ms_accum.GradientAccumulation(*harness.lenet_parts())

    def run(epochs):
        trainer.train_process(epochs, data, STEPS, ckpt_path=None, log_every=0)

    harness.report({"samples_per_s": harness.timed_epochs(run, seconds, samples)})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_data = os.path.join(harness.ROOT, "data", "fashion-mnist")
    if not os.path.isdir(default_data):
        default_data = harness.SAMPLE
    parser.add_argument("--data_path", default=default_data, help="default: %(default)s")
    cores = os.cpu_count() or 1
    parser.add_argument("--workers", default=",".join(str(w) for w in sorted({1, 2, cores}) if w <= cores),
                        help="map-worker counts to compare, each at most the CPU count (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="processes per measurement")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per process (roughly)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        counts = [int(w) for w in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers must be comma-separated ints, but got {args.workers!r}.")
    if any(not 1 <= w <= cores for w in counts) or args.repeats < 1:
        parser.error(f"--workers must each be in [1, {cores}] (MindSpore's bound: the CPU count) and --repeats "
                     f">= 1, but got --workers {args.workers} --repeats {args.repeats}.")
    if args.child:
        kind, workers = args.child.split(":")
        child(kind, int(workers), args.data_path, args.seconds)
        return
    jobs = [("in-memory", counts[0])] + [(kind, w) for w in counts for kind in ("pipeline", "training")]
    runs = harness.take_turns(jobs, args.repeats, lambda job: harness.run_child(__file__, [
        "--child", f"{job[0]}:{job[1]}", "--data_path", args.data_path, "--seconds", args.seconds])["samples_per_s"])
    median = {job: statistics.median(values) for job, values in runs.items()}
    reference = median[("in-memory", counts[0])]
    print(f"{args.data_path}/train, micro-batch {BATCH} x {STEPS}, GRAPH_MODE CPU, median of {args.repeats} processes")
    labels = {"in-memory": "training, images already in memory", "pipeline": "pipeline alone",
              "training": "training fed by the pipeline"}
    harness.print_table(("measurement", "map workers", "samples/s", "vs training from memory", "runs"),
                        [(labels[kind], "-" if kind == "in-memory" else workers, f"{median[(kind, workers)]:.0f}",
                          f"{median[(kind, workers)] / reference:.2f}", ", ".join(f"{v:.0f}" for v in values))
                         for (kind, workers), values in runs.items()])


if __name__ == "__main__":
    main()
