"""Mixed precision (mindspore.amp O1 and O2) through every path, against the same network's large-batch step and
the float32 large batch."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, amp, nn

import ms_accum
from helpers import SmallConvNet, assert_params_close, micro_batches, numpy_dataset, params_of

pytestmark = pytest.mark.slow  # every path in both modes: about a minute
N = 3
# Measured on CPU (2026-11-22), every path and level in both modes: up to 2.5e-4 from the same network's large
# batch (float16 sums over micro-batches instead of the large batch) and up to 2.0e-4 from float32.
SAME_NETWORK_RTOL = 1e-3
FLOAT32_RTOL = 1e-3


@pytest.fixture(autouse=True)
def _in_a_scratch_directory(tmp_path, monkeypatch):
    """mindspore.amp writes the networks it rewrites into ./rewritten_network: keep them out of the checkout."""
    monkeypatch.chdir(tmp_path)


def build(level, seed=0):
    ms.set_seed(seed)
    net = SmallConvNet()
    if level != "float32":
        net = amp.auto_mixed_precision(net, level)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return net, nn.WithLossCell(net, loss), nn.Momentum(net.trainable_params(), 0.1, 0.9)


def windows():
    batches = micro_batches((4, 3, 4, 2, 4, 4), seed=9)
    return [batches[:N], batches[N:]]


def large_batch(level):
    net, loss_net, opt = build(level)
    step = nn.TrainOneStepCell(loss_net, opt)
    for window in windows():
        step(*(Tensor(np.concatenate(parts)) for parts in zip(*window)))
    return params_of(net)


def scale():
    return Tensor(2.0 ** 10, ms.float32)


def three_cells(level):
    net, loss_net, opt = build(level)
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    sense = scale()
    forward_backward = ms_accum.TrainForwardBackward(loss_net, opt, grad_sum, scale_sense=sense)
    optim, clear = ms_accum.TrainOptim(opt, grad_sum, scale_sense=sense), ms_accum.TrainClear(grad_sum)
    for window in windows():
        for x, y in window:
            forward_backward(Tensor(x), Tensor(y))
        optim()
        clear()
    return params_of(net)


def driver(level):
    net, loss_net, opt = build(level)
    ms_accum.GradientAccumulation(loss_net, None, opt, scale_sense=scale()).train_process(
        1, numpy_dataset(sum(windows(), [])), N, ckpt_path=None, log_every=0)
    return params_of(net)


def accu_steps(level, kind):
    net, loss_net, opt = build(level)
    if kind == "plain":
        cell = ms_accum.TrainAccuStepsCell(loss_net, opt, accumulation_steps=N)
    else:
        cell = ms_accum.TrainAccuStepsWithLossScaleCell(loss_net, opt, nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 100),
                                                        accumulation_steps=N)
    for x, y in sum(windows(), []):
        cell(Tensor(x), Tensor(y))
    return params_of(net)


def model_accu(level):
    net, loss_net, opt = build(level)
    cell = ms_accum.TrainAccuStepsWithLossScaleCell(loss_net, opt, scale(), accumulation_steps=N)
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(sum(windows(), [])), dataset_sink_mode=False)
    return params_of(net)


def accumulator(level):
    net, loss_net, opt = build(level)
    scaler = amp.StaticLossScaler(2.0 ** 10)

    def scaled_loss(x, y):
        return scaler.scale(loss_net(x, y))

    grad_fn = ms.value_and_grad(scaled_loss, None, opt.parameters)
    acc = ms_accum.Accumulator(opt, N, loss_scaler=scaler)
    for x, y in sum(windows(), []):
        _, grads = grad_fn(Tensor(x), Tensor(y))
        acc(grads, len(y))
    return params_of(net)


PATHS = {
    "three_cells": three_cells,
    "driver": driver,
    "accu_steps": lambda level: accu_steps(level, "plain"),
    "accu_steps_loss_scale": lambda level: accu_steps(level, "dynamic"),
    "model_accu": model_accu,
    "accumulator": accumulator,
}


@pytest.mark.parametrize("level, exec_mode", [("O1", "pynative"), ("O2", "graph")])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_mixed_precision_window_equals_the_large_batch(path, level, exec_mode):
    ms.set_context(mode=ms.GRAPH_MODE if exec_mode == "graph" else ms.PYNATIVE_MODE)
    got = PATHS[path](level)
    assert_params_close(got, large_batch(level), rtol=SAME_NETWORK_RTOL, context=f"{path}, {level}, {exec_mode}")
    assert_params_close(got, large_batch("float32"), rtol=FLOAT32_RTOL, context=f"{path}, {level} vs float32")


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_the_references_differ_so_float16_is_really_in_play(level):
    mixed, full = large_batch(level), large_batch("float32")
    worst = max(np.abs(mixed[k] - v).max() / np.abs(v).max() for k, v in full.items())
    assert worst > 1e-6, f"{level} trained exactly like float32: auto_mixed_precision had no effect"
