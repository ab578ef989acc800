"""MindCV's TrainStep, the MindSpore tutorial's accumulator and every ms_accum path on one model, time and start-up.

    .venv/bin/python benchmarks/peers.py              # EdgeNeXt xx_small, 64x64, micro-batch 8, N = 4, GRAPH_MODE
    .venv/bin/python benchmarks/peers.py --mode pynative --starts 1 --rounds 4 --windows 2
    .venv/bin/python benchmarks/peers.py --mode pynative --starts 0 --model block \\
        --peers tutorial,three-cells,driver,parallel,model-accu,accumulator   # every path against the tutorial's
    .venv/bin/python benchmarks/peers.py --peers tutorial,checked-two-graphs,driver,mindcv-trainstep --starts 3 \\
        --rounds 1 --windows 2 --where                     # where each first update's time goes

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
- `checked-two-graphs`: `tutorial-two-graphs` whose window's end also takes the gradient's global norm, divides
  the buffers in place, skips a non-finite window in a run-time branch and clears the buffers one after another
  (no zeros copy), written with MindSpore and ms_accum's per-parameter helpers, without its engine: what the
  second graph costs when it keeps ms_accum's memory and its non-finite skip, the floor of the driver's start-up.
- `checked-one-graph`: the tutorial's one `jit` step whose window's end, in its every-N-th branch, is
  `checked-two-graphs`' (the same code): that floor without a second graph.

The loops over tensors (tutorial, three-cells, parallel, accumulator and the two-graph and one-graph floors) read
the same dataset's iterator.

Three figures per peer:

- start-up: a fresh process per peer (--starts of them, alternating peers) builds the network, then times its
  first update (compilation included) and its first --first-windows windows, from the call that starts training;
- steady speed: in one process, blocks of --windows windows, each peer in turn, --rounds times; each block's time
  against the neighbouring TrainStep block's gives a ratio (speed relative to TrainStep: > 1 is faster), median;
- distance: the first window's update against the large batch's (value_and_grad of the mean loss on the window's
  concatenated micro-batches, one step of the same optimizer), largest difference over the largest element. With
  BatchNorm (resnet18, say) every micro-batch normalises with its own statistics, so no peer equals the large
  batch there: the figure then measures that, not the accumulation.

With --where each start-up process runs its first update under Python's profiler and the table adds where its
time went: compiling graphs (MindSpore's compiler, its parser included), how many graphs were compiled, and
ms_accum's own Python (the checks, records and compile-cache guard around the graphs).
"""
import argparse
import statistics
import sys
import time

import numpy as np

import harness

PEERS = ("mindcv-trainstep", "tutorial", "driver", "three-cells", "parallel", "model-accu", "accumulator",
         "tutorial-two-graphs", "checked-two-graphs", "checked-one-graph")


def build(args):
    """The model (seeded: the same initial weights every time), MindCV's loss and its momentum optimizer."""
    return harness.build(args.model, args.classes)


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
            model.train(1, harness.dataset_of(batches), dataset_sink_mode=False)
            return finished()
        return net, train
    if name == "driver":
        trainer = ms_accum.GradientAccumulation(net, loss, optimizer)

        def train(batches):
            trainer.train_process(1, harness.dataset_of(batches), steps, ckpt_path=None, log_every=0)
            return finished()
        return net, train
    if name == "model-accu":
        model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer,
                                                                gradient_accumulation_steps=steps))

        def train(batches):
            model.train(1, harness.dataset_of(batches), dataset_sink_mode=False)
            return finished()
        return net, train
    if name == "three-cells":
        forward_backward, optim, clear = harness.three_cells(net, loss, optimizer)

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
    elif name in ("tutorial-two-graphs", "checked-two-graphs"):
        micro_step, window_end = harness.two_graph_steps(nn.WithLossCell(net, loss), optimizer, steps,
                                                         checked=name == "checked-two-graphs")

        def train_step(x, y, index):
            micro_step(x, y)
            if index % steps == steps - 1:
                window_end()
    else:
        jitted = harness.jit_step("tutorial-checked" if name == "checked-one-graph" else name,
                                  nn.WithLossCell(net, loss), optimizer, steps)

        def train_step(x, y, _):
            jitted(x, y)

    def train(batches):
        for index, (x, y) in enumerate(harness.dataset_of(batches).create_tuple_iterator(num_epochs=1)):
            train_step(x, y, index)
        return finished()
    return net, train


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
    batches = harness.random_batches(args, args.first_windows * args.steps, seed=1)
    result = {"peer": args.start_up}
    try:
        net, train = make_peer(args.start_up, args)
        initial = parameters(net)
        began = time.perf_counter()
        if args.where:
            _, result["where"] = harness.where_the_time_goes(lambda: train(batches[:args.steps]))
        else:
            train(batches[:args.steps])
        result["first_update_s"] = time.perf_counter() - began
        after_first = parameters(net)
        train(batches[args.steps:])
        result["first_windows_s"] = time.perf_counter() - began
        result["distance"] = update_distance(after_first, initial, large_batch_update(args, batches[:args.steps]))
    except Exception as error:  # pylint: disable=broad-except  (a peer that fails is reported, not hidden)
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    harness.report(result)


def start_ups(args, argv):
    """--starts fresh processes per peer, alternating peers; every process's result."""
    def start(peer):
        result = harness.run_child(__file__, [*argv, "--start-up", peer], timeout=1800)
        print(f"start-up {peer}: {result}", flush=True)
        return result
    return harness.take_turns(args.peers, args.starts, start)


def steady(args):
    """Blocks of --windows windows per peer in turn, --rounds times, in this process; per peer the block ratios to
    the neighbouring baseline block (TrainStep, or the first peer that runs) and the baseline's window time."""
    trainers, failed = {}, {}
    warm = harness.random_batches(args, args.steps, seed=2)
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
    data = harness.random_batches(args, args.windows * args.steps, seed=3)
    blocks = harness.rotate({peer: lambda train=train: harness.wall_and_cpu(lambda: train(data))[0]
                             for peer, train in trainers.items()}, args.rounds)
    ratios = {peer: [b / t for b, t in zip(blocks[baseline], times)] for peer, times in blocks.items()}
    return baseline, statistics.median(blocks[baseline]) / args.windows, ratios, failed


def table(args, starts, baseline, window_s, ratios, failed):
    """The peers' start-up, steady speed and distance."""
    size = {"block": "64 x 256 inputs", "lenet": "1 x 32 x 32"}.get(args.model, f"{args.image_size}x{args.image_size}")
    print(f"\n{args.model}, {size}, micro-batch {args.micro_batch} x {args.steps}, "
          f"{args.mode.upper()} mode; steady blocks of {args.windows} windows x {args.rounds} rounds, baseline "
          f"{baseline} at {window_s:.3f} s per window; start-up medians of {args.starts} processes\n")
    rows = []
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
        row = (peer + note, first, windows, speed, distance)
        if args.where:
            row += tuple(f"{statistics.median(r['where'][key] for r in runs):{form}}" if runs else "-"
                         for key, form in (("compile_s", ".1f"), ("graphs", ".0f"), ("ms_accum_s", ".3f")))
        rows.append(row)
    header = ("peer", "first update, compile included (s)", f"first {args.first_windows} windows (s)",
              f"steady speed vs {baseline} (median, range)", "update distance from the large batch")
    if args.where:
        header += ("first update: compiling (s)", "graphs compiled", "first update: ms_accum's Python (s)")
    harness.print_table(header, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=harness.model_name, default="edgenext_xx_small",
                        help="a mindcv.create_model name, 'block' or 'lenet'")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update, N")
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--first-windows", type=int, default=4)
    parser.add_argument("--windows", type=int, default=4, help="windows per steady block")
    parser.add_argument("--rounds", type=int, default=8, help="steady blocks per peer")
    parser.add_argument("--starts", type=harness.argtypes().non_negative_int, default=3,
                        help="fresh start-up processes per peer (0: none)")
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ", ".join(PEERS))
    parser.add_argument("--where", action="store_true",
                        help="profile each first update: the seconds compiling, the graphs compiled and the seconds "
                             "in ms_accum's own Python (the profiler slows Python, so its first updates are not "
                             "comparable with unprofiled runs)")
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
    harness.start_mindspore(args.mode)
    if args.start_up:
        start_up(args)
        return
    starts = start_ups(args, argv) if args.starts else {}
    baseline, window_s, ratios, failed = steady(args)
    table(args, starts, baseline, window_s, ratios, failed)


if __name__ == "__main__":
    main()
