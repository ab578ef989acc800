"""MindCV's TrainStep, the MindSpore tutorial's accumulator and every ms_accum path on one model, time and start-up.

    .venv/bin/python benchmarks/peers.py              # EdgeNeXt xx_small, 64x64, micro-batch 8, N = 4, GRAPH_MODE
    .venv/bin/python benchmarks/peers.py --mode pynative --starts 1 --rounds 4 --windows 2
    .venv/bin/python benchmarks/peers.py --mode pynative --starts 0 --peers tutorial,three-cells,driver,\
        parallel,model-accu,accumulator --model block      # every path against the tutorial's jit step

Every peer trains the same model (a MindCV model built by `mindcv.create_model`; `--model block`, four
transformer encoder layers; or `--model lenet`, LeNet5 on 1 x 32 x 32) with the same initial weights, MindCV's
momentum optimizer and label-smoothed cross-entropy, on the same micro-batches, fed by a dataset:

- `mindcv-trainstep`: MindCV's own `create_trainer(..., gradient_accumulation_steps=N)`, a `Model` over its
  `TrainStep` (built on `mindspore.boost.GradientAccumulation`), as MindCV's train.py runs it;
- `tutorial`: the MindSpore tutorial's pattern, a `jit_class` accumulator adding each micro-batch's gradient of
  loss / N and stepping the optimizer every N-th call, inside a `jit` train step;
- `driver`: `ms_accum.GradientAccumulation.train_process`;
- `three-cells`: `TrainForwardBackward` per micro-batch, `TrainOptim` and `TrainClear` per window;
- `parallel`: `TrainAccuStepsCell` called per micro-batch (its automatic mode);
- `model-accu`: `Model_ACCU.train` over a `TrainAccuStepsCell`, without dataset sink mode;
- `accumulator`: `ms_accum.Accumulator` inside a `jit` train step;
- `tutorial-two-graphs`: the tutorial's accumulator without ms_accum, its window's end (the optimizer on the
  buffers, then the buffers reset) in a `jit` function of its own, called every N-th micro-batch after a `jit`
  step of value_and_grad and the addition. It is the ms_accum driver's shape (the window's end in a second graph,
  without the network's activations) written with MindSpore alone: its start-up against the tutorial's is what
  MindSpore charges for the second graph. (Its micro-step has no runtime branch, which MindSpore's CPU runs
  slowly: see jit_branch.py; compare its start-up, not its steady speed.)

The loops over tensors (tutorial, three-cells, parallel, accumulator, tutorial-two-graphs) read the same dataset's
iterator.

Three figures per peer:

- start-up: a fresh process per peer (--starts of them, alternating peers) builds the network, then times its
  first update (compilation included) and its first --first-windows windows, from the call that starts training;
- steady speed: in one process, blocks of --windows windows, each peer in turn, --rounds times; each block's time
  against the neighbouring TrainStep block's gives a ratio (speed relative to TrainStep: > 1 is faster), median;
- distance: the first window's update against the large batch's (value_and_grad of the mean loss on the window's
  concatenated micro-batches, one step of the same optimizer), largest difference over the largest element. With
  BatchNorm (resnet18, say) every micro-batch normalises with its own statistics, so no peer equals the large
  batch there: the figure then measures that, not the accumulation.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from lenet_cells import start_mindspore, three_cells  # noqa: E402  (no MindSpore import; puts the project on sys.path)

PEERS = ("mindcv-trainstep", "tutorial", "driver", "three-cells", "parallel", "model-accu", "accumulator",
         "tutorial-two-graphs")


def micro_batches(args, windows, seed):
    rng = np.random.default_rng(seed)
    shape = {"block": (args.micro_batch, 64, 256), "lenet": (args.micro_batch, 1, 32, 32)}.get(
        args.model, (args.micro_batch, 3, args.image_size, args.image_size))
    return [(rng.normal(size=shape).astype(np.float32),
             rng.integers(0, args.classes, size=args.micro_batch).astype(np.int32))
            for _ in range(windows * args.steps)]


def dataset_of(batches):
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    images, labels = np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])
    return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(len(batches[0][1]))


def build(args):
    """The model (seeded: the same initial weights every time), MindCV's loss and its momentum optimizer."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    import mindcv  # pylint: disable=import-outside-toplevel
    from memory import block_model  # pylint: disable=import-outside-toplevel
    ms.set_seed(0)
    if args.model == "block":
        net = block_model(args.classes)
    elif args.model == "lenet":
        from src.lenet import LeNet5  # pylint: disable=import-outside-toplevel
        net = LeNet5(num_class=args.classes)
    else:
        net = mindcv.create_model(args.model, num_classes=args.classes)
    loss = mindcv.create_loss(name="CE", label_smoothing=0.1)
    optimizer = mindcv.create_optimizer(net.trainable_params(), opt="momentum", lr=0.01, momentum=0.9,
                                        weight_decay=1e-4)
    return net, loss, optimizer


def make_peer(name, args):
    """(network, train(batches)): `train` runs the batches' windows through the peer and waits for the result."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = build(args)
    steps = args.steps

    def finished():
        return float(optimizer.parameters[-1].asnumpy().sum())

    if name == "mindcv-trainstep":
        from mindcv.utils import create_trainer  # pylint: disable=import-outside-toplevel
        model = create_trainer(net, loss, optimizer, metrics=None, amp_level="O0", amp_cast_list=None,
                               loss_scale_type="fixed", loss_scale=1.0, gradient_accumulation_steps=steps)

        def train(batches):
            model.train(1, dataset_of(batches), dataset_sink_mode=False)
            return finished()
        return net, train
    if name == "driver":
        trainer = ms_accum.GradientAccumulation(net, loss, optimizer)

        def train(batches):
            trainer.train_process(1, dataset_of(batches), steps, ckpt_path=None, log_every=0)
            return finished()
        return net, train
    if name == "model-accu":
        model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer,
                                                                gradient_accumulation_steps=steps))

        def train(batches):
            model.train(1, dataset_of(batches), dataset_sink_mode=False)
            return finished()
        return net, train
    if name == "three-cells":
        forward_backward, optim, clear = three_cells(net, loss, optimizer)

        def train_step(x, y, index):
            forward_backward(x, y)
            if index % steps == steps - 1:
                optim()
                clear()
    elif name == "parallel":
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=steps)
        cell.set_train(True)

        def train_step(x, y, _):
            cell(x, y)
    elif name == "tutorial-two-graphs":
        micro_step, window_end = two_graph_steps(nn.WithLossCell(net, loss), optimizer, steps)

        def train_step(x, y, index):
            micro_step(x, y)
            if index % steps == steps - 1:
                window_end()
    else:
        jitted = jit_step(name, nn.WithLossCell(net, loss), optimizer, steps)

        def train_step(x, y, _):
            jitted(x, y)

    def train(batches):
        for index, (x, y) in enumerate(dataset_of(batches).create_tuple_iterator(num_epochs=1)):
            train_step(x, y, index)
        return finished()
    return net, train


def step_parts(name, loss_net, optimizer, steps):
    """What the MindSpore 2.x training step of `name` ("tutorial", "tutorial-clip" or "accumulator") runs per
    micro-batch: (the value_and_grad function, the accumulator, whether the accumulator takes the micro-batch's
    size). The tutorial divides the loss by N and calls its accumulator with the gradients ("tutorial-clip": the
    window's gradient clipped by MindSpore's ``ops.clip_by_global_norm`` before the optimizer, a pass over it as
    ms_accum's gradient norm is); ms_accum's takes the mean loss and ``Accumulator(grads, num_items)``."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    loss_net.set_train(True)
    if name in ("tutorial", "tutorial-clip"):
        def divided_loss(x, y):
            return loss_net(x, y) / steps
        tutorial = _tutorial_class()(optimizer, steps, TUTORIAL_CLIP_NORM if name == "tutorial-clip" else None)
        return ms.value_and_grad(divided_loss, None, optimizer.parameters), tutorial, False
    return ms.value_and_grad(loss_net, None, optimizer.parameters), ms_accum.Accumulator(optimizer, steps), True


def jit_step(name, loss_net, optimizer, steps):
    """The MindSpore 2.x training step of `name` (see ``step_parts``): value_and_grad and the accumulator
    inside one ``ms.jit`` function, called once per micro-batch."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import ops  # pylint: disable=import-outside-toplevel
    grad_fn, accumulator, weighted = step_parts(name, loss_net, optimizer, steps)

    @ms.jit
    def train_step(x, y):
        loss_value, grads = grad_fn(x, y)
        if weighted:  # a constant when compiled: no branch in the graph
            return ops.depend(loss_value, accumulator(grads, x.shape[0]))
        return ops.depend(loss_value, accumulator(grads))
    return train_step


def two_graph_steps(loss_net, optimizer, steps):
    """The tutorial's accumulation in two ``ms.jit`` functions: (value_and_grad of loss / N and the addition into
    the buffers, per micro-batch; the optimizer on the buffers and their reset from zeros, per window). The
    gradient function and the buffers are the tutorial peer's own (``step_parts``)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import ops  # pylint: disable=import-outside-toplevel
    grad_fn, tutorial, _ = step_parts("tutorial", loss_net, optimizer, steps)

    @ms.jit
    def micro_step(x, y):
        loss_value, grads = grad_fn(x, y)
        return ops.depend(loss_value, tutorial.map(ops.partial(ops.assign_add), tutorial.inner_grads, grads))

    @ms.jit
    def window_end():
        done = optimizer(tutorial.inner_grads)
        return ops.depend(done, tutorial.map(ops.partial(ops.assign), tutorial.inner_grads, tutorial.zeros))
    return micro_step, window_end


TUTORIAL_CLIP_NORM = 1.0


def _tutorial_class():
    """The tutorial's class (defined once MindSpore has loaded with the CPU settings)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Parameter, Tensor, ops  # pylint: disable=import-outside-toplevel

    @ms.jit_class
    class _Tutorial:
        """The MindSpore tutorial's accumulator: buffers and a zeros copy beside the parameters, a counter from 1,
        the optimizer stepped on the summed (loss / N) gradients every N-th call (clipped by their global norm with
        a `clip_norm`), the buffers reset from zeros."""

        def __init__(self, optimizer, steps, clip_norm=None):
            self.optimizer = optimizer
            self.clip_norm = clip_norm
            self.inner_grads = optimizer.parameters.clone(prefix="accumulate_", init="zeros")
            self.zeros = optimizer.parameters.clone(prefix="zeros_", init="zeros")
            self.counter = Parameter(Tensor(1, ms.int32), "counter_")
            self.steps = steps
            self.map = ops.HyperMap()

        def __call__(self, grads):
            self.map(ops.partial(ops.assign_add), self.inner_grads, grads)
            if self.counter % self.steps == 0:
                if self.clip_norm is None:
                    self.optimizer(self.inner_grads)
                else:
                    self.optimizer(ops.clip_by_global_norm(self.inner_grads, self.clip_norm))
                self.map(ops.partial(ops.assign), self.inner_grads, self.zeros)
            ops.assign_add(self.counter, Tensor(1, ms.int32))
            return True
    return _Tutorial


def update_distance(net_after, initial, reference):
    """Largest difference between two updates over the reference update's largest element, less two float32
    spacings of the parameter (storing a LayerNorm weight near 1 rounds by 1.2e-7, 5e-5 of a 2.4e-3 update). The
    parameters are paired by position: Model renames a network's parameters when it builds its train network."""
    diff = max(np.maximum(np.abs(got - want) - 2.0 * np.spacing(np.abs(want).astype(np.float32)), 0.0).max()
               for got, want in zip(net_after, reference))
    return float(diff / max(np.abs(want - start).max() for start, want in zip(initial, reference)))


def large_batch_update(args, window):
    """The same model, loss and optimizer, one step on the window's concatenated micro-batches (PYNATIVE)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net, loss, optimizer = build(args)
    loss_net = nn.WithLossCell(net, loss)
    loss_net.set_train(True)
    _, grads = ms.value_and_grad(loss_net, None, optimizer.parameters)(
        Tensor(np.concatenate([x for x, _ in window])), Tensor(np.concatenate([y for _, y in window])))
    optimizer(grads)
    ms.set_context(mode=mode)
    return parameters(net)


def parameters(net):
    return [p.asnumpy().astype(np.float64) for p in net.trainable_params()]


def start_up(args):
    """One fresh process, one peer: time to the first update and to --first-windows windows; the distance."""
    batches = micro_batches(args, args.first_windows, seed=1)
    result = {"peer": args.start_up}
    try:
        net, train = make_peer(args.start_up, args)
        initial = parameters(net)
        began = time.perf_counter()
        train(batches[:args.steps])
        result["first_update_s"] = time.perf_counter() - began
        after_first = parameters(net)
        train(batches[args.steps:])
        result["first_windows_s"] = time.perf_counter() - began
        result["distance"] = update_distance(after_first, initial, large_batch_update(args, batches[:args.steps]))
    except Exception as error:  # pylint: disable=broad-except  (a peer that fails is reported, not hidden)
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    print("RESULT " + json.dumps(result), flush=True)


def start_ups(args, argv):
    """--starts fresh processes per peer, alternating peers; every process's result."""
    results = {peer: [] for peer in args.peers}
    for _ in range(args.starts):
        for peer in args.peers:
            proc = subprocess.run([sys.executable, __file__, *argv, "--start-up", peer], capture_output=True,
                                  text=True, timeout=1800)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode or not lines:
                raise RuntimeError(f"peers.py: the start-up run of {peer} exited {proc.returncode}:\n"
                                   f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
            results[peer].append(json.loads(lines[-1][len("RESULT "):]))
            print(f"start-up {peer}: {results[peer][-1]}", flush=True)
    return results


def steady(args):
    """Blocks of --windows windows per peer in turn, --rounds times, in this process; per peer the block ratios to
    the neighbouring baseline block (TrainStep, or the first peer that runs) and the baseline's window time."""
    trainers, failed = {}, {}
    warm = micro_batches(args, 1, seed=2)
    for peer in args.peers:
        try:
            _, train = make_peer(peer, args)
            train(warm)
            trainers[peer] = train
        except Exception as error:  # pylint: disable=broad-except
            failed[peer] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    if not trainers:
        raise RuntimeError(f"peers.py: no peer trains in this mode: {failed}")
    baseline = next(iter(trainers))
    blocks = {peer: [] for peer in trainers}
    data = micro_batches(args, args.windows, seed=3)
    for _ in range(args.rounds):
        for peer, train in trainers.items():
            began = time.perf_counter()
            train(data)
            blocks[peer].append(time.perf_counter() - began)
    ratios = {peer: [b / t for b, t in zip(blocks[baseline], times)] for peer, times in blocks.items()}
    return baseline, statistics.median(blocks[baseline]) / args.windows, ratios, failed


def table(args, starts, baseline, window_s, ratios, failed):
    size = {"block": "64 x 256 inputs", "lenet": "1 x 32 x 32"}.get(args.model, f"{args.image_size}x{args.image_size}")
    print(f"\n{args.model}, {size}, micro-batch {args.micro_batch} x {args.steps}, "
          f"{args.mode.upper()} mode; steady blocks of {args.windows} windows x {args.rounds} rounds, baseline "
          f"{baseline} at {window_s:.3f} s per window; start-up medians of {args.starts} processes\n")
    print(f"| peer | first update, compile included (s) | first {args.first_windows} windows (s) | steady speed "
          f"vs {baseline} (median, range) | update distance from the large batch |")
    print("|---|---|---|---|---|")
    for peer in args.peers:
        runs = [r for r in starts.get(peer, []) if "error" not in r]
        errors = [r["error"] for r in starts.get(peer, []) if "error" in r]
        missing = "fails" if errors else "-"
        first = f"{statistics.median(r['first_update_s'] for r in runs):.1f}" if runs else missing
        windows = f"{statistics.median(r['first_windows_s'] for r in runs):.1f}" if runs else missing
        distance = f"{max(r['distance'] for r in runs):.1e}" if runs else "-"
        if peer in ratios:
            values = ratios[peer]
            speed = f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"
        else:
            speed = "fails: " + failed.get(peer, "")
        note = f" ({errors[0]})" if errors and not runs else ""
        print(f"| {peer}{note} | {first} | {windows} | {speed} | {distance} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="edgenext_xx_small", help="a mindcv.create_model name")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update, N")
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--first-windows", type=int, default=4)
    parser.add_argument("--windows", type=int, default=4, help="windows per steady block")
    parser.add_argument("--rounds", type=int, default=8, help="steady blocks per peer")
    parser.add_argument("--starts", type=int, default=3, help="fresh start-up processes per peer (0: none)")
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ", ".join(PEERS))
    parser.add_argument("--start-up", choices=PEERS, help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    args = parser.parse_args()
    args.peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in args.peers if p not in PEERS]
    if unknown:
        parser.error(f"--peers: unknown {unknown}; choose from {', '.join(PEERS)}")
    for name in ("image_size", "classes", "micro_batch", "steps", "first_windows", "windows", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, but got {getattr(args, name)}.")
    if args.first_windows < 2:
        parser.error("--first-windows must be >= 2: the first update is timed on its own.")
    start_mindspore(args.mode)
    if args.start_up:
        start_up(args)
        return
    starts = start_ups(args, argv) if args.starts else {}
    baseline, window_s, ratios, failed = steady(args)
    table(args, starts, baseline, window_s, ratios, failed)


if __name__ == "__main__":
    main()
