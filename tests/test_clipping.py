"""clip_norm: the window's gradient is clipped once, by its global norm, as the large batch's would be."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

import ms_accum
from helpers import (assert_params_close, build, functional_reference, micro_batches, numpy_dataset, params_of)

pytestmark = pytest.mark.slow  # every path in both modes: about a minute
N = 4


def windows():
    batches = micro_batches((5, 3, 4, 2) * 2, seed=11)
    return [batches[:N], batches[N:]]


@pytest.fixture(scope="module")
def window_norm():
    """The first window's large-batch gradient norm, from the initial parameters."""
    return functional_reference("momentum", windows()[:1])[1][0]


def three_cells(clip_norm):
    net, loss, opt = build("momentum")
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), opt, grad_sum)
    optim, clear = ms_accum.TrainOptim(opt, grad_sum, clip_norm=clip_norm), ms_accum.TrainClear(grad_sum)
    records = []
    for window in windows():
        for x, y in window:
            forward_backward(Tensor(x), Tensor(y))
        optim()
        records.append((float(optim.accu_last_grad_norm.asnumpy()), bool(optim.accu_last_clipped.asnumpy())))
        clear()
    return params_of(net), records


def driver(clip_norm):
    net, loss, opt = build("momentum")
    telemetry = ms_accum.WindowTelemetry()
    trainer = ms_accum.GradientAccumulation(net, loss, opt, clip_norm=clip_norm)
    trainer.train_process(1, numpy_dataset(sum(windows(), [])), N, callbacks=[telemetry], ckpt_path=None,
                          log_every=0)
    return params_of(net), [(r.grad_norm, r.clipped) for r in telemetry.records]


def accu_cell(kind, clip_norm):
    net, loss, opt = build("momentum")
    if kind == "plain":
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, accumulation_steps=N,
                                           clip_norm=clip_norm)
    else:
        cell = ms_accum.TrainAccuStepsWithLossScaleCell(nn.WithLossCell(net, loss), opt,
                                                        nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 100),
                                                        accumulation_steps=N, clip_norm=clip_norm)
    return cell, net


def accu_steps(kind, clip_norm):
    cell, net = accu_cell(kind, clip_norm)
    records = []
    for window in windows():
        for x, y in window:
            cell(Tensor(x), Tensor(y))
        records.append((float(cell.accu_last_grad_norm.asnumpy()), bool(cell.accu_last_clipped.asnumpy())))
    return params_of(net), records


def model_accu(clip_norm):
    cell, net = accu_cell("dynamic", clip_norm)
    telemetry = ms_accum.WindowTelemetry()
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(sum(windows(), [])), callbacks=[telemetry],
                                    dataset_sink_mode=False)
    return params_of(net), [(r.grad_norm, r.clipped) for r in telemetry.records]


def accumulator(clip_norm):
    net, loss, opt = build("momentum")
    loss_net = nn.WithLossCell(net, loss)
    grad_fn = ms.value_and_grad(loss_net, None, opt.parameters)
    acc = ms_accum.Accumulator(opt, N, clip_norm=clip_norm)
    records = []
    for window in windows():
        for x, y in window:
            _, grads = grad_fn(Tensor(x), Tensor(y))
            acc(grads, len(y))
        records.append((float(acc.accu_last_grad_norm.asnumpy()), bool(acc.accu_last_clipped.asnumpy())))
    return params_of(net), records


PATHS = {
    "three_cells": three_cells,
    "driver": driver,
    "accu_steps": lambda clip: accu_steps("plain", clip),
    "accu_steps_loss_scale": lambda clip: accu_steps("dynamic", clip),
    "model_accu_loss_scale": model_accu,
    "accumulator": accumulator,
}


@pytest.mark.parametrize("active, exec_mode", [(True, "pynative"), (True, "graph"), (False, "pynative")],
                         ids=["clipping-pynative", "clipping-graph", "below_the_limit-pynative"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_window_gradient_is_clipped_like_the_large_batch_gradient(path, active, exec_mode, window_norm):
    ms.set_context(mode=ms.GRAPH_MODE if exec_mode == "graph" else ms.PYNATIVE_MODE)
    clip_norm = window_norm * (0.2 if active else 5.0)
    got, records = PATHS[path](clip_norm)
    expected, norms = functional_reference("momentum", windows(), clip_norm)
    assert_params_close(got, expected, context=f"{path}, clip_norm {clip_norm:.3g}, {exec_mode}")
    unclipped, _ = functional_reference("momentum", windows())
    moved = max(np.abs(got[k] - unclipped[k]).max() / np.abs(unclipped[k]).max() for k in got)
    assert (moved > 1e-3) == active, f"clipping {'did not change' if active else 'changed'} the update ({moved:.2g})"
    assert [r[0] for r in records] == pytest.approx(norms, rel=1e-4), "telemetry must record the norm before clipping"
    assert [r[1] for r in records] == [n > clip_norm for n in norms]


def test_clip_norm_is_checked():
    net, loss, opt = build("momentum")
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    for bad, error in ((0, ValueError), (-1.0, ValueError), (float("inf"), ValueError), ("1", TypeError),
                       (True, TypeError)):
        with pytest.raises(error, match=rf"For 'TrainOptim', 'clip_norm' must be a finite number > 0, or None "
                                        rf"for no clipping, but got {bad!r}"):
            ms_accum.TrainOptim(opt, grad_sum, clip_norm=bad)
    with pytest.raises(ValueError, match="For 'GradientAccumulation', 'clip_norm' must be a finite number > 0"):
        ms_accum.GradientAccumulation(net, loss, opt, clip_norm=0.0)
    with pytest.raises(ValueError, match="For 'TrainAccuStepsCell', 'clip_norm' must be a finite number > 0"):
        ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, accumulation_steps=2, clip_norm=0.0)
    with pytest.raises(ValueError, match="For 'Accumulator', 'clip_norm' must be a finite number > 0"):
        ms_accum.Accumulator(opt, 2, clip_norm=-3)
