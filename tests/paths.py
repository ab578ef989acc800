"""Every ms_accum path, built and trained one way for the feature tests: one adapter for the suite.

:func:`train` builds a path around a test's own loss network and optimizer, trains it on the test's micro-batches
in windows of N and returns what each window reported. A feature test compares the trained parameters with its
large-batch reference, built without ms_accum, and reads the window records where the feature shows in them.

The paths, as the README's feature table names them:

- ``three_cells``: TrainForwardBackward per micro-batch, TrainOptim and TrainClear per window, in the test's loop;
- ``driver``: GradientAccumulation.train_process over a dataset of the micro-batches;
- ``accu_steps``: TrainAccuStepsCell called per micro-batch in its automatic mode (``accu_steps_loss_scale``:
  TrainAccuStepsWithLossScaleCell);
- ``model_accu``: Model_ACCU.train over a TrainAccuStepsCell without dataset sink mode (``model_accu_loss_scale``:
  over the loss-scale cell; ``model_accu_sink``: in sink mode, where the device is faked: test_model_accu.py);
- ``accumulator``: Accumulator inside a step of the test's (compiled with ``ms.jit`` in GRAPH_MODE).

A loss scale: ``scale`` None (the ``*_loss_scale`` paths then take a dynamic scale from 2^10, halved on an
overflow, doubled after 100 clean windows), a number (a static scale: the three cells' and the driver's
``scale_sense``, the loss-scale cells' fixed Tensor, Accumulator's ``amp.StaticLossScaler``) or "dynamic".
"""
import math
from typing import List, NamedTuple, Optional

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, amp, nn

import ms_accum

PATHS = ("three_cells", "driver", "accu_steps", "accu_steps_loss_scale", "model_accu", "model_accu_loss_scale",
         "model_accu_sink", "accumulator")
DYNAMIC = (2.0 ** 10, 2, 100)  # the loss-scale paths' default: initial scale, factor, clean windows per raise


class Window(NamedTuple):
    """What one window reported: its mean loss (None where the path does not compute it: Accumulator), its
    gradient's global norm before clipping, whether it was clipped, and its noise-scale estimates (|G|^2, tr(Sigma)
    and the smoothed B_simple; NaN where they are not measured)."""
    loss: Optional[float]
    grad_norm: float
    clipped: bool
    grad_sq: float
    noise_trace: float
    noise_scale: float


class Trained(NamedTuple):
    """A trained path: one :class:`Window` per update, and the engine object holding the ``accu_*`` records (the
    cell, TrainOptim or the Accumulator)."""
    windows: List[Window]
    engine: object


def dataset(batches):
    """A MindSpore dataset yielding exactly `batches` (tuples of numpy arrays, one micro-batch each), in order."""
    def generate():
        yield from batches
    return ds.GeneratorDataset(generate, [f"column_{i}" for i in range(len(batches[0]))], shuffle=False)


def _scale_of(path, scale):
    if scale is None and path.endswith("_loss_scale"):
        scale = "dynamic"
    return scale


def _update_cell(scale):
    """A cell's or the driver's `scale_sense`: a DynamicLossScaleUpdateCell, or a fixed Tensor."""
    if scale == "dynamic":
        return nn.DynamicLossScaleUpdateCell(*DYNAMIC)
    return Tensor(float(scale), ms.float32)


def _first(value):
    """A window end's loss, from its output (a loss, or the loss-scale cells' (loss, overflow, scale))."""
    value = value[0] if isinstance(value, (tuple, list)) else value
    return float(np.asarray(value.asnumpy()).reshape(-1)[0])


def _record(engine, loss):
    """The window just ended, from the engine's records (what WindowTelemetry reads for the trainers)."""
    grad_sq, trace = (float(value.asnumpy()) for value in engine.noise_records[:2]) if engine.measure_noise else \
        (math.nan, math.nan)
    return Window(loss, float(engine.accu_last_grad_norm.asnumpy()), bool(engine.accu_last_clipped.asnumpy()),
                  grad_sq, trace, engine.b_simple if engine.measure_noise else math.nan)


def _from_telemetry(telemetry):
    return [Window(r.loss, r.grad_norm, r.clipped, r.grad_sq, r.noise_trace, r.noise_scale)
            for r in telemetry.records]


def train(path, loss_net, optimizer, batches, steps, *, scale=None, clip_norm=None, nonfinite="skip",
          noise_scale=False, average=True, returns_items=False):
    """
    Train `batches` (tuples of numpy arrays, one micro-batch each) through `path` in windows of `steps`, on
    `loss_net` (a loss network returning the mean loss, or ``(loss, num_items)`` with `returns_items`) and
    `optimizer`. `clip_norm`, `nonfinite`, `noise_scale` and `average` are passed to the path's constructor.

    Returns:
        :class:`Trained`.
    """
    scale = _scale_of(path, scale)
    features = dict(clip_norm=clip_norm, nonfinite=nonfinite, noise_scale=noise_scale, average=average)
    if path == "three_cells":
        return _three_cells(loss_net, optimizer, batches, steps, scale, features)
    if path == "driver":
        return _driver(loss_net, optimizer, batches, steps, scale, features)
    if path == "accumulator":
        return _accumulator(loss_net, optimizer, batches, steps, scale, features, returns_items)
    if path.startswith("accu_steps") or path.startswith("model_accu"):
        if scale is None:
            cell = ms_accum.TrainAccuStepsCell(loss_net, optimizer, gradient_accumulation_steps=steps, **features)
        else:
            cell = ms_accum.TrainAccuStepsWithLossScaleCell(loss_net, optimizer, _update_cell(scale),
                                                            gradient_accumulation_steps=steps, **features)
        if path.startswith("accu_steps"):
            return _own_loop(cell, batches, steps)
        return _model_accu(cell, batches, path == "model_accu_sink")
    raise ValueError(f"unknown path {path!r}: one of {PATHS}")


def _three_cells(loss_net, optimizer, batches, steps, scale, features):
    grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
    sense = None if scale is None else _update_cell(scale)  # one scale, shared by the two cells
    forward_backward = ms_accum.TrainForwardBackward(loss_net, optimizer, grad_sum, average=features["average"],
                                                     scale_sense=sense, noise_scale=features["noise_scale"])
    optim = ms_accum.TrainOptim(optimizer, grad_sum, scale_sense=sense, **features)
    clear = ms_accum.TrainClear(grad_sum)
    forward_backward.set_train(True)  # as a user's loop does (BatchNorm and dropout in training mode)
    windows = []
    for index, batch in enumerate(batches):
        forward_backward(*map(Tensor, batch))
        if index % steps == steps - 1:
            windows.append(_record(optim, _first(optim())))
            clear()
    return Trained(windows, optim)


def _driver(loss_net, optimizer, batches, steps, scale, features):
    telemetry = ms_accum.WindowTelemetry()
    sense = None if scale is None else _update_cell(scale)
    trainer = ms_accum.GradientAccumulation(loss_net, None, optimizer, scale_sense=sense, **features)
    trainer.train_process(1, dataset(batches), steps, callbacks=[telemetry], ckpt_path=None, log_every=0)
    return Trained(_from_telemetry(telemetry), trainer.cell)


def _own_loop(cell, batches, steps):
    cell.set_train(True)
    windows = []
    for index, batch in enumerate(batches):
        out = cell(*map(Tensor, batch))  # the cell updates on every N-th call by itself
        if index % steps == steps - 1:
            windows.append(_record(cell, _first(out)))
    return Trained(windows, cell)


def _model_accu(cell, batches, sink):
    telemetry = ms_accum.WindowTelemetry()
    ms_accum.Model_ACCU(cell).train(1, dataset(batches), callbacks=[telemetry], dataset_sink_mode=sink)
    return Trained(_from_telemetry(telemetry), cell)


def _accumulator(loss_net, optimizer, batches, steps, scale, features, returns_items):
    scaler = None if scale is None else \
        amp.DynamicLossScaler(*DYNAMIC) if scale == "dynamic" else amp.StaticLossScaler(float(scale))
    accumulator = ms_accum.Accumulator(optimizer, steps, loss_scaler=scaler, **features)
    loss_net.set_train(True)

    def scaled_loss(*inputs):
        out = loss_net(*inputs)
        if scaler is None:
            return out
        return (scaler.scale(out[0]), out[1]) if returns_items else scaler.scale(out)
    grad_fn = ms.value_and_grad(scaled_loss, None, optimizer.parameters, has_aux=returns_items)

    def step(*inputs):
        out, grads = grad_fn(*inputs)
        return accumulator(grads, out[1] if returns_items else inputs[0].shape[0])
    step = ms.jit(step) if ms.get_context("mode") == ms.GRAPH_MODE else step
    windows = []
    for index, batch in enumerate(batches):
        step(*map(Tensor, batch))
        if index % steps == steps - 1:
            windows.append(_record(accumulator, None))
    return Trained(windows, accumulator)
