"""N chosen for goodput: the model's best N against a brute force in exact rational arithmetic, hand-computed cases
and the limits; the fit of the window times; the policy's calibration, its frozen state and a resumed run's
decisions; the device rule against the host's on a grid (eagerly, inside ms.jit, in GRAPH_MODE)."""
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

from ms_accum.core.goodput import (GoodputAccumulation, best_steps, efficiency, fit_window_time, goodput,
                                   goodput_steps_on_device, window_time)
from ms_accum.core.noise_scale import noise_scale_of


def brute_force(noise_scale, items, micro_time, end_time, min_steps, max_steps):
    """The smallest N of the highest goodput, each goodput computed exactly (Fractions): no rounding decides."""
    values = [goodput(n, Fraction(items), Fraction(noise_scale), Fraction(micro_time), Fraction(end_time),
                      Fraction(items)) for n in range(min_steps, max_steps + 1)]
    return min_steps + values.index(max(values))


GRID = list(itertools.product(
    (0.0, 0.5, 3.0, 64.0, 100.0, 384.0, 1000.0, 5e4),   # B, items
    (8.0, 32.0, 96.0),                                   # c, items per micro-batch over all devices
    (0.25, 0.5, 0.01),                                   # t_micro, s
    (0.0, 0.125, 1.0, 3.0),                              # t_end, s
    ((1, 64), (2, 16), (4, 9))))                         # bounds


def test_best_steps_is_the_brute_forces_argmax():
    for noise, items, micro_time, end_time, (low, high) in GRID:
        assert best_steps(noise, items, micro_time, end_time, low, high) == \
            brute_force(noise, items, micro_time, end_time, low, high), (noise, items, micro_time, end_time, low, high)


def test_best_steps_by_hand():
    """Q = t_end B / (t_micro c): the smallest n >= 1 with n (n + 1) >= Q."""
    assert best_steps(384.0, 32.0, 0.5, 1.0, 1, 64) == 5        # Q = 24: 4 * 5 < 24 <= 5 * 6
    assert best_steps(360.0, 32.0, 0.5, 1.0, 1, 64) == 5        # Q = 22.5
    assert best_steps(320.0, 32.0, 0.5, 1.0, 1, 64) == 4        # Q = 20 = 4 * 5: a tie of 4 and 5, the smaller
    exact = (Fraction(32), Fraction(320), Fraction(1, 2), Fraction(1), Fraction(32))
    assert goodput(4, *exact) == goodput(5, *exact) > goodput(3, *exact)
    assert best_steps(6.0, 1.0, 1.0, 6.0, 1, 64) == 6           # Q = 36: 5 * 6 < 36 <= 6 * 7
    assert best_steps(384.0, 32.0, 0.5, 1.0, 6, 64) == 6        # clipped up
    assert best_steps(384.0, 32.0, 0.5, 1.0, 1, 3) == 3         # clipped down
    # goodput itself, by hand: 4 x 32 = 128 items in 4 x 0.5 + 1 = 3 s, efficiency (128 + 64) / (128 + 128)
    assert goodput(4, 32.0, 128.0, 0.5, 1.0, 64.0) == pytest.approx(128 / 3 * 0.75, rel=1e-15)
    assert window_time(4, 0.5, 1.0) == 3.0 and efficiency(64.0, 64.0, 7.0) == 1.0


@pytest.mark.parametrize("bounds", [(2, 16), (1, 64), (5, 6)])
def test_best_steps_limits(bounds):
    """B -> inf with t_end > 0: the fastest throughput, max_steps; B -> 0 or t_end = 0: the smallest G."""
    low, high = bounds
    assert best_steps(math.inf, 32.0, 0.5, 1.0, low, high) == high
    assert best_steps(1e15, 32.0, 0.5, 1.0, low, high) == high
    assert best_steps(0.0, 32.0, 0.5, 1.0, low, high) == low
    assert best_steps(1e-9, 32.0, 0.5, 1.0, low, high) == low
    assert best_steps(1e6, 32.0, 0.5, 0.0, low, high) == low
    throughput = [n * 32.0 / window_time(n, 0.5, 1.0) for n in range(low, high + 1)]
    assert throughput == sorted(throughput), "with t_end > 0 throughput grows with N"


def test_best_steps_errors():
    with pytest.raises(ValueError, match=r"For 'best_steps', 'noise_scale' must be a number >= 0 \(math.inf "
                                         r"allowed\), but got nan"):
        best_steps(math.nan, 32.0, 0.5, 1.0, 1, 8)
    with pytest.raises(ValueError, match=r"For 'best_steps', 'micro_time' must be a finite number > 0, but got 0"):
        best_steps(1.0, 32.0, 0, 1.0, 1, 8)
    with pytest.raises(ValueError, match=r"For 'best_steps', 'end_time' must be a finite number >= 0, but got -1"):
        best_steps(1.0, 32.0, 0.5, -1, 1, 8)
    with pytest.raises(ValueError, match=r"For 'best_steps', 'max_steps' must be an int >= 4, but got 3"):
        best_steps(1.0, 32.0, 0.5, 1.0, 4, 3)


def test_fit_window_time():
    steps = [2, 2, 2, 4, 4, 4, 8, 8]
    exact = [window_time(n, 0.25, 1.5) for n in steps]
    assert fit_window_time(steps, exact) == pytest.approx((0.25, 1.5), rel=1e-12)
    noisy = list(exact)
    noisy[0] *= 2.0  # a slow window at each N (the machine busy): the fastest at each N ignores it
    noisy[3] *= 2.0
    assert fit_window_time(steps, noisy) == pytest.approx((0.25, 1.5), rel=1e-12)
    # most windows at the smaller N slowed by other work (as in a CI run under pytest-xdist, where medians said the
    # time fell with N): the fastest window at each N still gives the line
    busy = [window_time(2, 0.25, 1.5) * factor for factor in (6.0, 1.0, 9.0, 3.0)] + [window_time(4, 0.25, 1.5)] * 2
    assert fit_window_time([2] * 4 + [4] * 2, busy) == pytest.approx((0.25, 1.5), rel=1e-12)
    # time about proportional to N, the line's intercept below 0 (-0.1): t_end = 0, t_micro through the origin
    assert fit_window_time([2, 4], [1.0, 2.1]) == pytest.approx(((2 * 1.0 + 4 * 2.1) / 20, 0.0), rel=1e-12)


@pytest.mark.parametrize("steps, seconds, message", [
    ([2, 2], [1.0, 1.1], r"'steps' must hold at least two different N to tell a micro-batch's time from a window "
                         r"end's, but got \[2\]"),
    ([2, 4], [2.0, 1.9], r"the window time must grow with N, but the fastest times were N=2: 2 s, N=4: 1.9 s"),
    ([2, 4], [1.0], r"'steps' and 'seconds' must have one entry per window, but got 2 and 1 entries"),
    ([2, 4], [1.0, 0.0], r"'seconds' must be a finite number > 0, but got 0.0"),
])
def test_fit_window_time_errors(steps, seconds, message):
    with pytest.raises(ValueError, match=r"For 'fit_window_time', " + message):
        fit_window_time(steps, seconds)


TIMES = {2: 2.0, 4: 3.0}  # t_micro 0.5, t_end 1.0


def run_policy(policy, noises, start=0, current=None, times=TIMES):
    """Drive `policy` as a trainer would from window `start`: decide the next N, then report the window's time.
    Returns the N of each window."""
    current = current or policy.initial_steps
    chosen = []
    for update in range(start, len(noises)):
        chosen.append(current)
        following = policy.next_steps(current, update, noises[update], 32.0)
        policy.observe(update, current, times.get(current, window_time(current, 0.5, 1.0)))
        current = following
    return chosen


NOISES = [math.nan] * 3 + [384.0] * 9 + [1000.0] * 10 + [50.0] * 10 + [math.nan] * 5


def test_calibration_then_decisions(capsys):
    """Three windows at N=2, three at N=4 (the policy's, whatever the noise), the constants frozen at the sixth;
    the first decision at the end of the window after it, then one every 5 windows from the frozen constants
    (Q = t_end B / (t_micro c)); NaN keeps N. The constants are printed once, with the window (counted from 1)
    whose N the first decision sets (a new user's trial read them from the policy's attributes)."""
    policy = GoodputAccumulation(2, 64, interval=5, calibration_windows=3)
    chosen = run_policy(policy, NOISES)
    assert policy.frozen and policy.device_constants == pytest.approx((0.5, 1.0))
    assert capsys.readouterr().out == (
        "ms_accum: goodput calibrated on windows 2 to 6 (the fastest: N=2: 2 s, N=4: 3 s): t_micro = 0.5 s a "
        "micro-batch, t_end = 1 s a window's end; N is chosen for goodput from window 8 on, every 5 windows.\n")
    assert chosen[:6] == [2, 2, 2, 4, 4, 4]
    # window 5 is the last of the calibration, window 6's N decided before its time came in: 4; the first decision
    # after window 6 (B = 384: Q = 24, N = 5; it stayed 4 until the decision after window 9, interval - 1 windows
    # more), then after 9 (the same), after 14 and 19 (B = 1000: Q = 62.5, N = 8), after 24 and 29 (B = 50:
    # Q = 3.125, N = 2), after 34 (no estimate: N stays)
    assert chosen[6:] == [4] + [5] * 8 + [8] * 10 + [2] * 12, chosen


def test_policy_with_given_constants_decides_from_the_first_interval():
    policy = GoodputAccumulation(2, 64, interval=4, micro_time=0.5, end_time=1.0)
    assert policy.frozen and policy.calibration_end == 0 and policy.initial_steps == 2
    assert run_policy(policy, [384.0] * 9) == [2, 2, 2, 2, 5, 5, 5, 5, 5]


@pytest.mark.parametrize("stop", [1, 4, 5, 6, 9, 20])
def test_a_resumed_run_decides_as_the_uninterrupted_one(stop):
    """The state after window `stop` - 1, saved and loaded into a new policy: the run goes on with the same N. A
    resume inside the calibration times one window fewer (the first after the resume compiles graphs)."""
    whole = run_policy(GoodputAccumulation(2, 64, interval=5, calibration_windows=3), NOISES)
    first = GoodputAccumulation(2, 64, interval=5, calibration_windows=3)
    before = run_policy(first, NOISES[:stop])
    resumed = GoodputAccumulation(2, 64, interval=5, calibration_windows=3)
    resumed.load_state_dict(first.state_dict())
    after = run_policy(resumed, NOISES, start=stop, current=whole[stop])
    assert before + after == whole
    assert resumed.device_constants == pytest.approx((0.5, 1.0))


def test_state_dict_is_numbers():
    policy = GoodputAccumulation(2, 8, calibration_windows=2)
    run_policy(policy, [math.nan] * 3)
    assert policy.state_dict() == {"micro_time": 0.0, "end_time": 0.0, "observed": [[1, 2, 2.0], [2, 4, 3.0]]}
    run_policy(policy, [math.nan] * 4, start=3, current=4)
    assert policy.state_dict() == {"micro_time": 0.5, "end_time": 1.0, "observed": [[1, 2, 2.0], [2, 4, 3.0],
                                                                                    [3, 4, 3.0]]}


def test_unreported_calibration_is_an_error():
    policy = GoodputAccumulation(2, 8, calibration_windows=2)
    for update in range(4):
        policy.next_steps(2, update, math.nan, 32.0)
    with pytest.raises(ValueError, match=r"For 'GoodputAccumulation', the times of the calibration's windows \(0 to "
                                         r"3\) must be reported through observe\(\) after each window's N is decided, "
                                         r"but the policy reached window 5 without them"):
        policy.next_steps(2, 4, math.nan, 32.0)
    policy = GoodputAccumulation(2, 8, calibration_windows=2)
    for update in range(3):
        policy.observe(update, 2, 1.0)  # every window at one N: no line to fit
    with pytest.raises(ValueError, match=r"For 'GoodputAccumulation', the calibration must time windows at two N, "
                                         r"\(2, 4\), but the windows timed were \[\[1, 2, 1.0\], \[2, 2, 1.0\], "
                                         r"\[3, 2, 1.0\]\] \(\[window, N, seconds\]\)"):
        policy.observe(3, 2, 1.0)


def test_a_calibration_below_the_timing_noise_warns_and_keeps_the_smallest_n():
    """Windows no slower at the larger N (a new user's small model on 2 workers, calibrating at N = 1 and 2): the run
    goes on, the constants frozen through the origin (t_end = 0), so that every decision is min_steps; the state
    file holds them, and a resumed run decides the same."""
    times = {1: 0.0288, 2: 0.0280}  # the fastest at N = 2 below N = 1's
    policy = GoodputAccumulation(1, 8, interval=2, calibration_windows=2)
    with pytest.warns(UserWarning, match=r"For 'GoodputAccumulation', the calibration's windows did not take longer "
                                         r"at the larger N \(the fastest: N=1: 0.0288 s, N=2: 0.028 s\): .* frozen at "
                                         r"t_micro = 0.01696 s and t_end = 0, so the policy keeps N at min_steps \(1\)"
                                         r".* pass 'calibration_steps' further apart \(such as \(1, 8\)\)"):
        chosen = run_policy(policy, [1000.0] * 12, times=times)
    assert policy.frozen and policy.device_constants == pytest.approx(((1 * 0.0288 + 2 * 0.0280) / 5, 0.0))
    assert chosen == [1, 1, 2, 2, 2] + [1] * 7, chosen  # calibration; N = 2 until the first decision, then 1
    resumed = GoodputAccumulation(1, 8, interval=2, calibration_windows=2)
    resumed.load_state_dict(policy.state_dict())
    assert resumed.next_steps(2, 13, 1000.0, 32.0) == 1


@pytest.mark.parametrize("kwargs, error, message", [
    ({"min_steps": 0, "max_steps": 8}, ValueError, r"'min_steps' must be an int >= 1, but got 0"),
    ({"min_steps": 4, "max_steps": 4}, ValueError, r"'max_steps' must be > 'min_steps' \(4\), but got 4: with one N "
                                                   r"there is nothing to choose. Pass N as an int instead"),
    ({"min_steps": 2, "max_steps": 8, "interval": 0}, ValueError, r"'interval' must be an int >= 1, but got 0"),
    ({"min_steps": 2.0, "max_steps": 8}, TypeError, r"'min_steps' must be an int >= 1, but got 2.0 of type float"),
    ({"min_steps": 2, "max_steps": 8, "calibration_windows": 1}, ValueError,
     r"'calibration_windows' must be an int >= 2, but got 1"),
    ({"min_steps": 2, "max_steps": 8, "calibration_steps": 3}, TypeError,
     r"'calibration_steps' must be a tuple of two different ints in \[2, 8\], the N of the calibration's two "
     r"halves, such as \(2, 4\), but got 3 of type int"),
    ({"min_steps": 2, "max_steps": 8, "calibration_steps": (2, 4, 6)}, TypeError,
     r"'calibration_steps' must be a tuple of two .* but got \(2, 4, 6\) of type tuple"),
    ({"min_steps": 2, "max_steps": 8, "calibration_steps": {2: 4}}, TypeError,
     r"'calibration_steps' must be a tuple of two .* but got \{2: 4\} of type dict"),
    ({"min_steps": 2, "max_steps": 8, "calibration_steps": (4, 4)}, ValueError,
     r"'calibration_steps' must be two different ints in \[2, 8\], but got \(4, 4\)"),
    ({"min_steps": 2, "max_steps": 8, "calibration_steps": (2, 9)}, ValueError,
     r"'calibration_steps' must be two different ints in \[2, 8\], but got \(2, 9\)"),
    ({"min_steps": 2, "max_steps": 8, "micro_time": 0.5}, ValueError,
     r"'micro_time' and 'end_time' must be given together \(or neither, to calibrate\), but got micro_time=0.5, "
     r"end_time=None"),
    ({"min_steps": 2, "max_steps": 8, "micro_time": 0.0, "end_time": 1.0}, ValueError,
     r"'micro_time' must be a finite number > 0, but got 0.0"),
    # a wrong type says which type it got (a user's trial: a string time read a ValueError of a bad value)
    ({"min_steps": 2, "max_steps": 8, "micro_time": "0.01", "end_time": 0.1}, TypeError,
     r"'micro_time' must be a finite number > 0, but got '0.01' of type str"),
    ({"min_steps": 2, "max_steps": 8, "micro_time": 0.01, "end_time": None}, ValueError,
     r"'micro_time' and 'end_time' must be given together"),
    ({"min_steps": 2, "max_steps": 8, "micro_time": 0.01, "end_time": "0.1"}, TypeError,
     r"'end_time' must be a finite number >= 0, but got '0.1' of type str"),
    ({"min_steps": 2, "max_steps": 8, "calibration_steps": (2.0, 4)}, TypeError,
     r"'calibration_steps' must be two different ints in \[2, 8\], but got \(2.0, 4\), holding float and int"),
])
def test_policy_argument_errors(kwargs, error, message):
    with pytest.raises(error, match=r"For 'GoodputAccumulation', " + message):
        GoodputAccumulation(**kwargs)


def test_observe_and_load_errors():
    policy = GoodputAccumulation(2, 8)
    with pytest.raises(ValueError, match=r"For 'GoodputAccumulation', 'seconds' must be a finite number > 0, but "
                                         r"got nan"):
        policy.observe(1, 2, math.nan)
    with pytest.raises(ValueError, match=r"For 'GoodputAccumulation', 'update' must be an int >= 0, but got -1"):
        policy.observe(-1, 2, 1.0)
    with pytest.raises(ValueError, match=r"For 'GoodputAccumulation', 'state' must be the dict state_dict\(\) "
                                         r"returns, with keys \['end_time', 'micro_time', 'observed'\], but got \{\}"):
        policy.load_state_dict({})


# the device grid: the policy's windows (calibrating or not), estimates (none, negative tr, B below and above the
# batches), items and micro-batches (a partial window, none), frozen constants or none yet
DEVICE_POLICY = GoodputAccumulation(2, 32, interval=5, calibration_windows=3).device_policy
DEVICE_GRID = list(itertools.product(
    (2, 3, 4, 9, 32),                                                       # current N
    (0, 1, 2, 3, 4, 5, 6, 7, 9, 14),                                        # window index (6: the first decision)
    ((1.0, 0.0), (1.0, 50.0), (0.5, 192.0), (0.25, 250.0), (1e-3, 30.0), (0.0, 5.0), (-1.0, 5.0), (1.0, math.nan),
     (1.0, -3.0)),                                                          # smoothed |G|^2, tr(Sigma)
    ((64.0, 2), (96.0, 3), (32.0, 1), (0.0, 1)),                            # items, micro-batches
    ((0.0, 0.0), (0.5, 1.0), (0.125, 0.0), (0.01, 3.0))))                   # t_micro, t_end


def host_decision(current, update, grad_sq, trace, items, micro, micro_time, end_time):
    policy = GoodputAccumulation(2, 32, interval=5, calibration_windows=3)
    if micro_time > 0:
        policy.load_state_dict({"micro_time": micro_time, "end_time": end_time, "observed": []})
    elif update >= policy.calibration_end:
        return policy.calibration_steps[1]  # the host raises here (no times reported); the device stays
    return policy.next_steps(current, update, noise_scale_of(grad_sq, trace), items / micro)


class DecisionCell(nn.Cell):
    def construct(self, current, update, grad_sq, trace, items, micro_batches, micro_time, end_time):
        return goodput_steps_on_device(DEVICE_POLICY, current, update, grad_sq, trace, items, micro_batches,
                                       micro_time, end_time)


@ms.jit
def decide_in_jit(current, update, grad_sq, trace, items, micro_batches, micro_time, end_time):
    return goodput_steps_on_device(DEVICE_POLICY, current, update, grad_sq, trace, items, micro_batches, micro_time,
                                   end_time)


@pytest.mark.parametrize("where", ["pynative", "jit", "graph"])
def test_device_rule_is_the_hosts_on_a_grid(where):
    """goodput_steps_on_device, elementwise over 1-D Tensors of the grid, against the host's next_steps."""
    columns = list(zip(*[(c, u, sq, tr, items, micro, a, e) for c, u, (sq, tr), (items, micro), (a, e)
                         in DEVICE_GRID]))
    dtypes = (np.int32, np.int32, np.float32, np.float32, np.float32, np.int32, np.float32, np.float32)
    tensors = [Tensor(np.array(column, dtype)) for column, dtype in zip(columns, dtypes)]
    if where == "graph":
        ms.set_context(mode=ms.GRAPH_MODE)
        got = DecisionCell()(*tensors)
    elif where == "jit":
        got = decide_in_jit(*tensors)
    else:
        got = goodput_steps_on_device(DEVICE_POLICY, *tensors)
    want = [host_decision(*row) for row in zip(*columns)]
    mismatched = [(row, g, w) for row, g, w in zip(zip(*columns), got.asnumpy().tolist(), want) if g != w]
    assert not mismatched, mismatched[:5]
    assert len(set(want)) > 5, "the grid reaches many N"


def test_device_rule_on_scalars():
    """The engine's call: scalar Tensors, as a window's end holds them."""
    scalar = [Tensor(4, ms.int32), Tensor(9, ms.int32), Tensor(1.0, ms.float32), Tensor(384.0, ms.float32),
              Tensor(64.0, ms.float32), Tensor(2, ms.int32), Tensor(0.5, ms.float32), Tensor(1.0, ms.float32)]
    assert int(goodput_steps_on_device((2, 64, 10, 3, 2, 4, 6), *scalar).asnumpy()) == 5
