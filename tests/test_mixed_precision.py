"""Mixed precision (mindspore.amp O1 and O2) through every path, against the same network's large-batch step and
the float32 large batch."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, amp, nn

import paths
from helpers import (FLOAT16_GAIN, FLOAT16_ROUNDING, SmallConvNet, assert_equals_large_batch, micro_batches, params_of,
                     rounding_rtol, update_errors)

pytestmark = pytest.mark.slow  # every path in both modes: about a minute
N = 3


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
    """windows -> the parameters of the network converted at `level` after one TrainOneStepCell step per window."""
    def train(windows_):
        net, loss_net, opt = build(level)
        step = nn.TrainOneStepCell(loss_net, opt)
        for window in windows_:
            step(*(Tensor(np.concatenate(parts)) for parts in zip(*window)))
        return params_of(net)
    return train


# the paths (tests/paths.py) and their loss scales: a static 2^10 where the path takes one, none for the plain
# parallel cell, the loss-scale cell's dynamic scale (None: its default)
PATHS = {"three_cells": 2.0 ** 10, "driver": 2.0 ** 10, "accu_steps": None, "accu_steps_loss_scale": None,
         "model_accu": 2.0 ** 10, "accumulator": 2.0 ** 10}


@pytest.mark.parametrize("level, exec_mode", [("O1", "pynative"), ("O2", "graph")])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_mixed_precision_window_equals_the_large_batch(path, level, exec_mode):
    ms.set_context(mode=ms.GRAPH_MODE if exec_mode == "graph" else ms.PYNATIVE_MODE)
    net, loss_net, opt = build(level)
    paths.train(path, loss_net, opt, sum(windows(), []), N, scale=PATHS[path])
    got = params_of(net)
    for reference in (level, "float32"):
        assert_equals_large_batch(got, large_batch(reference), windows(), context=f"{path}, {level}, {exec_mode}, "
                                  f"against {reference}", rounding=FLOAT16_ROUNDING, gain=FLOAT16_GAIN)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_the_references_differ_so_float16_is_really_in_play(level):
    """The float16 large batch's update differs from the float32 one's by more than float32's rounding explains
    (the float32 tolerance): float16 is what the looser tolerance is for."""
    full = large_batch("float32")
    worst = max(update_errors(large_batch(level)(windows()), full(windows()), full([])).values())
    assert worst > rounding_rtol(windows()), f"{level}'s update is {worst:.3g} from float32's: float16 is not in play"
