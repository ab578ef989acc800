"""The driver trains in training mode: BatchNorm uses and updates batch statistics, Dropout drops."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

import ms_accum
from helpers import assert_equals_large_batch, concat, numpy_dataset, params_of

N, MICRO = 4, 6
MOMENTUM = 0.9


class ConvBNDropout(nn.Cell):
    """BatchNorm on the input, a convolution, Dropout, a classifier."""

    def __init__(self, p):
        super().__init__()
        self.bn = nn.BatchNorm2d(2, momentum=MOMENTUM)
        self.conv = nn.Conv2d(2, 4, 3, pad_mode="valid", has_bias=True)
        self.relu = nn.ReLU()
        self.dropout = nn.Dropout(p=p)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 3 * 3, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.dropout(self.relu(self.conv(self.bn(x))))))


def build(p, seed=0):
    ms.set_seed(seed)
    net = ConvBNDropout(p)
    return net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.Momentum(
        net.trainable_params(), 0.1, 0.9)


def equal_statistics_batches(windows=2, seed=3):
    """Micro-batches that are permutations of one set of samples (with their own labels): every micro-batch, and
    so every window, has the same per-channel mean and variance, so BatchNorm in training mode normalises each
    micro-batch exactly as it normalises their union."""
    rng = np.random.default_rng(seed)
    base = rng.normal(loc=[[[[1.0]], [[-2.0]]]], size=(MICRO, 2, 5, 5)).astype(np.float32)
    out = []
    for _ in range(windows * N):
        out.append((base[rng.permutation(MICRO)], rng.integers(0, 3, size=MICRO).astype(np.int32)))
    return out, base


def train_with_driver(p, batches):
    net, loss, opt = build(p)
    trainer = ms_accum.GradientAccumulation(net, loss, opt)
    trainer.train_process(1, numpy_dataset(batches), N, ckpt_path=None, log_every=0)
    return net


def test_driver_window_equals_the_large_batch_in_training_mode(exec_mode):
    batches, base = equal_statistics_batches()
    net = train_with_driver(0.0, batches)
    assert net.training, "the driver must leave the network in training mode, as Model.train does"
    trainable = {p.name for p in net.trainable_params()}

    def large_batch(windows):
        ref_net, ref_loss, ref_opt = build(0.0)
        ref_net.set_train(True)
        step = nn.TrainOneStepCell(nn.WithLossCell(ref_net, ref_loss), ref_opt)
        for window in windows:
            step(*map(Tensor, concat(window)))
        return {k: v for k, v in params_of(ref_net).items() if k in trainable}
    assert_equals_large_batch({k: v for k, v in params_of(net).items() if k in trainable}, large_batch,
                              [batches[:N], batches[N:2 * N]], context=f"BatchNorm in training mode, {exec_mode}")
    # BatchNorm updated its moving mean once per micro-batch: 8 updates from 0 towards the channel means.
    channel_mean = base.mean(axis=(0, 2, 3))
    np.testing.assert_allclose(net.bn.moving_mean.asnumpy(), (1 - MOMENTUM ** (2 * N)) * channel_mean, rtol=1e-4)


def test_driver_applies_dropout(exec_mode):
    batches, _ = equal_statistics_batches(windows=1)
    without = params_of(train_with_driver(0.0, batches))
    with_dropout = params_of(train_with_driver(0.5, batches))
    changed = max(np.abs(with_dropout[k] - without[k]).max() for k in without if k.startswith("conv"))
    assert changed > 1e-4, "Dropout(p=0.5) trained exactly like no dropout: the network was not in training mode"
