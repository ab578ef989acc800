"""The optimizer's learning rate read from progress: a rewired optimizer steps bit for bit as the original when
f = 1 and progress is the update index, and at schedule(floor(progress)) x f when a window's end writes them.

The reference is the same MindSpore optimizer built without ms_accum's code, at the learning rate expected: its own
float, list or LearningRateSchedule for the bit-for-bit tests; a list of the expected values (the schedule read by
calling MindSpore's own schedule Cell at the reference step, times f from the rules' formulas in float64) for the
window tests.
"""
import math
from fractions import Fraction

import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from ms_accum.core.lr_scaling import scaling_on_host
from ms_accum.core.noise_scale import noise_scale_of
from ms_accum.core.progress_lr import (ProgressLearningRate, ProgressState, advance_progress, prepare_window_rate,
                                       rewire_learning_rate)
from ms_accum.core.compiled import write_parameter

OPTIMIZERS = {
    "sgd": lambda params, lr: nn.SGD(params, learning_rate=lr),
    "momentum": lambda params, lr: nn.Momentum(params, learning_rate=lr, momentum=0.9),
    "adam": lambda params, lr: nn.Adam(params, learning_rate=lr),
    "adamw": lambda params, lr: nn.AdamWeightDecay(params, learning_rate=lr, weight_decay=0.01),
}
RATES = {
    "float": lambda: 0.05,
    "list": lambda: [0.05, 0.02, 0.08, 0.03, 0.01, 0.04, 0.06, 0.07] * 4,
    "schedule": lambda: nn.CosineDecayLR(0.001, 0.05, 12),
}


def weights(seed=0):
    """Two Parameters, identical for the same seed."""
    rng = np.random.default_rng(seed)
    return [Parameter(Tensor(rng.normal(size=(3, 4)).astype(np.float32)), name="w"),
            Parameter(Tensor(rng.normal(size=(4,)).astype(np.float32)), name="b")]


def gradients(count, seed=1):
    """Gradient tuples for `count` steps, mutable: as constants, each would compile a graph of its own."""
    rng = np.random.default_rng(seed)
    return [ms.mutable((Tensor(rng.normal(size=(3, 4)).astype(np.float32)),
                        Tensor(rng.normal(size=(4,)).astype(np.float32)))) for _ in range(count)]


def build(optimizer, lr, groups):
    params = weights()
    if groups:  # the weight in a group of its own rate, the bias at the optimizer's
        params = [{"params": [params[0]], "lr": 0.02}, {"params": [params[1]]}]
    return OPTIMIZERS[optimizer](params, RATES[lr]())


def values(optimizer):
    return [p.asnumpy().copy() for p in optimizer.parameters]


@pytest.mark.parametrize("groups", [False, True], ids=["one-rate", "groups"])
@pytest.mark.parametrize("lr", list(RATES))
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_rewired_optimizer_with_unit_factor_is_the_original_bit_for_bit(optimizer, lr, groups, exec_mode):
    """f = 1 and progress = the update index, written from the host before each step: every step equals the
    original optimizer's exactly."""
    original, rewired = build(optimizer, lr, groups), build(optimizer, lr, groups)
    names = {p.name for p in rewired.get_parameters()}
    state = ProgressState()
    rewire_learning_rate(rewired, state)
    assert names <= {p.name for p in rewired.get_parameters()}, "the optimizer's checkpoint names are kept"
    schedule = RATES[lr]()
    for update, grads in enumerate(gradients(5)):
        state.set_progress(update)
        original(grads)
        rewired(grads)
        for got, want in zip(values(rewired), values(original)):
            assert np.array_equal(got, want), f"update {update}: {np.abs(got - want).max()}"
        first_group = 0.02 if groups else base_rate(schedule, update)  # the rate recorded for telemetry
        assert float(state.applied_rate.asnumpy()) == pytest.approx(first_group, rel=1e-6), update


class WindowEnd(nn.Cell):
    """A window's end as the engine runs it: the factor written and G0 set, the optimizer stepped unless the
    window is skipped, then progress advanced unless skipped."""

    def __init__(self, optimizer, state, rule):
        super().__init__()
        self.optimizer = optimizer
        self.rule = rule
        self.lr_steps, self.lr_fraction, self.lr_factor, self.lr_reference = state.parameters

    @ms.jit
    def construct(self, grads, items, grad_sq, trace, skipped):
        lr_params = (self.lr_steps, self.lr_fraction, self.lr_factor, self.lr_reference)
        increment = prepare_window_rate(self.rule, lr_params, items, grad_sq, trace)
        grads = ops.depend(grads, increment)
        out = increment
        if not skipped:
            out = ops.depend(out, self.optimizer(grads))
        return ops.depend(out, advance_progress(lr_params, increment, skipped))


# each window: its items G over all devices, the smoothed |G|^2 and tr(Sigma) after its record, whether it is skipped
WINDOWS = [(64.0, 0.0, 0.0, False), (64.0, 0.0, 0.0, False), (128.0, 2.0, 40.0, False), (256.0, 1.0, 90.0, False),
           (96.0, 1.0, 150.0, True), (192.0, 0.5, 300.0, False), (64.0, 0.5, 300.0, False), (320.0, 0.25, 600.0, False)]
CASES = [("linear", "sgd", "float"), ("sqrt", "adam", "list"), ("adascale_sgd", "momentum", "schedule"),
         ("adascale_adam", "adamw", "schedule"), ("none", "momentum", "list"), ("linear", "adamw", "list")]


def base_rate(schedule, step):
    """The rate of reference step `step` from a float, a list, or MindSpore's own schedule Cell."""
    if isinstance(schedule, nn.Cell):
        return float(schedule(Tensor([step], ms.int32)).asnumpy().reshape(()))
    return schedule[step] if isinstance(schedule, list) else schedule


def expected_rates(rule, lr, reference_batch=None):
    """The learning rate of each applied window, from the rules' formulas (float64) and MindSpore's own schedule,
    and the progress after the run."""
    schedule = RATES[lr]()
    progress, rates = 0.0, []
    for items, grad_sq, trace, skipped in WINDOWS:
        reference_batch = reference_batch or items
        noise = noise_scale_of(grad_sq, trace)
        factor, increment = scaling_on_host(rule, items, reference_batch, noise)
        if skipped:
            continue
        fraction = progress - math.floor(progress)
        assert min(fraction, 1 - fraction) > 1e-4 or fraction == 0, "the case must not sit on a step's edge"
        rates.append(np.float32(base_rate(schedule, math.floor(progress))) * factor)
        progress += increment
    return rates, progress


@pytest.mark.parametrize("rule, optimizer, lr", CASES)
def test_window_end_applies_the_schedule_at_progress_times_the_factor(rule, optimizer, lr, exec_mode):
    """Windows of changing G (one skipped) through a compiled window end: each update equals the same optimizer's
    step at schedule(floor(progress)) x f, the reference built at those rates; progress and f end as the rules
    say."""
    rewired = OPTIMIZERS[optimizer](weights(), RATES[lr]())
    state = ProgressState()
    window_end = WindowEnd(rewire_learning_rate(rewired, state), state, rule)
    rates, progress = expected_rates(rule, lr)
    reference = OPTIMIZERS[optimizer](weights(), [float(rate) for rate in rates])
    grads_of = gradients(len(WINDOWS))
    applied = iter(rates)
    for index, ((items, grad_sq, trace, skipped), grads) in enumerate(zip(WINDOWS, grads_of)):
        window_end(grads, Tensor(items, ms.float32), Tensor(grad_sq, ms.float32), Tensor(trace, ms.float32),
                   Tensor(skipped))
        if not skipped:
            reference(grads)
            assert float(state.applied_rate.asnumpy()) == pytest.approx(next(applied), rel=1e-6, abs=1e-9), index
        for got, want in zip(values(rewired), values(reference)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"window {index}")
    assert state.progress == pytest.approx(progress, rel=1e-6)
    assert float(state.reference_batch.asnumpy()) == WINDOWS[0][0]
    items, grad_sq, trace, _ = WINDOWS[-1]
    assert float(state.factor.asnumpy()) == pytest.approx(
        scaling_on_host(rule, items, WINDOWS[0][0], noise_scale_of(grad_sq, trace))[0], rel=1e-6)


def test_a_given_reference_batch_is_kept():
    state = ProgressState(reference_batch=32)
    rewired = OPTIMIZERS["sgd"](weights(), RATES["list"]())
    window_end = WindowEnd(rewire_learning_rate(rewired, state), state, "linear")
    reference = OPTIMIZERS["sgd"](weights(), [float(rate) for rate in expected_rates("linear", "list", 32.0)[0]])
    for (items, grad_sq, trace, skipped), grads in zip(WINDOWS, gradients(len(WINDOWS))):
        window_end(grads, Tensor(items, ms.float32), Tensor(grad_sq, ms.float32), Tensor(trace, ms.float32),
                   Tensor(skipped))
        if not skipped:
            reference(grads)
    for got, want in zip(values(rewired), values(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert float(state.reference_batch.asnumpy()) == 32.0
    assert state.progress == pytest.approx(sum(w[0] for w in WINDOWS if not w[3]) / 32.0)


class Advance(nn.Cell):
    def __init__(self, state):
        super().__init__()
        self.lr_steps, self.lr_fraction, self.lr_factor, self.lr_reference = state.parameters

    @ms.jit
    def construct(self, increment):
        return advance_progress((self.lr_steps, self.lr_fraction, self.lr_factor, self.lr_reference), increment)


def test_fractional_progress_does_not_drift():
    """3,000 increments of float32(1/3): whole steps in int32 and a fraction in [0, 1) keep the sum to float32
    rounding of the fraction, where one float32 counter near 1,000 rounds every increment to 6e-5."""
    state = ProgressState()
    increment = Tensor(1.0 / 3.0, ms.float32)
    advance = Advance(state)
    for _ in range(3000):
        advance(increment)
    exact = 3000 * float(np.float32(1.0 / 3.0))
    assert abs(state.progress - exact) < 1e-4, (state.progress, exact)
    assert 0.0 <= float(state.fraction.asnumpy()) < 1.0


@pytest.mark.parametrize("numerator, denominator", [(5, 3), (1, 3), (7, 3), (4, 7), (9, 7), (10, 9), (3, 10)])
def test_whole_steps_are_reached_where_the_exact_sum_reaches_them(numerator, denominator):
    """Increments of float32(p / q), q <= 10, from progress 1: after every window the whole steps are those of the
    exact sum (fractions.Fraction), also where it is whole. Without the snap, 1 + 3 x float32(5/3) was 5.9999998,
    and the schedule read entry 5 where entry 6 was due (found by a user's run with N following {0: 3, 1: 5})."""
    state = ProgressState()
    state.set_progress(1)
    advance = Advance(state)
    increment = Tensor(numerator / denominator, ms.float32)
    for window in range(1, 3 * denominator + 1):
        advance(increment)
        exact = 1 + Fraction(numerator * window, denominator)
        assert int(state.steps.asnumpy()[0]) == math.floor(exact), (window, state.progress, float(exact))
        assert 0.0 <= float(state.fraction.asnumpy()) < 1.0


def test_a_list_reads_its_last_entry_beyond_its_end():
    """Given as a list, or as the optimizer's own list (which rewiring wraps): past its end, its last entry (where
    MindSpore's Gather fails on CPU; a loss counting tokens has reference steps no check can count in advance)."""
    state = ProgressState()
    rate = ProgressLearningRate([0.1, 0.2, 0.3], state)
    optimizer = rewire_learning_rate(nn.SGD(weights(), learning_rate=[0.1, 0.2, 0.3]), ProgressState())
    own = optimizer.learning_rate.progress_state
    for progress, want in ((1, 0.2), (2, 0.3), (7, 0.3)):
        state.set_progress(progress)
        own.set_progress(progress)
        assert float(rate(Tensor([0], ms.int32)).asnumpy().reshape(())) == pytest.approx(want), progress
        assert float(optimizer.get_lr().asnumpy().reshape(())) == pytest.approx(want), progress


def test_optimizer_checkpoint_holds_the_progress(tmp_path):
    state = ProgressState()
    optimizer = rewire_learning_rate(OPTIMIZERS["momentum"](weights(), RATES["list"]()), state)
    state.set_progress(7.25)
    write_parameter(state.factor, 1.5)
    write_parameter(state.reference_batch, 96.0)
    path = str(tmp_path / "optimizer.ckpt")
    ms.save_checkpoint(optimizer, path)
    restored = ProgressState()
    fresh = rewire_learning_rate(OPTIMIZERS["momentum"](weights(), RATES["list"]()), restored)
    ms.load_param_into_net(fresh, ms.load_checkpoint(path))
    assert restored.progress == 7.25
    assert float(restored.factor.asnumpy()) == 1.5 and float(restored.reference_batch.asnumpy()) == 96.0


def test_progress_learning_rate_built_into_an_optimizer(exec_mode):
    """ProgressLearningRate as an optimizer's learning_rate, from a list: the table's entry at floor(progress)."""
    state = ProgressState()
    rates = [0.1, 0.2, 0.3, 0.4]
    optimizer = nn.SGD(weights(), learning_rate=ProgressLearningRate(rates, state))
    reference = nn.SGD(weights(), learning_rate=[0.3 * 2.0, 0.1 * 2.0])
    write_parameter(state.factor, 2.0)
    for progress, grads in zip((2.9, 0.0), gradients(2)):
        state.set_progress(progress)
        optimizer(grads)
        reference(grads)
    for got, want in zip(values(optimizer), values(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


class OwnRate(nn.Momentum):
    def get_lr(self):
        return self.learning_rate * 2.0


def test_refuses_what_cannot_read_progress():
    state = ProgressState()
    net = nn.Dense(3, 2)
    message = r"For 'rewire_learning_rate', the optimizer must read its learning rate through Optimizer.get_lr at " \
              r"each step, but {}. Build the optimizer \(for LARS or OptTFTWrapper, the one it wraps\) with " \
              r"learning_rate=ms_accum.core.progress_lr.ProgressLearningRate\(rate, ProgressState\(\)\), whose " \
              r"state a cell with a learning-rate rule adopts"
    lars = nn.LARS(nn.Momentum(net.trainable_params(), 0.1, 0.9))
    with pytest.raises(ValueError, match=message.format("LARS copies the learning rate of the optimizer it "
                                                        "wraps when it is built")):
        rewire_learning_rate(lars, state)
    with pytest.raises(ValueError, match=message.format("AdaFactor reads its learning rate through its "
                                                        "relative_step.*")):
        rewire_learning_rate(nn.AdaFactor(net.trainable_params()), state)
    with pytest.raises(ValueError, match=message.format("OwnRate overrides get_lr.*")):
        rewire_learning_rate(OwnRate(net.trainable_params(), 0.1, 0.9), state)
    with pytest.raises(TypeError, match=r"For 'rewire_learning_rate', 'optimizer' must be a mindspore.nn.Optimizer, "
                                        r"but got Dense"):
        rewire_learning_rate(net, state)
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    with pytest.raises(TypeError, match=r"'state' must be a ProgressState, but got dict"):
        rewire_learning_rate(optimizer, {})
    rewire_learning_rate(optimizer, state)
    with pytest.raises(ValueError, match=r"it reads it from progress already .* Rewire each optimizer once"):
        rewire_learning_rate(optimizer, state)


@pytest.mark.parametrize("learning_rate, error, message", [
    ("0.1", TypeError, r"'learning_rate' must be a number, a list, a Tensor or a LearningRateSchedule, but got str"),
    (-0.1, ValueError, r"'learning_rate' must hold finite numbers >= 0, but got -0.1"),
    ([0.1, math.nan], ValueError, r"'learning_rate' must hold finite numbers >= 0, but got \[nan\]"),
    ([[0.1, 0.2]], ValueError, r"'learning_rate' must be a number or a non-empty 1-D sequence of numbers, but got "
                               r"2-D float64 of shape \(1, 2\)"),
    ([], ValueError, r"'learning_rate' must be a number or a non-empty 1-D sequence of numbers, but got 1-D "
                     r"float64 of shape \(0,\)"),
])
def test_progress_learning_rate_argument_errors(learning_rate, error, message):
    with pytest.raises(error, match=r"For 'ProgressLearningRate', " + message):
        ProgressLearningRate(learning_rate, ProgressState())


def test_progress_state_argument_errors():
    with pytest.raises(TypeError, match=r"For 'ProgressLearningRate', 'state' must be a ProgressState, but got int"):
        ProgressLearningRate(0.1, 3)
    with pytest.raises(ValueError, match=r"For 'ProgressState', 'reference_batch' must be a finite number > 0, or "
                                         r"None for the first window's items, but got 0"):
        ProgressState(reference_batch=0)
    with pytest.raises(ValueError, match=r"For 'ProgressState', 'progress' must be a number in \[0, 2\*\*31\), but "
                                         r"got -1"):
        ProgressState().set_progress(-1)
