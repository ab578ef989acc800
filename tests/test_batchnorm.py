"""BatchNorm moving statistics under accumulation, with and without adjust_batchnorm_momentum."""
import warnings

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


def moving_mean_after_window(adjust, steps=4, batches=None):
    net = BNLoss()
    net.set_train(True)
    if adjust:
        changed = ms_accum.adjust_batchnorm_momentum(net, steps)
        assert [(name, pytest.approx(old), pytest.approx(new)) for name, old, new in changed] == \
            [("bn", pytest.approx(0.9), pytest.approx(0.9 ** (1 / steps)))]
    opt = nn.SGD(net.trainable_params(), 0.1)
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(net, opt, grad_sum)
    for x in micro_batches_with_equal_means(steps) if batches is None else batches:
        forward_backward(Tensor(x))
    return net.bn.moving_mean.asnumpy()


def test_micro_batches_decay_moving_statistics_too_fast(exec_mode):
    # one large batch: 0.9 * 0 + 0.1 * mean; four micro-batches: (1 - 0.9 ** 4) * mean
    np.testing.assert_allclose(moving_mean_after_window(adjust=False), (1 - 0.9 ** 4) * np.array([1, 2, 3]),
                               rtol=1e-5)


def test_adjusted_momentum_matches_the_large_batch(exec_mode):
    np.testing.assert_allclose(moving_mean_after_window(adjust=True), 0.1 * np.array([1, 2, 3]), rtol=1e-5)


def test_adjusted_moving_mean_weighs_later_micro_batches_more():
    """docs/models.md: with unequal micro-batch means the window adds sum_k (1 - m') m'^(N-1-k) mean_k (m' = m^(1/N):
    weights summing to 1 - m, the last micro-batch's 1.08 times the first's), not the large batch's (1 - m) times
    their mean (a new user's trial read the docstring's 'average' as the plain one)."""
    steps, momentum = 4, 0.9 ** 0.25
    rng = np.random.default_rng(3)
    batches = [rng.normal(loc=2.0 * k, size=(4, 3)).astype(np.float32) for k in range(steps)]
    means = np.stack([x.mean(axis=0) for x in batches]).astype(np.float64)
    weights = (1 - momentum) * momentum ** np.arange(steps - 1, -1, -1)
    assert weights.sum() == pytest.approx(0.1)
    moving = moving_mean_after_window(adjust=True, steps=steps, batches=batches)
    np.testing.assert_allclose(moving, weights @ means, rtol=1e-5)
    large_batch = 0.1 * means.mean(axis=0)
    assert np.abs(moving - large_batch).max() > 100 * 1e-5 * np.abs(large_batch).max()


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


class DropoutLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 1)
        self.drop = nn.Dropout(p=0.5)

    def construct(self, x):
        return ops.mean(self.drop(self.fc(x)))


class PlainLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 1)

    def construct(self, x):
        return ops.mean(self.fc(x))


def first_calls(cell_of, net, calls=2):
    """The warnings of `calls` calls of the cell `cell_of` builds over `net` (an SGD on its parameters)."""
    opt = nn.SGD(net.trainable_params(), 0.1)
    cell = cell_of(net, opt)
    x = Tensor(np.ones((4, 3), np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(calls):
            cell(x)
    return [str(w.message) for w in caught if "training mode" in str(w.message)]


CELLS = {"TrainForwardBackward": lambda net, opt: ms_accum.TrainForwardBackward(
    net, opt, opt.parameters.clone(prefix="grad_sum", init="zeros")),
         "TrainAccuStepsCell": lambda net, opt: ms_accum.TrainAccuStepsCell(net, opt, gradient_accumulation_steps=2)}


@pytest.mark.parametrize("owner", sorted(CELLS))
def test_a_network_left_in_inference_mode_is_warned_of_once(owner):
    """MindSpore builds every Cell in inference mode, and a training cell called from a loop does not switch it: a
    BatchNorm network would normalise with its moving statistics, dropout would drop nothing."""
    shown = first_calls(CELLS[owner], BNLoss())
    assert shown == [f"For '{owner}', the network must be in training mode to train, but its layer 'bn' "
                     f"(BatchNorm1d) is in inference mode (MindSpore builds every Cell so): BatchNorm normalises "
                     f"with its moving statistics and leaves them as they are, dropout drops nothing. Call "
                     f"set_train(True) on the cell (or the network) before training, as mindspore.train.Model "
                     f"does."]
    assert len(first_calls(CELLS[owner], DropoutLoss())) == 1


@pytest.mark.parametrize("owner", sorted(CELLS))
def test_a_network_in_training_mode_or_without_such_layers_is_not_warned_of(owner):
    trained = BNLoss()
    trained.set_train(True)
    frozen = BNLoss()  # BatchNorm frozen on purpose: the network trains, its BatchNorm does not
    frozen.set_train(True)
    frozen.bn.set_train(False)
    statistics_frozen = BNLoss()  # normalises by its moving statistics in either mode: nothing to warn of
    statistics_frozen.bn = nn.BatchNorm1d(3, momentum=0.9, use_batch_statistics=False)
    for net in (trained, frozen, PlainLoss(), statistics_frozen):
        assert first_calls(CELLS[owner], net) == []
