"""Peak memory of every ms_accum path against plain training at the micro-batch and at the large batch.

    .venv/bin/python benchmarks/memory.py                                   # ResNet18, 192x192, b 8, N 8, graph
    .venv/bin/python benchmarks/memory.py --model block --image_size 0      # a transformer block model
    .venv/bin/python benchmarks/memory.py --model mlp                       # a wide MLP: parameters dominate
    .venv/bin/python benchmarks/memory.py --model tiny                      # 64 KiB of parameters: the graphs' own
    .venv/bin/python benchmarks/memory.py --model text                      # an embedding table first: 49 MiB
    .venv/bin/python benchmarks/memory.py --mode pynative
    .venv/bin/python benchmarks/memory.py --model mlp --widths 4096,8192 --optimizer momentum   # marginal copies

Each configuration runs in its own fresh process: it builds the network (MindCV's, seeded, the transformer
block model, the wide MLP of benchmarks/data_parallel.py, whose memory is nearly all parameters, gradients and
optimizer state, or a text model whose first and largest parameter is its embedding table), its loss, MindCV's
momentum optimizer and the micro-batches as Tensors (token ids for the text model), notes the resident memory,
then builds what the configuration adds (its cells and their buffers, the tutorial's zeros copy) and
trains --windows windows of N micro-batches (plain training: as many steps of b, or --windows steps of N x b),
and reports the peak resident memory above that base (VmHWM) and the resident memory after the last window
(what it holds). The figure that matters is the difference to plain training at b, in float32 copies of the
trainable parameters: accumulation's buffers are one copy, whenever they become resident (a Parameter made by
``initializer("zeros")`` takes its memory when first written, a ``clone(init="zeros")`` at once).

- plain-b, plain-Nb: ``nn.TrainOneStepCell`` on tensors, batch b and N x b;
- three-cells: TrainForwardBackward x N, TrainOptim, TrainClear on tensors;
- accumulator: ``ms_accum.Accumulator`` in a ``jit`` step (value_and_grad), on tensors;
- tutorial: the MindSpore 2.x tutorial's accumulator in a ``jit`` step, on tensors;
- tutorial-clip: the same, the window's gradient clipped by MindSpore's ``ops.clip_by_global_norm`` (no ms_accum:
  what MindSpore charges for one pass over the gradient at the window's end, inside the step with the network);
- driver: ``GradientAccumulation.train_process``, dataset;
- driver-first: the same with ``noise_scale="first"`` (two accumulation graphs, one measuring a window's first
  micro-batch, the host choosing);
- model-accu: ``Model_ACCU.train`` over ``TrainAccuStepsCell``, dataset, no sink;
- plain-b-data: ``Model.train`` over ``nn.TrainOneStepCell``, batch b, dataset (the driver's and Model_ACCU's
  plain counterpart: a dataset pipeline holds memory of its own).

``--optimizer momentum`` trains with MindSpore's ``nn.Momentum`` (no weight decay) and its plain cross-entropy
instead of MindCV's momentum with weight decay and label smoothing; ``--width`` sets the MLP's hidden width, and
``--widths W1,W2`` runs every configuration at both and adds the marginal copies between them.
"""
import argparse

import harness

CONFIGS = ("plain-b", "plain-Nb", "plain-b-data", "three-cells", "accumulator", "tutorial", "driver", "model-accu",
           "tutorial-clip", "driver-first")
DATASET_FED = ("plain-b-data", "driver", "model-accu", "driver-first")


def tensors_of(config, batches, steps):
    """The micro-batches as Tensors (for plain-Nb, each window's joined into one batch), made before the base is
    taken: the data is not what a configuration adds."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    from mindspore import Tensor  # pylint: disable=import-outside-toplevel
    if config == "plain-Nb":
        return [(Tensor(np.concatenate([x for x, _ in batches[i:i + steps]])),
                 Tensor(np.concatenate([y for _, y in batches[i:i + steps]])))
                for i in range(0, len(batches), steps)]
    return [(Tensor(x), Tensor(y)) for x, y in batches]


def trainer(config, args, net, loss, optimizer, batches, tensors):
    """A function running the whole measured job, its cells built here (after the base is taken)."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    from mindspore.train import Model  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    steps = args.steps
    loss_net = nn.WithLossCell(net, loss)
    if config in ("plain-b", "plain-Nb"):
        step = nn.TrainOneStepCell(loss_net, optimizer)
        return lambda: [step(x, y) for x, y in tensors]
    if config == "plain-b-data":
        model = Model(nn.TrainOneStepCell(loss_net, optimizer))
        return lambda: model.train(1, harness.dataset_of(batches), dataset_sink_mode=False)
    if config == "three-cells":
        cells = harness.three_cells(net, loss, optimizer)

        def run():
            for index, (x, y) in enumerate(tensors):
                cells[0](x, y)
                if index % steps == steps - 1:
                    cells[1]()
                    cells[2]()
        return run
    if config in ("driver", "driver-first"):
        accumulation = ms_accum.GradientAccumulation(net, loss, optimizer,
                                                     noise_scale="first" if config == "driver-first" else False)
        return lambda: accumulation.train_process(1, harness.dataset_of(batches), steps, ckpt_path=None,
                                                  log_every=0)
    if config == "model-accu":
        model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(loss_net, optimizer,
                                                                gradient_accumulation_steps=steps))
        return lambda: model.train(1, harness.dataset_of(batches), dataset_sink_mode=False)
    train_step = harness.jit_step(config, loss_net, optimizer, steps)
    return lambda: [train_step(x, y) for x, y in tensors]


def child(config, args):
    """Measure one configuration in this process; report its result."""
    harness.start_mindspore(args.mode)
    net, loss, optimizer = harness.build(args.model, args.classes, args.width, args.optimizer)
    copy_mib = harness.copy_mib_of(net)
    batches = harness.random_batches(args, args.windows * args.steps, seed=1)
    tensors = tensors_of(config, batches, args.steps) if config not in DATASET_FED else None
    base = harness.rss_mib()
    run = trainer(config, args, net, loss, optimizer, batches, tensors)
    run()
    float(optimizer.parameters[0].asnumpy().sum())  # the last update done
    harness.report({"config": config, "base": base, "peak": harness.peak_mib() - base,
                    "held": harness.rss_mib() - base, "copy": copy_mib})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_model_arguments(parser, CONFIGS, windows=3)
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--widths", default=None,
                        help="with --model mlp: two hidden widths, 'W1,W2'; each configuration runs at both, and the "
                             "table adds its marginal copies, the slope of its peak above plain-b between them")
    args = parser.parse_args()
    if args.widths and not args.child:
        marginal(args)
        return
    results = harness.measure_each(__file__, args, child, ("mode",))
    if results is None:
        return
    for config, result in results.items():
        print(f"{config}: peak +{result['peak']:.0f} MiB, held +{result['held']:.0f} MiB", flush=True)
    table(args, results)


def marginal(args):
    """Every configuration at two MLP widths; the table gives each one's copies above plain-b at both, and their
    slope: what the configuration holds per parameter copy, the fixed costs (runtime, graphs, pipeline) left out."""
    widths = [int(w) for w in args.widths.split(",")]
    if args.model != "mlp" or len(widths) != 2 or widths[0] == widths[1]:
        raise SystemExit("memory.py: --widths takes two different widths 'W1,W2', with --model mlp")
    configs = args.configs.split(",")
    if "plain-b" not in configs:
        args.configs = ",".join(["plain-b"] + configs)
    runs = []
    for width in widths:
        args.width = width
        runs.append(harness.measure_each(__file__, args, child, ("mode",)))
        table(args, runs[-1])
    print(f"\nmlp 1024-W-W-{args.classes}, micro-batch {args.micro_batch}, N = {args.steps}, {args.mode} mode, "
          f"{args.optimizer} optimizer; copies above plain-b at each width, and the marginal copies between them\n")
    rows = []
    for config in args.configs.split(","):
        if config == "plain-b" or any(config not in run or "plain-b" not in run for run in runs):
            continue
        above = [run[config]["peak"] - run["plain-b"]["peak"] for run in runs]
        copies = [run[config]["copy"] for run in runs]
        rows.append((config, f"{above[0] / copies[0]:+.2f}", f"{above[1] / copies[1]:+.2f}",
                     f"{(above[1] - above[0]) / (copies[1] - copies[0]):+.2f}"))
    harness.print_table(("configuration", f"W {widths[0]}", f"W {widths[1]}", "marginal copies"), rows)

def table(args, results):
    """The configurations' peaks and what they hold, MiB, and their peaks above plain training in copies."""
    if not results:
        return
    copy = next(iter(results.values()))["copy"]
    size = '' if args.model in ('block', 'mlp', 'tiny', 'text') else f'{args.image_size}x{args.image_size}, '
    print(f"\n{args.model}, {size}micro-batch "
          f"{args.micro_batch}, N = {args.steps}, {args.mode} mode; one float32 copy of the trainable parameters: "
          f"{copy:.1f} MiB\n")
    rows = []
    for config, row in results.items():
        above = [f"{(row['peak'] - results[baseline]['peak']) / copy:+.1f}"
                 if baseline in results and config not in ("plain-b", "plain-b-data") else ""
                 for baseline in ("plain-b", "plain-b-data")]
        rows.append((config, f"{row['peak']:.0f}", f"{row['held']:.0f}", *above))
    harness.print_table(("configuration", "peak MiB above the built network and data", "held after the last window",
                         "copies above plain-b", "copies above plain-b-data"), rows)

if __name__ == "__main__":
    main()
