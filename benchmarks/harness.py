"""What the benchmarks share, written once: MindSpore on CPU with train.py's defaults, the fresh-process runner
(a child command per configuration, configurations taking turns, a JSON result a run), the in-process rotation of
blocks, timing and peak-memory helpers, the models, data and training steps the benchmarks train, and the
Markdown table they print.

A benchmark is a script beside this module (``benchmarks/``; ``benchmarks/lab/`` holds one-off probes) that imports
it and never another benchmark. Importing it loads no MindSpore: it puts the repository and ``model_zoo_lenet``
on ``sys.path``, and each function imports what it needs.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(ROOT, "model_zoo_lenet")
SAMPLE = os.path.join(ZOO, "data", "fashion_mnist_sample")
sys.path.insert(0, ZOO)
sys.path.insert(0, ROOT)


def start_mindspore(mode):
    """Apply train.py's CPU defaults (before MindSpore loads), then set the CPU device and `mode`."""
    from src.cpu_speed import apply_env_defaults, set_mode  # pylint: disable=import-outside-toplevel
    apply_env_defaults()
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    ms.set_device("CPU")
    set_mode(mode)


# ------------------------------------------------------------------------------------------- fresh processes
RESULT = "RESULT "  # the line a child prints its result on


def report(result):
    """Print `result` (a dict) as a child's result line, for :func:`run_child`."""
    print(RESULT + json.dumps(result), flush=True)


def run_child(script, argv, env=None, timeout=None):
    """Run `script` with `argv` in a fresh Python process (this interpreter, environment `env` or this one's) and
    return the dict of the last result line it printed (:func:`report`); raise RuntimeError, with the ends of its
    output, if it exits non-zero or prints none."""
    done = subprocess.run([sys.executable, os.path.abspath(script), *map(str, argv)], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines:
        raise RuntimeError(f"{os.path.basename(script)} {' '.join(map(str, argv))}: exited {done.returncode}\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


def take_turns(jobs, repeats, measure):
    """{job: [measure(job), one a round]} over `repeats` rounds, each round every job of `jobs` once in order: a
    slow spell of a shared machine hits them all."""
    results = {job: [] for job in jobs}
    for _ in range(repeats):
        for job in jobs:
            results[job].append(measure(job))
    return results


# ----------------------------------------------------------------------------------------------------- timing
def rotate(runners, rounds, shift=False):
    """{label: [runner(), one a round]} over `rounds` rounds in this process, each round every runner of `runners`
    ({label: function}) once; with `shift` each round starts one runner later than the one before."""
    order = list(runners)
    results = {label: [] for label in order}
    for index in range(rounds):
        start = index % len(order) if shift else 0
        for label in order[start:] + order[:start]:
            results[label].append(runners[label]())
    return results


def wall_and_cpu(run):
    """(wall seconds, this process's CPU seconds, all threads) of run()."""
    start, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - start, time.process_time() - cpu


def timed(update, seconds, warmup):
    """Samples per second of update(k), which returns the samples it trained on, after `warmup` updates."""
    for k in range(warmup):
        update(k)
    samples, updates, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        samples += update(warmup + updates)
        updates += 1
    return samples / (time.perf_counter() - start)


def timed_epochs(run, seconds, samples):
    """Samples per second of run(epochs), an epoch `samples`: one epoch first (the warm-up, which also sizes the
    run), then as many epochs as take about `seconds`."""
    start = time.perf_counter()
    run(1)
    epochs = max(1, round(seconds / (time.perf_counter() - start)))
    start = time.perf_counter()
    run(epochs)
    return epochs * samples / (time.perf_counter() - start)


def spread(values):
    """(median, lower quartile, upper quartile) of `values`; one value is all three."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    quartiles = statistics.quantiles(values, n=4)
    return statistics.median(values), quartiles[0], quartiles[2]


def where_the_time_goes(run):
    """Run `run()` under Python's profiler; return (what it returned, a dict): ``compile_s``, the seconds in
    MindSpore's graph compiler (its C++ compile calls, with the Python they call back, such as its parser);
    ``graphs``, how many graphs it compiled; ``ms_accum_s``, the seconds in ms_accum's own Python (its checks,
    records and compile-cache guard around the graphs; callees outside ms_accum not included); ``total_s``. The
    rest of ``total_s`` is MindSpore running the graphs and the Python around them. The profiler slows Python, not
    the compiler's C++: the figures are for where the time goes, not for comparison with unprofiled runs."""
    import cProfile  # pylint: disable=import-outside-toplevel
    import pstats  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    package = os.path.dirname(os.path.abspath(ms_accum.__file__)) + os.sep
    profile = cProfile.Profile()
    began = time.perf_counter()
    result = profile.runcall(run)
    found = {"total_s": time.perf_counter() - began, "compile_s": 0.0, "graphs": 0, "ms_accum_s": 0.0}
    for (filename, _, name), (_, calls, own, cumulative, _) in pstats.Stats(profile).stats.items():
        if filename == "~" and "_c_expression" in name and name.endswith(".compile>"):
            found["compile_s"] += cumulative
            found["graphs"] += calls
        elif os.path.abspath(filename).startswith(package):
            found["ms_accum_s"] += own
    return result, found


PHASE_LINE = re.compile(r"^( {0}| {4})\[([a-z_0-9]+)\]: ([0-9.e+-]+)")


def profile_compiles():
    """Turn MindSpore's compile profile on for this process: before its first graph, as MindSpore reads the switch
    once. Each graph compiled after it prints its phases on standard output (see :func:`compile_phases`)."""
    from ms_accum.compat import compile_config  # pylint: disable=import-outside-toplevel
    compile_config().COMPILE_PROFILE = "1"


def compile_phases(run):
    """Run `run()`; return (what it returned, {phase: seconds}) of the last graph it compiled, from MindSpore's
    compile profile (on since :func:`profile_compiles`; an empty dict if `run` compiled nothing or the profile is
    off): ``total`` and MindSpore's own phases, the top ones (``type_inference``, ``optimize``, ``task_emit``, ...)
    and the passes within each as ``<phase>.<pass>`` (``optimize.opt_a``). The profile is MindSpore's C++ printing
    on this process's standard output, which is taken aside while `run` runs."""
    import tempfile  # pylint: disable=import-outside-toplevel
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+") as aside:
        os.dup2(aside.fileno(), 1)
        try:
            result = run()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        aside.seek(0)
        text = aside.read()
    block = text.rsplit("TotalTime = ", 1)
    if len(block) < 2:
        return result, {}
    phases, parent = {"total": float(block[1].split(",", 1)[0].split()[0])}, None
    for line in block[1].splitlines()[1:]:
        found = PHASE_LINE.match(line)
        if found is None:
            continue
        indent, name, seconds = found.groups()
        if not indent:
            parent = name
            phases[name] = float(seconds)
        elif parent is not None:
            phases[f"{parent}.{name}"] = float(seconds)
    return result, phases


# ----------------------------------------------------------------------------------------------------- memory
def rss_mib():
    """This process's resident memory now, MiB."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def peak_mib():
    """This process's peak resident memory (VmHWM), MiB; not ru_maxrss, which carries the peak of the process that
    started this one."""
    from ms_accum.trainers.planner import resident_peak  # pylint: disable=import-outside-toplevel
    return resident_peak() / 2 ** 20


def copy_mib_of(net):
    """MiB of one float32 copy of `net`'s trainable parameters: the unit of the memory figures."""
    return sum(int(np.prod(p.shape)) for p in net.trainable_params()) * 4 / 2 ** 20


# ------------------------------------------------------------------------------------------------------- data
def sample_arrays(count=None):
    """The bundled Fashion-MNIST sample's training images as train.py prepares them (float32 N x 1 x 32 x 32,
    normalised) and their int32 labels, in file order; repeated to `count` samples when given."""
    from src.dataset import create_dataset  # pylint: disable=import-outside-toplevel
    sample = create_dataset(SAMPLE, 1000, "train", shuffle=False)
    pairs = list(sample.create_tuple_iterator(num_epochs=1, output_numpy=True))
    images, labels = np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])
    if count is not None:
        reps = -(-count // len(images))
        images, labels = np.tile(images, (reps, 1, 1, 1))[:count], np.tile(labels, reps)[:count]
    return images, labels


TEXT_VOCAB = 50000


def random_batches(args, count, seed):
    """`count` micro-batches (inputs, int32 labels) of ``args.micro_batch`` for ``args.model`` from a generator
    seeded with `seed`: token ids for 'text', normal float32 inputs otherwise (64 x 256 for 'block', 1 x 32 x 32
    for 'lenet', 1024 for 'mlp' and 'tiny', 3 x ``args.image_size`` squared for a MindCV model)."""
    rng = np.random.default_rng(seed)
    size = args.micro_batch
    if args.model == "text":  # 64 token ids per sample
        return [(rng.integers(0, TEXT_VOCAB, size=(size, 64)).astype(np.int32),
                 rng.integers(0, args.classes, size=size).astype(np.int32)) for _ in range(count)]
    shape = {"block": (size, 64, 256), "lenet": (size, 1, 32, 32), "mlp": (size, 1024), "tiny": (size, 1024)}.get(
        args.model, (size, 3, args.image_size, args.image_size))
    return [(rng.normal(size=shape).astype(np.float32), rng.integers(0, args.classes, size=size).astype(np.int32))
            for _ in range(count)]


def dataset_of(batches):
    """A MindSpore dataset ('image', 'label') of the micro-batches `batches`, in order, batched as they are."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    images, labels = np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])
    return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(len(batches[0][1]))


def window_of(batches, k, n):
    """The k-th run of `n` consecutive items of `batches`, cycling through them."""
    return [batches[(k * n + s) % len(batches)] for s in range(n)]


# ----------------------------------------------------------------------------------------------------- models
def plain_parts(net):
    """(`net`, sparse softmax cross-entropy, Momentum(0.01, 0.9)): the plain training of LeNet5 and the MLPs."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    return (net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9))


def lenet_parts():
    """A fresh (LeNet5, loss, optimizer)."""
    from src.lenet import LeNet5  # pylint: disable=import-outside-toplevel
    return plain_parts(LeNet5())


def wide_mlp(width, inputs=1024, classes=10, flatten=False):
    """The wide MLP inputs -> width -> width -> classes (ReLU), behind a Flatten with `flatten`: at width 2048,
    6.3 million parameters and the least compute per parameter."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    layers = [nn.Dense(inputs, width), nn.ReLU(), nn.Dense(width, width), nn.ReLU(), nn.Dense(width, classes)]
    return nn.SequentialCell(([nn.Flatten()] if flatten else []) + layers)


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


def build(model, classes, width=2048, optimizer="mindcv"):
    """(network, loss, optimizer), seeded (the same initial weights every time). `model`: 'block' (the transformer
    block model), 'lenet' (LeNet5), 'mlp' (the wide MLP at `width`), 'tiny' (an MLP 1024-16-classes: 64 KiB of
    parameters), 'text' (the text model) or a MindCV model name. `optimizer`: 'mindcv' (MindCV's momentum with
    weight decay and its label-smoothed cross-entropy) or 'momentum' (``nn.Momentum`` and the plain
    cross-entropy)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    import mindcv  # pylint: disable=import-outside-toplevel
    ms.set_seed(0)
    if model == "block":
        net = block_model(classes)
    elif model == "lenet":
        from src.lenet import LeNet5  # pylint: disable=import-outside-toplevel
        net = LeNet5(num_class=classes)
    elif model == "mlp":
        net = wide_mlp(width, classes=classes)
    elif model == "tiny":
        net = nn.SequentialCell(nn.Dense(1024, 16), nn.ReLU(), nn.Dense(16, classes))
    elif model == "text":
        net = text_model(classes)
    else:
        net = mindcv.create_model(model, num_classes=classes)
    if optimizer == "momentum":
        return plain_parts(net)
    loss = mindcv.create_loss(name="CE", label_smoothing=0.1)
    return net, loss, mindcv.create_optimizer(net.trainable_params(), opt="momentum", lr=0.01, momentum=0.9,
                                              weight_decay=1e-4)


# ------------------------------------------------------------------------------------------------------ steps
def three_cells(net, loss, optimizer):
    """(TrainForwardBackward, TrainOptim, TrainClear) on fresh grad_sum buffers."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
    return (ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), optimizer, grad_sum),
            ms_accum.TrainOptim(optimizer, grad_sum), ms_accum.TrainClear(grad_sum))


def plain_step(net, loss, optimizer):
    """nn.TrainOneStepCell over the loss network."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    return nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)


def plain_and_three_cells():
    """(plain TrainOneStepCell, TrainForwardBackward, TrainOptim, TrainClear), on two separate fresh LeNet5s."""
    return (plain_step(*lenet_parts()),) + three_cells(*lenet_parts())


def dataset_trainer(config, steps):
    """run(dataset, epochs) for the dataset-fed configurations, each on a fresh LeNet, with a TimeMonitor callback:
    'plain-b-data' (`Model.train` over `TrainOneStepCell`), 'driver' (`GradientAccumulation.train_process`) or
    'model-accu' (`Model_ACCU.train` over `TrainAccuStepsCell`), the last two with N = `steps`."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    net, loss, opt = lenet_parts()
    callbacks = [ms.train.TimeMonitor()]
    if config == "driver":
        trainer = ms_accum.GradientAccumulation(net, loss, opt)

        def run(dataset, epochs):
            trainer.train_process(epochs, dataset, steps, ckpt_path=None, log_every=0, callbacks=callbacks)
        return run
    if config == "model-accu":
        model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt,
                                                                accumulation_steps=steps))
    elif config == "plain-b-data":
        model = ms.train.Model(plain_step(net, loss, opt))
    else:
        raise ValueError(f"'config' must be 'plain-b-data', 'driver' or 'model-accu', but got {config!r}.")

    def run(dataset, epochs):
        model.train(epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    return run


def plain_updates(step, window):
    """One plain step per (inputs...) tuple of `window`; returns when the last one has finished."""
    for batch in window:
        out = step(*batch)
    out.asnumpy()


def accumulated_update(cells, window):
    """One update of the three cells (forward_backward, optim, clear) over `window`, reading its loss back."""
    forward_backward, optim, clear = cells
    for batch in window:
        forward_backward(*batch)
    optim().asnumpy()
    clear()


TUTORIAL_CLIP_NORM = 1.0


def step_parts(name, loss_net, optimizer, steps):
    """What the MindSpore 2.x training step of `name` ("tutorial", "tutorial-clip", "tutorial-checked" or
    "accumulator") runs per micro-batch: (the value_and_grad function, the accumulator, whether the accumulator
    takes the micro-batch's size). The tutorial divides the loss by N and calls its accumulator with the gradients
    ("tutorial-clip": the window's gradient clipped by MindSpore's ``ops.clip_by_global_norm`` before the
    optimizer, a pass over it as ms_accum's gradient norm is; "tutorial-checked": its window's end is
    :func:`checked_window_end`'s); ms_accum's takes the mean loss and ``Accumulator(grads, num_items)``."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    loss_net.set_train(True)
    if name in ("tutorial", "tutorial-clip", "tutorial-checked"):
        def divided_loss(x, y):
            return loss_net(x, y) / steps
        tutorial = _tutorial_class()(optimizer, steps, TUTORIAL_CLIP_NORM if name == "tutorial-clip" else None,
                                     checked=name == "tutorial-checked")
        return ms.value_and_grad(divided_loss, None, optimizer.parameters), tutorial, False
    return ms.value_and_grad(loss_net, None, optimizer.parameters), ms_accum.Accumulator(optimizer, steps), True


def step_cell(name, loss_net, optimizer, steps):
    """The MindSpore 2.x training step of `name` (see :func:`step_parts`) as a Cell: value_and_grad and the
    accumulator in one graph, called once per micro-batch (and compilable before it runs)."""
    from mindspore import nn, ops  # pylint: disable=import-outside-toplevel

    class Step(nn.Cell):
        """value_and_grad and the accumulator in one graph."""

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.grad_fn, self.accumulator, self.weighted = step_parts(name, loss_net, optimizer, steps)

        def construct(self, x, y):
            loss_value, grads = self.grad_fn(x, y)
            if self.weighted:  # a constant when compiled: no branch in the graph
                return ops.depend(loss_value, self.accumulator(grads, x.shape[0]))
            return ops.depend(loss_value, self.accumulator(grads))
    return Step()


def jit_step(name, loss_net, optimizer, steps):
    """The MindSpore 2.x training step of `name` (see :func:`step_parts`): value_and_grad and the accumulator
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


def two_graph_steps(loss_net, optimizer, steps, checked=False):
    """The tutorial's accumulation in two ``ms.jit`` functions: (value_and_grad of loss / N and the addition into
    the buffers, per micro-batch; the optimizer on the buffers and their reset from zeros, per window). The
    gradient function and the buffers are the tutorial step's own (:func:`step_parts`). With `checked` the
    window's end is :func:`checked_window_end`'s."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import ops  # pylint: disable=import-outside-toplevel
    grad_fn, tutorial, _ = step_parts("tutorial-checked" if checked else "tutorial", loss_net, optimizer, steps)

    @ms.jit
    def micro_step(x, y):
        loss_value, grads = grad_fn(x, y)
        return ops.depend(loss_value, tutorial.map(ops.partial(ops.assign_add), tutorial.inner_grads, grads))

    if not checked:
        @ms.jit
        def window_end():
            done = optimizer(tutorial.inner_grads)
            return ops.depend(done, tutorial.map(ops.partial(ops.assign), tutorial.inner_grads, tutorial.zeros))
        return micro_step, window_end

    @ms.jit
    def checked_end():
        return tutorial.checked_end()
    return micro_step, checked_end


def checked_window_end():
    """A function (hyper_map, buffers, optimizer, divisor, last_norm) -> a Tensor once done: a window's end that
    does what ms_accum's must for its promises, written with MindSpore and the per-parameter helpers of
    ``ms_accum/core/grad_ops.py`` only (no engine): the gradient's global norm (no temporary of a parameter's
    size) into `last_norm`, the buffers divided in place by the run-time `divisor`, the optimizer in a run-time
    branch that a non-finite norm skips, and the buffers cleared one after another instead of from a zeros copy
    (one parameter's zeros at a time). The start-up floor of docs/performance.md."""
    from mindspore import ops  # pylint: disable=import-outside-toplevel
    from ms_accum.core import grad_ops  # pylint: disable=import-outside-toplevel

    def end(hyper_map, buffers, optimizer, divisor, last_norm):
        inverse = 1.0 / divisor
        norm = grad_ops.global_norm(hyper_map, buffers) * inverse
        done = ops.depend(inverse, hyper_map(ops.partial(grad_ops.scale_in_place, inverse), buffers))
        done = ops.depend(done, ops.assign(last_norm, norm))
        if ops.isfinite(last_norm):
            done = ops.depend(done, optimizer(buffers))
        return ops.depend(done, grad_ops.clear_in_turn(buffers, done))
    return end


def _tutorial_class():
    """The tutorial's class (defined once MindSpore has loaded with the CPU settings)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Parameter, Tensor, ops  # pylint: disable=import-outside-toplevel

    @ms.jit_class
    class _Tutorial:
        """The MindSpore tutorial's accumulator: buffers and a zeros copy beside the parameters, a counter from 1,
        the optimizer stepped on the summed (loss / N) gradients every N-th call (clipped by their global norm with
        a `clip_norm`), the buffers reset from zeros. With `checked`, the window's end is
        :func:`checked_window_end`'s (a divisor of 1: the loss is divided by N already), without the zeros copy."""

        def __init__(self, optimizer, steps, clip_norm=None, checked=False):
            self.optimizer = optimizer
            self.clip_norm = clip_norm
            self.inner_grads = optimizer.parameters.clone(prefix="accumulate_", init="zeros")
            self.zeros = None if checked else optimizer.parameters.clone(prefix="zeros_", init="zeros")
            self.end = checked_window_end() if checked else None
            self.divisor = Parameter(Tensor(1.0, ms.float32), "checked_divisor") if checked else None
            self.last_norm = Parameter(Tensor(0.0, ms.float32), "checked_last_norm") if checked else None
            self.counter = Parameter(Tensor(1, ms.int32), "counter_")
            self.steps = steps
            self.map = ops.HyperMap()

        def checked_end(self):
            """The checked window's end on the buffers."""
            return self.end(self.map, self.inner_grads, self.optimizer, self.divisor, self.last_norm)

        def __call__(self, grads):
            self.map(ops.partial(ops.assign_add), self.inner_grads, grads)
            if self.counter % self.steps == 0:
                if self.end is not None:  # a constant when compiled: the tutorial's own graph is unchanged
                    self.checked_end()
                else:
                    if self.clip_norm is None:
                        self.optimizer(self.inner_grads)
                    else:
                        self.optimizer(ops.clip_by_global_norm(self.inner_grads, self.clip_norm))
                    self.map(ops.partial(ops.assign), self.inner_grads, self.zeros)
            ops.assign_add(self.counter, Tensor(1, ms.int32))
            return True
    return _Tutorial


# ------------------------------------------------------------------------- the memory benchmarks' children
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
    return {config: its result}; a configuration that fails is reported and left out, or with `strict` raises."""
    if args.child:
        child_main(args.child, args)
        return None
    names = ("model", "image_size", "micro_batch", "steps", "windows", "classes", "width", "optimizer") + tuple(extra)
    results = {}
    for config in args.configs.split(","):
        try:
            results[config] = run_child(script, ["--child", config] + [f"--{n}={getattr(args, n)}" for n in names])
        except RuntimeError as error:
            if strict:
                raise
            print(f"{os.path.basename(script)}: {config} failed: {error}", flush=True)
    return results


# -------------------------------------------------------------- the cost benchmarks: drivers in one process
def driver_runners(parts, variants, images, labels, batch, steps):
    """{label: run()}, one fresh ``GradientAccumulation`` on fresh ``parts()`` per variant of `variants` ({label:
    its keyword arguments}), each training one epoch of its own dataset of the micro-batches of `images` and
    `labels` per call and returning its (wall, CPU) seconds."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    runners = {}
    for label, kwargs in variants.items():
        trainer = ms_accum.GradientAccumulation(*parts(), **kwargs)
        dataset = ds.NumpySlicesDataset({"x": images, "y": labels}, shuffle=False).batch(batch)

        def run(trainer=trainer, dataset=dataset):
            losses = []

            def epoch():
                losses.extend(trainer.train_process(1, dataset, steps, ckpt_path=None, log_every=0))  # read: done
            elapsed = wall_and_cpu(epoch)
            assert len(losses) == dataset.get_dataset_size() // steps
            return elapsed
        runners[label] = run
    return runners


def compare_runners(name, args, runners, baselines):
    """Print the median ratios and quartiles over --pairs rounds in which every runner of `runners` ({label: a
    function returning (wall, CPU) seconds of a block of --windows windows}) runs once, in rotating order: the
    time of each label of `baselines` ({label: its baseline's label}) over its baseline's in the same round. The
    first baseline's window time is printed too."""
    for run in runners.values():
        run()  # compile
    times = rotate(runners, args.pairs, shift=True)
    first = next(iter(baselines.values()))
    window = statistics.median(wall for wall, _ in times[first]) / args.windows
    print(f"{name} ({args.pairs} rounds of {args.windows} windows of {args.steps} x {args.batch}; a window with "
          f"{first} takes {1000 * window:.1f} ms):", flush=True)
    for label, baseline in baselines.items():
        for clock in (0, 1):
            median, low, high = spread([t[clock] / b[clock] for t, b in zip(times[label], times[baseline])])
            print(f"  {label} / {baseline}, {('wall', 'CPU')[clock]} time = {median:.3f} "
                  f"(quartiles {low:.3f}-{high:.3f})", flush=True)


def cost_arguments(doc, models, min_steps, why_min_steps=""):
    """The cost benchmarks' command line: (arguments, the names of --models among `models`), checked, MindSpore
    started in --mode."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="lenet,mlp",
                        help=f"comma-separated: {', '.join(models)} (default: %(default)s)")
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=12, help="rounds of rotating blocks (default: %(default)s)")
    parser.add_argument("--windows", type=int, default=20, help="windows per block (default: %(default)s)")
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = [m for m in names if m not in models]
    if unknown:
        parser.error(f"--models must name models among {sorted(models)}, but got {unknown}.")
    if min(args.batch, args.steps, args.pairs, args.windows) < 1 or args.steps < min_steps:
        parser.error(f"--batch, --pairs and --windows must be >= 1 and --steps >= {min_steps}{why_min_steps}.")
    start_mindspore(args.mode)
    return args, names


def resnet18_parts():
    """A fresh (MindCV's ResNet18 on 1 x 32 x 32 images and 10 classes, loss, optimizer): 11.2 million parameters
    under convolutions, much compute per parameter, as in most image models."""
    import mindcv  # pylint: disable=import-outside-toplevel
    return plain_parts(mindcv.create_model("resnet18", num_classes=10, in_channels=1))


COST_MODELS = {"lenet": lenet_parts, "mlp": lambda: plain_parts(wide_mlp(2048, flatten=True)),
               "resnet18": resnet18_parts}


# ---------------------------------------------------------------------------------------------------- PyTorch
def torch_lenet_update(config, images, labels, batch, steps):
    """update(k): the k-th update of `config` ('torch-plain-b', 'torch-accum' or 'torch-plain-Nb') on
    model_zoo_lenet's LeNet5 written in PyTorch (SGD with momentum 0.9), b*N samples, finished when it returns;
    it returns b*N. Accumulation follows PyTorch's usual recipe: loss / N backward per micro-batch, one step and
    zero_grad per window. Needs the optional group ``torch`` (``pip install -e .[torch]``)."""
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel

    class LeNet5(nn.Module):
        """model_zoo_lenet/src/lenet.py in PyTorch: two valid 5x5 convolutions, 2x2 max pooling, three dense
        layers."""

        def __init__(self, num_class=10):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.pool = nn.MaxPool2d(2, 2)
            self.fc1 = nn.Linear(16 * 5 * 5, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, num_class)

        def forward(self, x):
            x = self.pool(torch.relu(self.conv1(x)))
            x = self.pool(torch.relu(self.conv2(x)))
            x = torch.flatten(x, 1)
            return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

    net = LeNet5()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    size = batch * steps if config == "torch-plain-Nb" else batch
    xs = [torch.from_numpy(images[i:i + size]) for i in range(0, len(images), size)]
    ys = [torch.from_numpy(labels[i:i + size]).long() for i in range(0, len(labels), size)]
    per_update = 1 if config == "torch-plain-Nb" else steps
    accumulate = config == "torch-accum"

    def update(k):
        for s in range(per_update):
            index = (k * per_update + s) % len(xs)
            if not accumulate:
                optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(xs[index]), ys[index])
            (loss / steps if accumulate else loss).backward()
            if not accumulate:
                optimizer.step()
        if accumulate:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        loss.item()
        return batch * steps
    return update


# ------------------------------------------------------------------------------------------------------ output
def print_table(header, rows):
    """A Markdown table: the `header` cells, then one line per row of `rows` (cells already formatted)."""
    print("| " + " | ".join(header) + " |")
    print("|---" * len(header) + "|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
