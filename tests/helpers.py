"""Small models, data, reference training and script runners used by several test modules."""
import atexit
import copy
import functools
import hashlib
import inspect
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn, ops
from mindspore.train import Callback

import ms_accum
from ms_accum.core.noise_scale import NOISE_SMOOTHING
from conftest import ROOT, ZOO


class SmallConvNet(nn.Cell):
    """A conv + dense classifier small enough to compile in a second."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, pad_mode="valid", has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(3 * 4 * 4, 4)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


class ConvPoolNet(nn.Cell):
    """Conv2d 3->8 3x3 ('same'), ReLU, MaxPool2d 2, Flatten, Dense 2048->10: input 3x32x32."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, has_bias=True)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(2048, 10)

    def construct(self, x):
        return self.fc(self.flatten(self.pool(self.relu(self.conv(x)))))


class TokenClassifier(nn.Cell):
    """Token ids (B, T) below 20 -> an embedding's mean over the tokens -> 3 logits: the check command's token
    network."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(20, 6)
        self.fc = nn.Dense(6, 3)

    def construct(self, ids):
        return self.fc(self.embedding(ids).mean(1))


class BatchNormNet(nn.Cell):
    """BatchNorm in training mode: micro-batch statistics make accumulation differ from the large batch."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(36, 8)
        self.bn = nn.BatchNorm1d(8)
        self.head = nn.Dense(8, 4)

    def construct(self, x):
        return self.head(self.bn(self.fc(x.reshape(x.shape[0], -1))))


OPTIMIZERS = {
    "sgd": lambda params: nn.SGD(params, learning_rate=0.1),
    "momentum": lambda params: nn.Momentum(params, learning_rate=0.1, momentum=0.9),
    "adam": lambda params: nn.Adam(params, learning_rate=0.01),
    "adamw": lambda params: nn.AdamWeightDecay(params, learning_rate=0.01, weight_decay=0.01),
}


# ------------------------------------------------------------------ the references, computed once a process
def _digest(value, digest):
    """Feed `value` (nested lists and tuples of arrays, Tensors and plain values) into `digest`, shapes and dtypes
    included; False for anything else (an object's repr may name only its address, which a later object can take)."""
    if isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__}{len(value)}(".encode())
        return all(_digest(part, digest) for part in value)
    if isinstance(value, (np.ndarray, Tensor, np.generic)):
        array = np.ascontiguousarray(value.asnumpy() if isinstance(value, Tensor) else value)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
        return True
    if value is None or isinstance(value, (str, int, float)):
        digest.update(f"{type(value).__name__}:{value!r};".encode())
        return True
    return False


def _reference_key(signature, args, kwargs):
    """What a reference run depends on: its arguments by name (the data by content);
    a function by its name, a ``functools.partial`` by its function and arguments; None where that cannot be told
    (an argument that is a lambda, a function defined inside another or a partial of one, or an object other than
    data: two of them may differ and look alike to any key)."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    parts = []
    for name, value in bound.arguments.items():
        value = _argument_key(value)
        if value is _UNKEYED:
            return None
        parts.append((name, value))
    digest = hashlib.sha256()
    return digest.hexdigest() if _digest(parts, digest) else None


_UNKEYED = object()  # a function the key cannot tell apart from another (None is data)


def _argument_key(value):
    """Data as it is (:func:`_digest` keys it by content); a function by its module and qualified name; a
    ``functools.partial`` by its function's key and its arguments'; _UNKEYED for a lambda, a function defined inside
    another, or a partial of or holding one."""
    if not callable(value) or isinstance(value, (Tensor, np.ndarray)):
        return value
    if isinstance(value, functools.partial):
        keys = [_argument_key(part) for part in (value.func, *value.args, *value.keywords.values())]
        return _UNKEYED if any(key is _UNKEYED for key in keys) else ("partial", tuple(keys), tuple(value.keywords))
    qualname = getattr(value, "__qualname__", "<unnamed>")
    return _UNKEYED if "<" in qualname else f"{value.__module__}.{qualname}"


def in_pynative(function, *args, **kwargs):
    """`function(*args, **kwargs)` run in PYNATIVE_MODE, the mode set before restored."""
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        return function(*args, **kwargs)
    finally:
        ms.set_context(mode=mode)


def computed_once(function):
    """A reference function whose result a process computes once for the same arguments: the tests of a file ask
    the same large batch of every path, mode and trainer they check. It runs in PYNATIVE_MODE whatever the test's
    mode (a large-batch step is the same step in either, and in GRAPH_MODE each reference compiled graphs of its
    own), so a test's GRAPH and PYNATIVE cases share it. The reference stays written without
    ms_accum; a caller gets a copy it may change."""
    results = {}  # what `function` returned, by what it depends on (see _reference_key)
    signature = inspect.signature(function)

    @functools.wraps(function)
    def once(*args, **kwargs):
        key = _reference_key(signature, args, kwargs)
        if key is None:
            return in_pynative(function, *args, **kwargs)
        if key not in results:
            results[key] = in_pynative(function, *args, **kwargs)
        return copy.deepcopy(results[key])
    return once


def build(optimizer="momentum", seed=0):
    """A fresh SmallConvNet, its loss and optimizer, identical for the same seed."""
    ms.set_seed(seed)
    net = SmallConvNet()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return net, loss, OPTIMIZERS[optimizer](net.trainable_params())


def micro_batches(sizes, seed=1):
    """One (images, labels) numpy pair per size."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(b, 1, 6, 6)).astype(np.float32), rng.integers(0, 4, size=b).astype(np.int32))
            for b in sizes]


def concat(batches):
    """The large batch made of `batches`."""
    return np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])


def windows_of_sizes(batches, sizes):
    """`batches` cut into consecutive windows of the given sizes."""
    out, start = [], 0
    for size in sizes:
        out.append(batches[start:start + size])
        start += size
    return out


def jit_accumulator_step(loss_net, optimizer, accumulator):
    """A user's ``ms.jit`` train step around `accumulator`: value_and_grad of `loss_net` over the optimizer's
    parameters, the gradients and the micro-batch's samples handed to it; returns whether the window ended."""
    grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters)

    @ms.jit
    def step(x, y):
        _, grads = grad_fn(x, y)
        return accumulator(grads, x.shape[0])
    return step


def params_of(net):
    """name -> numpy copy of every parameter."""
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


@computed_once
def reference_run(optimizer, windows, seed=0, make=None):
    """Plain large-batch training: one TrainOneStepCell step per window on its concatenated micro-batches; (the
    parameters, each window's loss: the mean over its samples, at the parameters before its step). `make(optimizer,
    seed)` builds (network, loss, optimizer) instead of :func:`build`."""
    net, loss, opt = (make or build)(optimizer, seed)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    losses = [float(step(*map(Tensor, concat(window))).asnumpy()) for window in windows]
    return params_of(net), losses


def reference_train(optimizer, windows, seed=0, make=None):
    """The parameters after :func:`reference_run`."""
    return reference_run(optimizer, windows, seed, make)[0]


def accumulate_train(optimizer, windows, seed=0, average=True):
    """The three ms_accum cells: every micro-batch of a window, one optimizer step, clear."""
    net, loss, opt = build(optimizer, seed)
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), opt, grad_sum, average=average)
    optim, clear = ms_accum.TrainOptim(opt, grad_sum, average=average), ms_accum.TrainClear(grad_sum)
    for window in windows:
        for x, y in window:
            forward_backward(Tensor(x), Tensor(y))
        optim()
        clear()
    return params_of(net), opt


def assert_params_equal(got, expected, context=""):
    """Every parameter bit for bit as expected: what a skipped, dropped or refused window must leave."""
    assert got.keys() == expected.keys(), f"{context}: parameters {sorted(got)} against {sorted(expected)}"
    for name, want in expected.items():
        changed = int(np.sum(got[name] != want))
        assert not changed, f"{context}: parameter {name} changed in {changed} of its {want.size} elements"


# ------------------------------------------------------------------ equivalence with the large batch
# The unit roundoff u of float32 (2^-24) and of float16 (2^-11): the largest relative error of one rounding.
FLOAT32_ROUNDING = float(np.finfo(np.float32).eps) / 2
FLOAT16_ROUNDING = float(np.finfo(np.float16).eps) / 2
# C of rounding_rtol: the cancellation between the summed terms, the optimizer's gain and the later windows' carry.
ROUNDING_GAIN = 16
# C for a float16 network, with FLOAT16_ROUNDING: its kernels round each micro-batch's gradient once where the large
# batch rounds the window's once, far fewer roundings than B + N. Measured on every path, amp O1 and O2, both modes
# (tests/test_mixed_precision.py, and sink mode's O2): up to 0.065; allowed about 4 times that.
FLOAT16_GAIN = 0.25


def loss_terms(batch):
    """The terms a micro-batch's loss averages over: the size of its labels (its second array; its only array for a
    network that reads its targets from its inputs): its samples, or the token slots of a token-level loss."""
    return int(np.size(batch[1] if len(batch) > 1 else batch[0]))


def rounding_rtol(windows, rounding=FLOAT32_ROUNDING, gain=ROUNDING_GAIN):
    """
    The largest difference float rounding explains between an accumulated run and the large batch's, relative to
    the quantity compared (a parameter's update, a window's loss or gradient norm).

    The two compute each window's mean gradient in their own order: the large batch sums the gradients of its B
    loss terms in one reduction; accumulation sums each micro-batch's, weighs the N micro-batch means by their
    items, adds them into its buffers and divides. A floating-point sum of n terms is within (n - 1) x u x sum|terms|
    of the exact sum (u the unit roundoff; Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, (4.4)),
    so the two window gradients differ by at most about (B + N) x u x sum|g_i| / B per element, and the windows'
    differences add up along the run (each window starts from the parameters the last one left). Hence

        rtol = C x u x sum over the windows of (B + N)

    where C (:data:`ROUNDING_GAIN`, 16) bounds what the count of additions leaves out: sum|g_i| / |sum g_i| (the
    cancellation between the samples' gradients), the optimizer's gain from the gradient to the update (Momentum's
    velocity, Adam's normalisation) and a window's effect on the gradients of the next. Measured on the suite's
    cases (docs/tests.md, How an equivalence test is built), the worst difference took C = 4.7 (AdamW); 16 leaves
    three times that for other data, releases and machines, and stays far below what a wrong window makes: one
    micro-batch of N dropped, added twice or not divided moves a window's update by about 1/N of itself or more,
    where rtol is 1e-5 to 7e-4 for the suite's runs. `rounding`: u of the precision the gradients are computed in
    (:data:`FLOAT16_ROUNDING` for a float16 network, with :data:`FLOAT16_GAIN`).
    """
    additions = sum(sum(loss_terms(batch) for batch in window) + len(window) for window in windows)
    return gain * rounding * additions


def update_errors(got, expected, before):
    """{name: the largest element of |(got - before) - (expected - before)|, less two spacings of the parameter in
    its dtype (the rounding of storing it after the update, on each side), / the largest element of
    |expected - before|}: each parameter's update error relative to its expected update (to the largest update of
    any parameter where the expected one is zero), in float64."""
    assert got.keys() == expected.keys() == before.keys(), \
        f"parameters {sorted(got)} against the reference's {sorted(expected)}"
    updates = {name: expected[name].astype(np.float64) - before[name] for name in expected}
    largest = max(float(np.abs(update).max()) for update in updates.values())
    errors = {}
    for name, update in updates.items():
        scale = float(np.abs(update).max()) or largest
        stored = 2.0 * np.spacing(np.abs(expected[name])).astype(np.float64)
        difference = np.abs(got[name].astype(np.float64) - before[name] - update)
        errors[name] = float(np.maximum(difference - stored, 0.0).max()) / scale
    return errors


def a_wrong_window(windows):
    """`windows` with the last window's last micro-batch dropped (the last window dropped when it holds one)."""
    last = windows[-1]
    return windows[:-1] + ([last[:-1]] if len(last) > 1 else [])


def assert_equals_large_batch(got, reference, windows, context="", rounding=FLOAT32_ROUNDING, gain=ROUNDING_GAIN):
    """
    The equivalence check of the suite: the update of an accumulated run equals the large batch's, parameter by
    parameter, within what float rounding explains, and the same check fails on a wrong window.

    Args:
        got (dict): name -> numpy value of every parameter after the accumulated run.
        reference (Callable): windows -> the same dict after training a fresh copy of the run's model (built as
            the run's was) one step per window on its concatenated micro-batches, written without ms_accum
            (``nn.TrainOneStepCell``, or ``value_and_grad`` and the optimizer). ``reference([])`` is then the
            parameters before training. It is called in PYNATIVE_MODE (:func:`in_pynative`), which needs no
            compilation, whatever the run's mode.
        windows (list): The run's windows as it applied them, each a list of micro-batches (tuples of numpy
            arrays, the labels second).
        context (str): Named in the failure.
        rounding, gain: Of :func:`rounding_rtol`, the tolerance.

    Raises:
        AssertionError: If a parameter's update (after - before) differs from the large batch's by more than
            :func:`rounding_rtol` of the largest element of that update, or if the reference trained on a wrong
            window (:func:`a_wrong_window`: a micro-batch dropped) passes the same check, which then could not
            fail.
    """
    before, expected = in_pynative(reference, []), in_pynative(reference, windows)
    rtol = rounding_rtol(windows, rounding, gain)
    errors = update_errors(got, expected, before)
    worst = max(errors, key=lambda name: np.nan_to_num(errors[name], nan=np.inf))
    assert errors[worst] <= rtol, (f"{context}: the update of parameter {worst} differs from the large batch's by "
                                   f"{errors[worst]:.3g} of its largest element, allowed {rtol:.3g}")
    control = update_errors(in_pynative(reference, a_wrong_window(windows)), expected, before)
    assert max(control.values()) > rtol, (f"{context}: the check cannot fail: a run with a micro-batch dropped "
                                          f"differs by {max(control.values()):.3g} only, allowed {rtol:.3g}")


def numpy_dataset(batches, shuffle=False):
    """A MindSpore dataset yielding exactly `batches` in order (each row one micro-batch)."""
    sizes = {len(y) for _, y in batches}
    if len(sizes) == 1:
        x, y = concat(batches)
        return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=shuffle).batch(sizes.pop())

    def generate():
        yield from batches
    return ds.GeneratorDataset(generate, ["x", "y"], shuffle=shuffle)


SAMPLE = os.path.join(ZOO, "data", "fashion_mnist_sample")
ACCURACY = re.compile(r"^============== \{'Accuracy': ([0-9.]+)\} ==============$", re.M)


def run_script(script, *args, check=True, env=None):
    """Run a model-zoo script as a user would (`env`: variables to set besides), in a forked copy of a process
    that has imported MindSpore (:func:`run_python`); return (returncode, stdout, stderr)."""
    done = run_python([os.path.join(ZOO, script), *args], env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"{script} {args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.returncode, done.stdout, done.stderr


class _ScriptServer:
    """tests/script_server.py, started on first use, one per test process: it runs each script in a forked copy of
    itself with MindSpore and ms_accum imported."""

    def __init__(self):
        self.log = tempfile.TemporaryFile(mode="w+")  # the server's own stderr: what it said if it ended
        self.process = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "script_server.py")],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                        env=dict(os.environ, PYTHONPATH=ROOT), bufsize=0)
        self.pending = b""

    def answer(self, timeout=None):
        """The server's next answer (a dict), waiting up to `timeout` seconds; None when the time ran out."""
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                self.log.seek(0)
                raise RuntimeError(f"tests/script_server.py ended (exit {self.process.wait()}):\n{self.log.read()}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv, env, cwd, timeout):
        """Run `argv` (a script and its arguments) in a forked copy; return its ``subprocess.CompletedProcess``."""
        with tempfile.TemporaryDirectory() as scratch:
            out, err = os.path.join(scratch, "out"), os.path.join(scratch, "err")
            request = {"argv": argv, "env": env, "cwd": cwd, "out": out, "err": err}
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            pid = self.answer()["pid"]
            done = self.answer(timeout)
            if done is None:
                os.kill(pid, signal.SIGKILL)
                self.answer()
                raise subprocess.TimeoutExpired(argv, timeout)
            with open(out, encoding="utf-8", errors="replace") as f_out, \
                    open(err, encoding="utf-8", errors="replace") as f_err:
                return subprocess.CompletedProcess(argv, done["code"], f_out.read(), f_err.read())

    def close(self):
        """End the server (it ends when its standard input closes) and wait for it."""
        self.process.stdin.close()
        self.process.wait(timeout=60)


@functools.lru_cache(maxsize=None)
def _script_server():
    server = _ScriptServer()
    atexit.register(server.close)
    return server


def run_python(argv, env=None, cwd=None, timeout=600):
    """Run the Python script ``argv[0]`` with its arguments as ``python argv...`` would, with PYTHONPATH at the
    repository and `env`'s variables set besides, in `cwd` (the current directory by default), and return its
    ``subprocess.CompletedProcess`` (text output); raise ``subprocess.TimeoutExpired`` after `timeout` seconds.
    ``["-m", module, *args]`` runs a module, as ``python -m`` does.

    It runs in a forked copy of tests/script_server.py, a process that has imported MindSpore and ms_accum and
    nothing else (no device, context or graph set up): each run saves the 1.5-2 s of CPU a fresh interpreter takes
    to import MindSpore (test_lenet_zoo.py: 156 s of CPU against 349 s, docs/tests.md)."""
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return _script_server().run([str(arg) for arg in argv], env, str(cwd or os.getcwd()), timeout)


# ------------------------------------------------------------------ token-level losses
class TokenTagger(nn.Cell):
    """A per-token classifier over padded sequences: features (B, T, F) -> logits (B, T, C)."""

    def __init__(self, features=6, hidden=8, classes=5):
        super().__init__()
        self.hidden = nn.Dense(features, hidden, activation="tanh")
        self.out = nn.Dense(hidden, classes)

    def construct(self, x):
        return self.out(self.hidden(x))


class MaskedTokenLoss(nn.Cell):
    """The mean cross-entropy over the real (mask 1) tokens, and their count: the token-loss recipe.

    With return_items=False it returns the mean alone (what a large-batch reference trains on)."""

    def __init__(self, network, return_items=True):
        super().__init__(auto_prefix=False)
        self.network = network
        self.return_items = return_items
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")

    def construct(self, x, labels, mask):
        logits = self.network(x)
        per_token = self.ce(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).reshape(labels.shape)
        tokens = mask.sum()
        loss = (per_token * mask).sum() / tokens
        if self.return_items:
            return loss, tokens
        return loss


def build_tagger(optimizer="momentum", seed=0, return_items=True):
    """A fresh TokenTagger inside MaskedTokenLoss, and its optimizer, identical for the same seed."""
    ms.set_seed(seed)
    net = TokenTagger()
    return net, MaskedTokenLoss(net, return_items), OPTIMIZERS[optimizer](net.trainable_params())


def token_batches(real_tokens, length=6, batch=3, seed=2):
    """One (x, labels, mask) per entry of `real_tokens`: `batch` sequences of `length` padded tokens holding that
    many real tokens in all (in reading order), so micro-batches of equal shape hold different token counts."""
    rng = np.random.default_rng(seed)
    out = []
    for count in real_tokens:
        mask = np.zeros(batch * length, np.float32)
        mask[:count] = 1.0
        out.append((rng.normal(size=(batch, length, 6)).astype(np.float32),
                    rng.integers(0, 5, size=(batch, length)).astype(np.int32), mask.reshape(batch, length)))
    return out


@computed_once
def token_reference(optimizer, windows, seed=0):
    """Large-batch training on the token mean: one TrainOneStepCell step per window on its concatenated
    micro-batches, the loss being the mean over all the window's real tokens."""
    net, loss, opt = build_tagger(optimizer, seed, return_items=False)
    step = nn.TrainOneStepCell(loss, opt)
    for window in windows:
        step(*(Tensor(np.concatenate(parts)) for parts in zip(*window)))
    return params_of(net)


# ------------------------------------------------------------------ independent large-batch references
def grad_norm(grads):
    """The global L2 norm of a gradient tuple, in float64."""
    return float(np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads)))


@computed_once
def functional_reference(optimizer, windows, clip_norm=None, seed=0, make=None, average=True):
    """Large-batch training written without ms_accum or TrainOneStepCell: per window, value_and_grad of the mean
    loss over the concatenated micro-batches (with `average` False, the sum of the micro-batches' mean-loss
    gradients: the raw sum), ops.clip_by_global_norm when clip_norm is given, one optimizer step.
    Returns (parameters, each window's gradient norm before clipping)."""
    net, loss, opt = (make or build)(optimizer, seed)
    loss_net = nn.WithLossCell(net, loss)
    grad_fn = ms.value_and_grad(loss_net, None, opt.parameters)
    norms = []
    for window in windows:
        if average:
            _, grads = grad_fn(*(Tensor(np.concatenate(parts)) for parts in zip(*window)))
        else:
            parts = [grad_fn(*map(Tensor, batch))[1] for batch in window]
            grads = tuple(sum(grad[i] for grad in parts[1:]) + parts[0][i] for i in range(len(parts[0])))
        norms.append(grad_norm(grads))
        if clip_norm is not None:
            grads = ops.clip_by_global_norm(grads, clip_norm)
        opt(grads)
    return params_of(net), norms


def large_batch(optimizer, clip_norm=None, make=None, average=True):
    """The reference of :func:`assert_equals_large_batch` written with value_and_grad: windows -> the parameters
    after :func:`functional_reference`."""
    return lambda windows: functional_reference(optimizer, windows, clip_norm, make=make, average=average)[0]


# ------------------------------------------------------------------ the noise scale's reference
def noise_estimates(sizes, means):
    """
    The noise scale's estimator (docs/noise_scale.md) in float64, on a window's micro-batch mean gradients `means`
    (flat arrays) weighing `sizes` items each (K = len(sizes) >= 2): (grad_sq, noise_trace, and the magnitudes each
    is a difference of: |g|^2 + that of noise_trace / W, and (sum w_i |g_i|^2 + W |g|^2) / (K - 1)).
    """
    sizes = np.asarray(sizes, np.float64)
    total = sizes.sum()
    window = sum(size * mean for size, mean in zip(sizes, means)) / total
    window_sq = float(window @ window)
    micro_sq = float(sum(size * float(mean @ mean) for size, mean in zip(sizes, means)))
    trace = (micro_sq - total * window_sq) / (len(sizes) - 1)
    trace_terms = (micro_sq + total * window_sq) / (len(sizes) - 1)
    return window_sq - trace / total, trace, window_sq + trace_terms / total, trace_terms


@computed_once
def noise_reference(optimizer, windows, make=None):
    """
    The noise scale of a large-batch run written without ms_accum: per window, each micro-batch's mean gradient by
    value_and_grad at the window's parameters, :func:`noise_estimates` weighted by their samples, the smoothing of
    ``ms_accum.core.noise_scale`` (windows of one micro-batch: NaN, not smoothed), then one optimizer step on the
    concatenated window's gradient. Returns per window ((grad_sq, noise_trace, smoothed grad_sq, smoothed
    noise_trace), the magnitude each is a difference of), as the cells' ``noise_records`` read after it.
    """
    net, loss, opt = (make or build)(optimizer, 0)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
    smooth, smooth_terms, records = np.zeros(2), np.zeros(2), []
    for window in windows:
        if len(window) > 1:
            means = [np.concatenate([g.asnumpy().astype(np.float64).ravel() for g in grad_fn(*map(Tensor, b))[1]])
                     for b in window]
            grad_sq, trace, sq_terms, trace_terms = noise_estimates([loss_terms(b) for b in window], means)
            smooth = NOISE_SMOOTHING * smooth + (1 - NOISE_SMOOTHING) * np.array([grad_sq, trace])
            smooth_terms = NOISE_SMOOTHING * smooth_terms + (1 - NOISE_SMOOTHING) * np.array([sq_terms, trace_terms])
        else:
            grad_sq = trace = sq_terms = trace_terms = math.nan
        records.append(((grad_sq, trace, *smooth), (sq_terms, trace_terms, *smooth_terms)))
        opt(grad_fn(*map(Tensor, concat(window)))[1])
    return records


def assert_noise_records_match(got, reference, windows, context=""):
    """`got` (a cell's ``noise_records`` values after each window, or a prefix of each) against
    :func:`noise_reference`'s: each estimate within 2 x :func:`rounding_rtol` of the magnitude it is a difference
    of (a squared norm's relative rounding is twice its vector's), NaN where the reference has none."""
    bound = 2 * rounding_rtol(windows)
    for index, (values, (want, terms)) in enumerate(zip(got, reference)):
        for name, value, expected, magnitude in zip(NOISE_RECORDS, values, want, terms):
            if math.isnan(expected):
                assert math.isnan(value), f"{context}: window {index}'s {name} is {value}, where there is no estimate"
            else:
                assert abs(value - expected) <= bound * magnitude, \
                    (f"{context}: window {index}'s {name} is {value}, the large batch's {expected} (allowed "
                     f"{bound * magnitude:.3g})")


NOISE_RECORDS = ("grad_sq", "noise_trace", "smoothed grad_sq", "smoothed noise_trace")


def msrun_argv(node, master, port, script, *args, log_dir, workers_per_node=1, nodes=2):
    """The msrun command line of `node` (0 runs the scheduler, at `master`:`port`) for a job of `nodes` x
    `workers_per_node`; the venv's msrun."""
    msrun = os.path.join(os.path.dirname(sys.executable), "msrun")
    return [msrun, f"--worker_num={nodes * workers_per_node}", f"--local_worker_num={workers_per_node}",
            f"--node_rank={node}", f"--master_addr={master}", f"--master_port={port}", "--join=True",
            f"--log_dir={log_dir}", script, *map(str, args)]


# The msrun scheduler's heartbeat timeout (MS_NODE_TIMEOUT, seconds; MindSpore's default is 30) in a launch whose
# worker a test kills: the scheduler ends the job this long after the worker's heartbeats stop (test_data_parallel's
# kill test took 84 s with the default and 66 s with 8, alone on the machine).
KILL_NODE_TIMEOUT = 10


# MindSpore's cluster waits a random interval between its retries while the workers join the scheduler and again
# while they leave it, drawn between MS_RETRY_INTERVAL_LOWER and _UPPER seconds (its own defaults when unset); the
# tests' jobs run on one machine or two network namespaces of it, where 1 to 2 s is plenty: an msrun launch of two
# workers that only join and leave took 15.4 and 15.7 s with MindSpore's defaults, 11.3 s twice with these
# (2026-11-28). A value the caller's environment sets is kept.
RETRY_INTERVALS = {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "2"}


def msrun_env(node_timeout=None):
    """The environment of an msrun launch: the venv's bin first on PATH (msrun starts workers with the `python`
    found there), the repository importable and :data:`RETRY_INTERVALS`; with `node_timeout`, the scheduler's
    heartbeat timeout in seconds (:data:`KILL_NODE_TIMEOUT` for a job a test kills a worker of)."""
    bin_dir = os.path.dirname(sys.executable)
    env = dict(RETRY_INTERVALS)
    env.update(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""), PYTHONPATH=ROOT)
    if node_timeout is not None:
        env["MS_NODE_TIMEOUT"] = str(node_timeout)
    return env


def free_port():
    """A TCP port free on 127.0.0.1 now (for a local msrun scheduler)."""
    import socket  # pylint: disable=import-outside-toplevel
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_local(out_dir, script, *args, node_timeout=None):
    """`script` on 2 local CPU workers under msrun (127.0.0.1, logs in `out_dir`/logs), in its own process group;
    the Popen (`node_timeout`: see :func:`msrun_env`)."""
    cmd = msrun_argv(0, "127.0.0.1", free_port(), script, *args, log_dir=out_dir / "logs", workers_per_node=2,
                     nodes=1)
    return subprocess.Popen(cmd, cwd=os.path.dirname(os.path.abspath(__file__)), env=msrun_env(node_timeout),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def run_local(out_dir, script, *args, timeout=300, per_worker=False):
    """`script` on 2 local CPU workers under msrun (:func:`launch_local`) to its end; fail with the workers' logs
    if it fails or outlasts `timeout` s (its whole process group killed then); return every worker's log, joined
    (or with `per_worker`, a list of them by rank)."""
    import glob  # pylint: disable=import-outside-toplevel
    import signal  # pylint: disable=import-outside-toplevel
    import pytest  # pylint: disable=import-outside-toplevel
    proc = launch_local(out_dir, script, *args)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"msrun did not finish in {timeout} s; logs in {out_dir / 'logs'}")
    logs = [open(path, encoding="utf-8", errors="replace").read()
            for path in sorted(glob.glob(str(out_dir / "logs" / "worker_*.log")))]
    assert proc.returncode == 0, f"msrun exited {proc.returncode}\n{output[-3000:]}\n" + \
        "".join(log[-3000:] for log in logs)
    return logs if per_worker else "".join(logs)


def train_py_worker(launcher, rank=None):
    """The train.py worker process an msrun launcher started (for `rank`, when it started several), or None."""
    import psutil  # pylint: disable=import-outside-toplevel  (a MindSpore dependency)
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if "train.py" in " ".join(child.cmdline()) and \
                    (rank is None or child.environ().get("RANK_ID") == str(rank)):
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def own_loop(path, seed, steps=3, make=None):
    """A user's own loop on one of the front ends without a trainer, windows of `steps` micro-batches: (the
    network, run(index, x, y) for one micro-batch, the cell to save, a function dropping the open window).
    `make(optimizer_name, seed)` builds (network, loss, optimizer) instead of :func:`build`."""
    net, loss, opt = (make or build)("momentum", seed)
    loss_net = nn.WithLossCell(net, loss)
    if path == "cells":
        grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
        forward_backward = ms_accum.TrainForwardBackward(loss_net, opt, grad_sum)
        optim, clear = ms_accum.TrainOptim(opt, grad_sum), ms_accum.TrainClear(grad_sum)

        def run(index, x, y):
            forward_backward(x, y)
            if index % steps == steps - 1:
                optim()
                clear()
        return net, run, forward_backward, clear
    if path == "parallel":
        cell = ms_accum.TrainAccuStepsCell(loss_net, opt, gradient_accumulation_steps=steps)
        return net, lambda index, x, y: cell(x, y), cell, cell.drop
    accumulator = ms_accum.Accumulator(opt, steps)
    grad_fn = ms.value_and_grad(loss_net, None, opt.parameters)
    return (net, lambda index, x, y: accumulator(grad_fn(x, y)[1], x.shape[0]), (net, accumulator),
            accumulator.drop)


def open_files():
    """The paths of the files this process holds open."""
    fds = "/proc/self/fd"
    return {os.path.realpath(os.path.join(fds, fd)) for fd in os.listdir(fds)
            if os.path.exists(os.path.join(fds, fd))}


class StopAt(Callback):
    """Request a stop once `update` updates are done (a stop at an update boundary, as a scheduler's would), or
    with `error` raise it there instead (training that fails midway)."""

    def __init__(self, update, error=None):
        super().__init__()
        self.update, self.error = update, error

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.update:
            if self.error is not None:
                raise self.error
            run_context.request_stop()
