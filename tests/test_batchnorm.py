"""BatchNorm moving statistics under accumulation, with and without adjust_batchnorm_momentum."""
import numpy as np
import pytest

from mindspore import Tensor, nn, ops

import ms_accum
from ms_accum.compat import SyncBatchNormOp


class BNLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3, momentum=0.9)
        self.fc = nn.Dense(3, 1)

    def construct(self, x):
        return ops.mean(self.fc(self.bn(x)))


def micro_batches_with_equal_means(n, size=4, seed=0):
    """n micro-batches whose per-feature means are all (1, 2, 3)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(size, 3)).astype(np.float32)
        out.append(x - x.mean(axis=0) + np.array([1.0, 2.0, 3.0], np.float32))
    return out


def moving_mean_after_window(adjust, steps=4):
    net = BNLoss()
    net.set_train(True)
    if adjust:
        changed = ms_accum.adjust_batchnorm_momentum(net, steps)
        assert [(name, pytest.approx(old), pytest.approx(new)) for name, old, new in changed] == \
            [("bn", pytest.approx(0.9), pytest.approx(0.9 ** (1 / steps)))]
    opt = nn.SGD(net.trainable_params(), 0.1)
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(net, opt, grad_sum)
    for x in micro_batches_with_equal_means(steps):
        forward_backward(Tensor(x))
    return net.bn.moving_mean.asnumpy()


def test_micro_batches_decay_moving_statistics_too_fast(exec_mode):
    # one large batch: 0.9 * 0 + 0.1 * mean; four micro-batches: (1 - 0.9 ** 4) * mean
    np.testing.assert_allclose(moving_mean_after_window(adjust=False), (1 - 0.9 ** 4) * np.array([1, 2, 3]),
                               rtol=1e-5)


def test_adjusted_momentum_matches_the_large_batch(exec_mode):
    np.testing.assert_allclose(moving_mean_after_window(adjust=True), 0.1 * np.array([1, 2, 3]), rtol=1e-5)


def test_accumulation_steps_is_checked():
    with pytest.raises(ValueError, match="For 'adjust_batchnorm_momentum', 'accumulation_steps' must be an int >= 1"):
        ms_accum.adjust_batchnorm_momentum(BNLoss(), 0)


def test_adjusting_twice_does_not_compound():
    net = BNLoss()
    ms_accum.adjust_batchnorm_momentum(net, 4)
    changed = ms_accum.adjust_batchnorm_momentum(net, 4)
    assert changed == [("bn", pytest.approx(0.9), pytest.approx(0.9 ** 0.25))]
    assert 1.0 - net.bn.momentum == pytest.approx(0.9 ** 0.25)
    ms_accum.adjust_batchnorm_momentum(net, 1)
    assert 1.0 - net.bn.momentum == pytest.approx(0.9), "N = 1 must restore the original momentum"
    assert np.isclose(moving_mean_after_window(adjust=True), 0.1 * np.array([1, 2, 3]), rtol=1e-5).all()


def test_a_synchronised_batchnorm_stays_synchronised():
    """nn.SyncBatchNorm across devices trains with a SyncBatchNorm primitive on its group; the adjusted layer
    must keep it (a plain BatchNorm would silently stop sharing the statistics). The group is set up by hand here:
    one CPU process has no devices to synchronise."""
    net = nn.SequentialCell([nn.Dense(4, 4), nn.SyncBatchNorm(4, momentum=0.9)])
    net[1].bn_train = SyncBatchNormOp(epsilon=net[1].eps, momentum=net[1].momentum, group="sync_bn_test",
                                      device_num=4)
    ms_accum.adjust_batchnorm_momentum(net, 4)
    rebuilt = net[1].bn_train
    assert isinstance(rebuilt, SyncBatchNormOp)
    assert (rebuilt.group, rebuilt.device_num) == ("sync_bn_test", 4)
    assert rebuilt.momentum == pytest.approx(1.0 - 0.9 ** 0.25) == net[1].momentum


def test_an_unknown_training_primitive_is_refused_unchanged():
    net = BNLoss()
    net.bn.bn_train = ops.LayerNorm()
    with pytest.raises(TypeError, match=r"For 'adjust_batchnorm_momentum', BatchNorm layer 'bn' \(BatchNorm1d\) "
                                        r"trains with LayerNorm, which ms_accum cannot rebuild"):
        ms_accum.adjust_batchnorm_momentum(net, 4)
    assert 1.0 - net.bn.momentum == pytest.approx(0.9)
