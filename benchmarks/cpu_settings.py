"""Measure LeNet training throughput on CPU under MindSpore's defaults and under train.py's CPU defaults.

    .venv/bin/python benchmarks/cpu_settings.py            # 3 processes per setting, prints a Markdown table

Each setting runs in fresh processes (oneDNN reads ONEDNN_MAX_CPU_ISA once, and MindSpore's thread count can be
set once per process), the settings taking turns so that a slow spell of a shared machine hits them all:
the three cells (TrainForwardBackward x 4, TrainOptim, TrainClear) at micro-batch 32 in GRAPH_MODE (or PYNATIVE)
on the bundled sample, the first 30 updates excluded as warm-up, then as many updates as fit in --seconds. The
figure is the median samples/s over the processes.
"""
import argparse
import os
import statistics

import harness

WARMUP_UPDATES = 30
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
# (label, environment, kernel threads, jit_level, mode: graph, pynative (synchronous launches) or pynative-async)
SETTINGS = [
    ("MindSpore defaults (oneDNN any ISA, default threads)", {"ONEDNN_MAX_CPU_ISA": "ALL"}, None, None, "graph"),
    ("train.py default: oneDNN capped at AVX2, default threads", AVX2, None, None, "graph"),
    ("oneDNN capped at AVX2, 1 thread", AVX2, 1, None, "graph"),
    ("oneDNN capped at AVX2, threads = cores available (2)", AVX2, "cores", None, "graph"),
    ("oneDNN capped at AVX2, jit_level O1 (graph kernel fusion)", AVX2, None, "O1", "graph"),
    ("PYNATIVE_MODE, oneDNN capped at AVX2, MindSpore's asynchronous launches", AVX2, None, None, "pynative-async"),
    ("PYNATIVE_MODE, train.py default: AVX2 and synchronous launches", AVX2, None, None, "pynative"),
]


def child(threads, jit_level, mode, seconds):
    """One measurement in this process; reports its samples/s."""
    # pylint: disable-next=import-outside-toplevel
    from src.cpu_speed import apply_env_defaults, available_cores, set_cpu_threads, set_mode  # noqa
    apply_env_defaults()
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from src.dataset import create_dataset  # pylint: disable=import-outside-toplevel

    ms.set_device("CPU")
    if mode == "pynative-async":
        ms.set_context(mode=ms.PYNATIVE_MODE)
    else:
        set_mode(mode)
    if jit_level is not None:
        ms.set_context(jit_config={"jit_level": jit_level})
    if threads is not None:
        set_cpu_threads(available_cores() if threads == "cores" else int(threads))
    data = create_dataset(harness.SAMPLE, 32, "train", shuffle=False)
    batches = list(data.create_tuple_iterator(num_epochs=1))
    cells = harness.three_cells(*harness.lenet_parts())

    def update(index):
        harness.accumulated_update(cells, harness.window_of(batches, index, 4))
        return 4 * 32

    harness.report({"samples_per_s": harness.timed(update, seconds, WARMUP_UPDATES)})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--jit_level", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="graph", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1 or not args.seconds > 0:  # not harness.argtypes: it would set the ISA these runs compare
        parser.error(f"--repeats must be >= 1 and --seconds > 0, but got {args.repeats} and {args.seconds}")
    if args.child:
        child(args.threads, args.jit_level, args.mode, args.seconds)
        return
    settings = {label: rest for label, *rest in SETTINGS}

    def measure(label):
        env, threads, jit_level, mode = settings[label]
        argv = ["--child", "--seconds", args.seconds, "--mode", mode]
        if threads is not None:
            argv += ["--threads", threads]
        if jit_level is not None:
            argv += ["--jit_level", jit_level]
        return harness.run_child(__file__, argv, dict(os.environ, **env))["samples_per_s"]

    runs = harness.take_turns(settings, args.repeats, measure)
    harness.print_table(("setting", f"samples/s (median of {args.repeats})", "runs, in order"),
                        [(label, f"{statistics.median(values):.0f}", ", ".join(f"{r:.0f}" for r in values))
                         for label, values in runs.items()])


if __name__ == "__main__":
    main()
