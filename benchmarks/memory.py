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
- model-accu: ``Model_ACCU.train`` over ``TrainAccuStepsCell``, dataset, no sink;
- plain-b-data: ``Model.train`` over ``nn.TrainOneStepCell``, batch b, dataset (the driver's and Model_ACCU's
  plain counterpart: a dataset pipeline holds memory of its own).

``--optimizer momentum`` trains with MindSpore's ``nn.Momentum`` (no weight decay) and its plain cross-entropy
instead of MindCV's momentum with weight decay and label smoothing; ``--width`` sets the MLP's hidden width, and
``--widths W1,W2`` runs every configuration at both and adds the marginal copies between them.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from lenet_cells import start_mindspore  # noqa: E402  (no MindSpore import; puts the project on sys.path)

CONFIGS = ("plain-b", "plain-Nb", "plain-b-data", "three-cells", "accumulator", "tutorial", "driver", "model-accu",
           "tutorial-clip")
DATASET_FED = ("plain-b-data", "driver", "model-accu")


def rss_mib():
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def peak_mib():
    from ms_accum.trainers.planner import resident_peak  # pylint: disable=import-outside-toplevel
    return resident_peak() / 2 ** 20  # not ru_maxrss: it carries the peak of the process that started this one


def block_model(classes, seed=0):
    """A transformer block model: 4 encoder layers (d 256, 4 heads, feed-forward 1024) over 64 positions, mean
    pooled, a classifier."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    ms.set_seed(seed)

    class Blocks(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layers = nn.CellList([nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
                                       for _ in range(4)])
            self.head = nn.Dense(256, classes)

        def construct(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(x.mean(1))
    return Blocks()


TEXT_VOCAB = 50000


def text_model(classes):
    """A text classifier: an embedding table (TEXT_VOCAB x 256, its first and largest parameter), the mean over the
    tokens, a classifier."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel

    class EmbeddingBag(nn.Cell):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(TEXT_VOCAB, 256)
            self.head = nn.Dense(256, classes)

        def construct(self, ids):
            return self.head(self.table(ids).mean(1))
    return EmbeddingBag()


def build(args):
    """(network, loss, optimizer): MindCV's model, the block model, the wide MLP, the tiny one or the text model,
    label-smoothed CE, MindCV's momentum."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    import mindcv  # pylint: disable=import-outside-toplevel
    ms.set_seed(0)
    if args.model == "block":
        net = block_model(args.classes)
    elif args.model == "mlp":
        width = args.width
        net = nn.SequentialCell(nn.Dense(1024, width), nn.ReLU(), nn.Dense(width, width), nn.ReLU(),
                                nn.Dense(width, args.classes))
    elif args.model == "tiny":  # parameters of 64 KiB: what a graph holds beyond its tensors shows
        net = nn.SequentialCell(nn.Dense(1024, 16), nn.ReLU(), nn.Dense(16, args.classes))
    elif args.model == "text":  # an embedding table of 50,000 x 256 (48.8 MiB) first, as in most text models
        net = text_model(args.classes)
    else:
        net = mindcv.create_model(args.model, num_classes=args.classes)
    if args.optimizer == "momentum":  # MindSpore's own, no weight decay, and its plain cross-entropy
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        return net, loss, nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    loss = mindcv.create_loss(name="CE", label_smoothing=0.1)
    optimizer = mindcv.create_optimizer(net.trainable_params(), opt="momentum", lr=0.01, momentum=0.9,
                                        weight_decay=1e-4)
    return net, loss, optimizer


def copy_mib_of(net):
    """MiB of one float32 copy of `net`'s trainable parameters: the unit of the memory figures."""
    return sum(int(np.prod(p.shape)) for p in net.trainable_params()) * 4 / 2 ** 20


def micro_batches(args, count):
    rng = np.random.default_rng(1)
    vector = (args.micro_batch, 1024)
    if args.model == "text":  # 64 token ids per sample
        return [(rng.integers(0, TEXT_VOCAB, size=(args.micro_batch, 64)).astype(np.int32),
                 rng.integers(0, args.classes, size=args.micro_batch).astype(np.int32)) for _ in range(count)]
    shape = {"block": (args.micro_batch, 64, 256), "mlp": vector, "tiny": vector}.get(
        args.model, (args.micro_batch, 3, args.image_size, args.image_size))
    return [(rng.normal(size=shape).astype(np.float32),
             rng.integers(0, args.classes, size=args.micro_batch).astype(np.int32)) for _ in range(count)]


def dataset_of(batches, size):
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    images, labels = np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])
    return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(size)


def tensors_of(config, batches, steps):
    """The micro-batches as Tensors (for plain-Nb, each window's joined into one batch), made before the base is
    taken: the data is not what a configuration adds."""
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
    from peers import jit_step  # pylint: disable=import-outside-toplevel
    steps = args.steps
    loss_net = nn.WithLossCell(net, loss)
    if config in ("plain-b", "plain-Nb"):
        step = nn.TrainOneStepCell(loss_net, optimizer)
        return lambda: [step(x, y) for x, y in tensors]
    if config == "plain-b-data":
        model = Model(nn.TrainOneStepCell(loss_net, optimizer))
        return lambda: model.train(1, dataset_of(batches, args.micro_batch), dataset_sink_mode=False)
    if config == "three-cells":
        grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
        forward_backward = ms_accum.TrainForwardBackward(loss_net, optimizer, grad_sum)
        optim, clear = ms_accum.TrainOptim(optimizer, grad_sum), ms_accum.TrainClear(grad_sum)

        def run():
            for index, (x, y) in enumerate(tensors):
                forward_backward(x, y)
                if index % steps == steps - 1:
                    optim()
                    clear()
        return run
    if config == "driver":
        accumulation = ms_accum.GradientAccumulation(net, loss, optimizer)
        return lambda: accumulation.train_process(1, dataset_of(batches, args.micro_batch), steps, ckpt_path=None,
                                                  log_every=0)
    if config == "model-accu":
        model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(loss_net, optimizer,
                                                                gradient_accumulation_steps=steps))
        return lambda: model.train(1, dataset_of(batches, args.micro_batch), dataset_sink_mode=False)
    train_step = jit_step(config, loss_net, optimizer, steps)
    return lambda: [train_step(x, y) for x, y in tensors]


def child(config, args):
    """Measure one configuration in this process; print one JSON line."""
    start_mindspore(args.mode)
    net, loss, optimizer = build(args)
    copy_mib = copy_mib_of(net)
    batches = micro_batches(args, args.windows * args.steps)
    tensors = tensors_of(config, batches, args.steps) if config not in DATASET_FED else None
    base = rss_mib()
    run = trainer(config, args, net, loss, optimizer, batches, tensors)
    run()
    float(optimizer.parameters[0].asnumpy().sum())  # the last update done
    print(json.dumps({"config": config, "base": base, "peak": peak_mib() - base, "held": rss_mib() - base,
                      "copy": copy_mib}), flush=True)


def add_model_arguments(parser, configs, windows):
    """The options of the model, the micro-batches and the configurations to measure (each in a child process)."""
    parser.add_argument("--model", default="resnet18",
                        help="a MindCV model name, 'block', 'mlp', 'tiny' or 'text' (default: resnet18)")
    parser.add_argument("--image_size", type=int, default=192)
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8, help="N")
    parser.add_argument("--windows", type=int, default=windows)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--width", type=int, default=2048, help="the MLP's hidden width (--model mlp)")
    parser.add_argument("--optimizer", choices=["mindcv", "momentum"], default="mindcv",
                        help="MindCV's momentum with weight decay and label smoothing, or nn.Momentum without")
    parser.add_argument("--configs", default=",".join(configs))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)


def measure_each(script, args, child_main, extra=(), strict=False):
    """In a child process (``--child``), run ``child_main(config, args)`` and return None. Otherwise run `script`
    for each of ``--configs`` in a fresh process, with the options of :func:`add_model_arguments` and `extra`, and
    return {config: its JSON line as a dict}; a configuration that fails is reported and left out, or with
    `strict` raises."""
    if args.child:
        child_main(args.child, args)
        return None
    names = ("model", "image_size", "micro_batch", "steps", "windows", "classes", "width", "optimizer") + tuple(extra)
    results = {}
    for config in args.configs.split(","):
        argv = [sys.executable, os.path.abspath(script), "--child", config] + [
            f"--{name}={getattr(args, name)}" for name in names]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        line = [text for text in done.stdout.splitlines() if text.startswith("{")]
        if done.returncode or not line:
            message = f"{os.path.basename(script)}: {config} failed ({done.returncode})\n{done.stderr[-3000:]}"
            if strict:
                raise RuntimeError(message)
            print(message, flush=True)
            continue
        results[config] = json.loads(line[-1])
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, CONFIGS, windows=3)
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--widths", default=None,
                        help="with --model mlp: two hidden widths, 'W1,W2'; each configuration runs at both, and the "
                             "table adds its marginal copies, the slope of its peak above plain-b between them")
    args = parser.parse_args()
    if args.widths and not args.child:
        marginal(args)
        return
    results = measure_each(__file__, args, child, ("mode",))
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
        runs.append(measure_each(__file__, args, child, ("mode",)))
        table(args, runs[-1])
    print(f"\nmlp 1024-W-W-{args.classes}, micro-batch {args.micro_batch}, N = {args.steps}, {args.mode} mode, "
          f"{args.optimizer} optimizer; copies above plain-b at each width, and the marginal copies between them\n")
    print(f"| configuration | W {widths[0]} | W {widths[1]} | marginal copies |")
    print("|---|---|---|---|")
    for config in args.configs.split(","):
        if config == "plain-b" or any(config not in run or "plain-b" not in run for run in runs):
            continue
        above = [run[config]["peak"] - run["plain-b"]["peak"] for run in runs]
        copies = [run[config]["copy"] for run in runs]
        print(f"| {config} | {above[0] / copies[0]:+.2f} | {above[1] / copies[1]:+.2f} | "
              f"{(above[1] - above[0]) / (copies[1] - copies[0]):+.2f} |")


def table(args, results):
    if not results:
        return
    copy = next(iter(results.values()))["copy"]
    size = '' if args.model in ('block', 'mlp', 'tiny', 'text') else f'{args.image_size}x{args.image_size}, '
    print(f"\n{args.model}, {size}micro-batch "
          f"{args.micro_batch}, N = {args.steps}, {args.mode} mode; one float32 copy of the trainable parameters: "
          f"{copy:.1f} MiB\n")
    print("| configuration | peak MiB above the built network and data | held after the last window "
          "| copies above plain-b "
          "| copies above plain-b-data |")
    print("|---|---|---|---|---|")
    for config, row in results.items():
        cells = []
        for baseline in ("plain-b", "plain-b-data"):
            if baseline in results and config not in ("plain-b", "plain-b-data"):
                cells.append(f"{(row['peak'] - results[baseline]['peak']) / copy:+.1f}")
            else:
                cells.append("")
        print(f"| {config} | {row['peak']:.0f} | {row['held']:.0f} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
