"""What a policy that chooses N costs a window on the host, at the same N: ``TrainAccuStepsCell`` under
``Model_ACCU`` (no sink, GRAPH_MODE, the noise scale measured, AdaScale's rule, ``WindowTelemetry`` recording
every window, as benchmarks/batch_schedules.py runs it) with N = 4 fixed, with ``AdaptiveAccumulation`` held to N =
4, and with ``GoodputAccumulation`` frozen (its constants given) at N = 4:

    .venv/bin/python benchmarks/lab/policy_window_cost.py --rounds 3

LeNet5 on random 32 x 32 images, micro-batches of 8; each variant trains an epoch to compile and warm up, then
--windows windows, timed; the variants take turns in one process, --rounds times. Prints the median (range)
milliseconds a window and each round's ratio to the fixed N.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

VARIANTS = ("fixed", "adaptive", "goodput")
STEPS, MICRO_BATCH = 4, 8


def window_seconds(variant, windows):
    """One variant trained from fresh weights: seconds a window over `windows` windows after a warm-up epoch."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = harness.build("lenet", 10, optimizer="momentum")
    steps = {"fixed": STEPS,
             "adaptive": ms_accum.AdaptiveAccumulation(min_steps=STEPS, max_steps=STEPS, interval=10),
             # t_end far below t_micro: the goodput optimum is the smallest N, min_steps
             "goodput": ms_accum.GoodputAccumulation(min_steps=STEPS, max_steps=STEPS + 1, interval=10,
                                                     micro_time=0.005, end_time=1e-6)}[variant]
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=steps,
                                       noise_scale=True, lr_scaling="adascale", reference_batch=MICRO_BATCH)
    rng = np.random.default_rng(0)
    samples = windows * STEPS * MICRO_BATCH
    data = ds.NumpySlicesDataset({"image": rng.standard_normal((samples, 1, 32, 32)).astype(np.float32),
                                  "label": rng.integers(0, 10, samples).astype(np.int32)}, shuffle=False)
    telemetry = ms_accum.WindowTelemetry()

    class Clock(ms.train.Callback):
        """The time of the second epoch (the first compiles and warms up)."""
        began = ended = None

        def on_train_epoch_begin(self, run_context):
            if run_context.original_args().cur_epoch_num == 2:
                self.began = time.perf_counter()

        def on_train_epoch_end(self, run_context):
            if run_context.original_args().cur_epoch_num == 2:
                self.ended = time.perf_counter()
    clock = Clock()
    ms_accum.Model_ACCU(cell).train(2, data.batch(MICRO_BATCH, drop_remainder=True), callbacks=[telemetry, clock],
                                    dataset_sink_mode=False)
    chosen = {r.accumulation_steps for r in telemetry.records}
    if chosen != {STEPS}:
        raise RuntimeError(f"{variant}: the windows' N were {sorted(chosen)}, not {STEPS} alone")
    return (clock.ended - clock.began) / windows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    types = harness.argtypes()
    parser.add_argument("--rounds", type=types.positive_int, default=3)
    parser.add_argument("--windows", type=types.positive_int, default=300)
    args = parser.parse_args()
    harness.start_mindspore("graph")
    results = harness.rotate({v: (lambda v=v: window_seconds(v, args.windows)) for v in VARIANTS}, args.rounds)
    rows = []
    for variant in VARIANTS:
        times = [1e3 * t for t in results[variant]]
        ratios = [t / f for t, f in zip(results[variant], results["fixed"])]
        rows.append((variant, f"{statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f})",
                     ", ".join(f"{r:.2f}" for r in ratios)))
    print(f"\nLeNet5, TrainAccuStepsCell under Model_ACCU, micro-batch {MICRO_BATCH}, N = {STEPS}, {args.windows} "
          f"windows timed, {args.rounds} rounds\n")
    harness.print_table(("variant", "ms a window, median (range)", "each round against fixed N"), rows)


if __name__ == "__main__":
    main()
