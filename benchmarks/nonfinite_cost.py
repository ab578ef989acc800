"""The cost of the non-finite check: the driver with nonfinite="skip" (the default) against "apply", in one process.

    .venv/bin/python benchmarks/nonfinite_cost.py                  # GRAPH_MODE, LeNet5 and the wide MLP, b = 32, N = 4
    .venv/bin/python benchmarks/nonfinite_cost.py --mode pynative --pairs 12 --windows 30

"skip" tests the window's gradient norm (already computed for telemetry and clipping) for a NaN or an inf, puts
the optimizer step behind a branch taken at run time, counts skipped windows on the device, and has the driver
read that count once per window to warn; "apply" checks nothing, as mindspore.nn.TrainOneStepCell. Two fresh
drivers run in rotating blocks of --windows windows (see benchmarks/noise_cost.py for the method); the median
ratio of their times is printed with its quartiles, per model, for wall and CPU time.
"""
import harness


def main():
    args, models = harness.cost_arguments(__doc__, harness.COST_MODELS, 1)
    apply, skip = "nonfinite='apply'", "nonfinite='skip'"
    for name in models:
        images, labels = harness.sample_arrays(args.windows * args.steps * args.batch)
        runners = harness.driver_runners(harness.COST_MODELS[name], {apply: {"nonfinite": "apply"},
                                                                     skip: {"nonfinite": "skip"}},
                                         images, labels, args.batch, args.steps)
        harness.compare_runners(name, args, runners, {skip: apply})


if __name__ == "__main__":
    main()
