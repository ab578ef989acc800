"""Learning-rate scaling rules for a changing global batch: the factor f and the progress increment of a window,
on the host and in a graph (PYNATIVE, ms.jit, GRAPH_MODE), their limits, and the choice of AdaScale's form from the
optimizer.

The truth is the rules' formulas written out here, AdaScale's gain in its trace form (tr(Sigma)/G0 + |G|^2) /
(tr(Sigma)/G + |G|^2), and hand-computed values.
"""
import itertools
import math

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

from ms_accum.core.lr_scaling import (SCALING_RULES, adascale_gain, resolve_scaling_rule, scaling_on_device,
                                      scaling_on_host)
from ms_accum.core.noise_scale import noise_scale_of

CONCRETE = ("none", "linear", "sqrt", "adascale_sgd", "adascale_adam")


def test_rules_by_hand():
    """G = 256, G0 = 64, B = 64: r = 4 * 128 / 320 = 1.6."""
    expected = {"none": (1.0, 4.0), "linear": (4.0, 4.0), "sqrt": (2.0, 4.0), "adascale_sgd": (1.6, 1.6),
                "adascale_adam": (math.sqrt(1.6), 1.6)}
    for rule, want in expected.items():
        assert scaling_on_host(rule, 256.0, 64.0, 64.0) == pytest.approx(want, rel=1e-15), rule


@pytest.mark.parametrize("global_batch, reference_batch", [(256.0, 64.0), (64.0, 256.0), (96.0, 64.0), (64.0, 64.0)])
def test_adascale_gain_is_the_trace_form_and_lies_between_one_and_the_ratio(global_batch, reference_batch):
    ratio = global_batch / reference_batch
    for grad_sq, trace in itertools.product((1e-3, 0.5, 2.0), (0.0, 1e-2, 3.0, 700.0)):
        gain = adascale_gain(global_batch, reference_batch, trace / grad_sq)
        truth = (trace / reference_batch + grad_sq) / (trace / global_batch + grad_sq)
        assert gain == pytest.approx(truth, rel=1e-12), (grad_sq, trace)
        assert min(1.0, ratio) - 1e-12 <= gain <= max(1.0, ratio) + 1e-12


@pytest.mark.parametrize("global_batch, reference_batch", [(256.0, 64.0), (64.0, 256.0), (100.0, 30.0)])
def test_adascale_limits(global_batch, reference_batch):
    """B -> 0: r -> 1 (no noise: a larger batch buys nothing); B -> inf: r -> G / G0 (the linear rule)."""
    ratio = global_batch / reference_batch
    assert adascale_gain(global_batch, reference_batch, 0.0) == pytest.approx(1.0, rel=1e-15)
    assert adascale_gain(global_batch, reference_batch, 1e-9) == pytest.approx(1.0, rel=1e-9)
    assert adascale_gain(global_batch, reference_batch, 1e12) == pytest.approx(ratio, rel=1e-9)
    assert adascale_gain(global_batch, reference_batch, math.inf) == ratio
    gains = [adascale_gain(global_batch, reference_batch, noise) for noise in (0.0, 1.0, 10.0, 100.0, 1e3, 1e5)]
    assert gains == sorted(gains, reverse=ratio < 1), "r moves monotonically from 1 to G / G0 as B grows"
    assert scaling_on_host("adascale_sgd", global_batch, reference_batch, 1e12)[0] == pytest.approx(
        scaling_on_host("linear", global_batch, reference_batch)[0], rel=1e-9)
    assert scaling_on_host("adascale_adam", global_batch, reference_batch, 1e12)[0] == pytest.approx(
        scaling_on_host("sqrt", global_batch, reference_batch)[0], rel=1e-9)


def test_no_estimate_gives_a_gain_of_one():
    """B NaN (before the first estimate, or a smoothed |G|^2 <= 0): the rate is not raised, a window counts as one
    reference step."""
    for rule in ("adascale_sgd", "adascale_adam"):
        assert scaling_on_host(rule, 256.0, 64.0, math.nan) == (1.0, 1.0)
    assert math.isnan(noise_scale_of(0.0, 5.0)) and math.isnan(noise_scale_of(-1.0, 5.0))


def test_other_rules_ignore_the_noise_scale():
    for rule in ("none", "linear", "sqrt"):
        assert scaling_on_host(rule, 192.0, 64.0, math.nan) == scaling_on_host(rule, 192.0, 64.0, 5.0)
        assert scaling_on_host(rule, 192.0, 64.0, math.nan)[1] == 3.0


@pytest.mark.parametrize("optimizer, expected", [
    (lambda p: nn.SGD(p, 0.1), "adascale_sgd"),
    (lambda p: nn.Momentum(p, 0.1, 0.9), "adascale_sgd"),
    (lambda p: nn.ASGD(p, 0.1), "adascale_sgd"),
    (lambda p: nn.Adam(p, 1e-3), "adascale_adam"),
    (lambda p: nn.AdamWeightDecay(p, 1e-3), "adascale_adam"),
    (lambda p: nn.LazyAdam(p, 1e-3), "adascale_adam"),
    (lambda p: nn.AdaMax(p, 1e-3), "adascale_adam"),
    (lambda p: nn.RMSProp(p, 1e-3), "adascale_adam"),
])
def test_adascale_form_detected_from_the_optimizer(optimizer, expected):
    net = nn.Dense(3, 2)
    assert resolve_scaling_rule("T", "adascale", optimizer(net.trainable_params())) == expected
    for rule in CONCRETE:
        assert resolve_scaling_rule("T", rule, optimizer(net.trainable_params())) == rule


def test_adascale_refuses_an_optimizer_it_does_not_know():
    net = nn.Dense(3, 2)

    class MyOptimizer(nn.Optimizer):
        def construct(self, gradients):
            return gradients
    for optimizer in (nn.Lamb(net.trainable_params(), 1e-3), nn.Adagrad(net.trainable_params(), 1e-3),
                      MyOptimizer(0.1, net.trainable_params()), None):
        with pytest.raises(ValueError, match=r"For 'T', 'lr_scaling'='adascale' must know whether the optimizer is "
                                             r"SGD-like .* but got \w+, which it does not recognise .* Pass "
                                             r"lr_scaling='adascale_sgd' or 'adascale_adam'"):
            resolve_scaling_rule("T", "adascale", optimizer)


def test_argument_errors():
    with pytest.raises(ValueError, match=r"For 'T', 'lr_scaling' must be one of \['none', 'linear', 'sqrt', "
                                         r"'adascale', 'adascale_sgd', 'adascale_adam'\], but got 'cubic'"):
        resolve_scaling_rule("T", "cubic")
    for rule in (None, True, 2):
        with pytest.raises(TypeError, match=rf"For 'T', 'lr_scaling' must be a str, one of \['none', .*\], but got "
                                            rf"{rule!r} of type {type(rule).__name__}\. Pass 'none'"):
            resolve_scaling_rule("T", rule)
    with pytest.raises(ValueError, match=r"For 'lr_scaling', 'rule' must be one of .* but got 'adascale'"):
        scaling_on_host("adascale", 128.0, 64.0, 1.0)  # resolved first, from the optimizer
    with pytest.raises(ValueError, match=r"For 'scaling_on_host', 'reference_batch' must be a finite number > 0, but "
                                         r"got 0.0"):
        scaling_on_host("linear", 128.0, 0.0)
    with pytest.raises(ValueError, match=r"For 'adascale_gain', 'global_batch' must be a finite number > 0, but "
                                         r"got inf"):
        adascale_gain(math.inf, 64.0, 1.0)
    assert set(SCALING_RULES) == set(CONCRETE) | {"adascale"}


# the grid: batches, and smoothed estimates with no estimate (|G|^2 <= 0, tr NaN), a negative tr(Sigma) (reads 0),
# B far below and far above the batches
GRID_BATCHES = [(64.0, 64.0), (256.0, 64.0), (48.0, 64.0), (1000.0, 24.0), (96.0, 128.0)]
GRID_ESTIMATES = [(1.0, 0.0), (1.0, 64.0), (0.25, 100.0), (2.0, 1e-4), (1e-6, 500.0), (0.0, 5.0), (-1.0, 5.0),
                  (1.0, math.nan), (1.0, -3.0), (3.0, 1e7)]


def _grid():
    rows = [(g, g0, sq, tr) for (g, g0), (sq, tr) in itertools.product(GRID_BATCHES, GRID_ESTIMATES)]
    return [np.array(column, np.float32) for column in zip(*rows)]


def _host(rule, columns):
    return [scaling_on_host(rule, float(g), float(g0), noise_scale_of(float(sq), float(tr)))
            for g, g0, sq, tr in zip(*columns)]


class ScalingCell(nn.Cell):
    """The device rule inside a compiled Cell (GRAPH_MODE)."""

    def __init__(self, rule):
        super().__init__()
        self.rule = rule

    def construct(self, global_batch, reference_batch, grad_sq, trace):
        return scaling_on_device(self.rule, global_batch, reference_batch, grad_sq, trace)


@pytest.mark.parametrize("where", ["pynative", "jit", "graph"])
@pytest.mark.parametrize("rule", CONCRETE)
def test_device_rule_is_the_hosts_on_a_grid(rule, where):
    """scaling_on_device, run eagerly, inside ms.jit and in a GRAPH_MODE Cell, against the host's rules on the grid
    (elementwise over 1-D Tensors), to float32 rounding."""
    columns = _grid()
    tensors = [Tensor(column) for column in columns]
    if where == "graph":
        ms.set_context(mode=ms.GRAPH_MODE)
        factor, increment = ScalingCell(rule)(*tensors)
    elif where == "jit":
        @ms.jit
        def compiled(global_batch, reference_batch, grad_sq, trace):
            return scaling_on_device(rule, global_batch, reference_batch, grad_sq, trace)
        factor, increment = compiled(*tensors)
    else:
        factor, increment = scaling_on_device(rule, *tensors)
    want = np.array(_host(rule, columns))
    np.testing.assert_allclose(factor.asnumpy(), want[:, 0], rtol=2e-6, err_msg=f"factor, rule {rule}")
    np.testing.assert_allclose(increment.asnumpy(), want[:, 1], rtol=2e-6, err_msg=f"increment, rule {rule}")


def test_device_limits():
    """On the device too: B = 0 gives r = 1 exactly; B far above G gives G / G0 to float32 rounding."""
    for grad_sq, trace, want in ((1.0, 0.0, 1.0), (1e-6, 1e6, 4.0)):
        factor, increment = scaling_on_device("adascale_sgd", Tensor(256.0, ms.float32), Tensor(64.0, ms.float32),
                                              Tensor(grad_sq, ms.float32), Tensor(trace, ms.float32))
        assert float(factor) == pytest.approx(want, rel=1e-6) and float(increment) == pytest.approx(want, rel=1e-6)
