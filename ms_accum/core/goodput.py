r"""N chosen for goodput: throughput x statistical efficiency, within bounds, from the run's own window times.

The model (Pollux: Qiao et al., OSDI 2021; AdaptDL's ``goodput.py``), for a window of N micro-batches of c items
each over all devices (c = b x devices, the last window's items over its micro-batches):

    window_time(N) = N * t_micro + t_end
    throughput(N)  = N * c / window_time(N)                items per second
    efficiency(G)  = (B + G0) / (B + G)                    G = N * c; B the noise scale B_simple, in items
    goodput(N)     = throughput(N) * efficiency(N * c)     reference items' worth of progress per second

t_micro is a micro-batch's forward, backward and addition; t_end the window's end (the division, the one gradient
reduction across devices in data parallel, clipping, the optimizer step, the reset) and whatever else a window
costs once (the host's round trip). Efficiency is the progress a sample makes at G relative to G0 (AdaScale's gain
over G / G0: ``lr_scaling.py``); G0 scales goodput but does not move its maximum.

**The best N** has a closed form. goodput(N) is proportional to N / ((N t_micro + t_end)(B + N c)), which rises
while t_end B > t_micro c N^2 and falls after; one more micro-batch pays (goodput(n + 1) > goodput(n)) exactly when

    t_end * B > t_micro * c * n * (n + 1),

so the best N is the smallest n >= 1 with n (n + 1) >= Q = t_end B / (t_micro c), clipped into [min_steps,
max_steps] (a tie goes to the smaller N). Its limits: B -> 0 (or t_end = 0) gives min_steps, the smallest G; B ->
inf with t_end > 0 gives max_steps, the fastest throughput.

**Calibration** fits t_micro and t_end from the run's own windows: the first `calibration_windows` windows run at a
first N, the next as many at a second N (the policy sets N there, whatever the noise says), and each window's wall
time, from the previous window's end to its own (data loading, the host's part and the device's: what a window
really costs), is reported to :meth:`GoodputAccumulation.observe`. The run's first window, and the first after a
resume, are left out (they compile graphs). At the end of the calibration the fastest time at each N (a busy machine
only ever adds time to a window, as ``timeit`` reasons) gives the line through them (:func:`fit_window_time`); the
constants are then **frozen**: later windows are not measured, so a decision depends only on the frozen constants,
the noise estimates, N and the window index, all of which a state file holds
(:meth:`GoodputAccumulation.state_dict`, and the device's Parameters): a resumed run decides as the uninterrupted
one would. In data parallel each window's time is the slowest device's (the cells gather every device's time during
the calibration, ``engine.slowest_device_seconds``): every device fits the same constants, and since the noise
estimates and item counts it decides from are reduced across devices, every device chooses the same N (one choosing
otherwise would wait alone at the next reduction). Window times vary from run to run (a shared machine, up to 2x
here); a refit during the run would make decisions depend on the moment, and a resumed run would decide otherwise.
Pass `micro_time` and `end_time` to skip the calibration (a path without a host loop, such as ``Accumulator`` in a
user's ``ms.jit`` step, has nobody to report times).

Decisions are taken every `interval` windows once the constants are frozen (N stays put between them, and while
there is no noise estimate), on the host (:meth:`GoodputAccumulation.next_steps`) or on the device
(:func:`goodput_steps_on_device`, the same rule on float32 scalars, the calibration's N included; the tests compare
the two on a grid). Either way the decision for the window after window u is taken before window u's time is
reported, so that the host and the device (which decides inside the window's end graph) agree.
"""
import math
import numbers

from mindspore import ops
from mindspore import dtype as mstype

from .checks import check_int_at_least, check_positive_int
from .lr_scaling import noise_scale_on_device
from .schedule import is_int
from .user_warning import warn


def window_time(steps, micro_time, end_time):
    """
    The modelled wall time of a window of `steps` micro-batches: ``steps * micro_time + end_time``.

    Args:
        steps (int): N, >= 1.
        micro_time (float): t_micro, seconds per micro-batch, > 0.
        end_time (float): t_end, seconds per window's end, >= 0.

    Returns:
        float, seconds.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum.core.goodput import window_time
        >>> window_time(4, 0.5, 1.0)
        3.0
    """
    return steps * micro_time + end_time


def efficiency(global_batch, reference_batch, noise_scale):
    """
    Statistical efficiency of a step on `global_batch` items against one on `reference_batch` items:
    ``(B + G0) / (B + G)``, the progress per item relative to G0 (1 at G = G0).

    Args:
        global_batch (float): G, > 0.
        reference_batch (float): G0, > 0.
        noise_scale (float): B >= 0 in the same items; ``math.inf`` gives 1; NaN (no estimate) gives NaN.

    Returns:
        float.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum.core.goodput import efficiency
        >>> efficiency(256.0, 64.0, 64.0), efficiency(256.0, 64.0, 0.0), efficiency(256.0, 64.0, float("inf"))
        (0.4, 0.25, 1.0)
    """
    if math.isinf(noise_scale):
        return 1.0
    return (noise_scale + reference_batch) / (noise_scale + global_batch)


def goodput(steps, micro_batch_items, noise_scale, micro_time, end_time, reference_batch):
    """
    Goodput of windows of `steps` micro-batches: throughput (items per second) x efficiency, in reference items'
    worth of progress per second.

    Args:
        steps (int): N, >= 1.
        micro_batch_items (float): c, items per micro-batch over all devices (b x devices), > 0.
        noise_scale (float): B >= 0 (``math.inf`` allowed).
        micro_time (float): t_micro, > 0.
        end_time (float): t_end, >= 0.
        reference_batch (float): G0, > 0.

    Returns:
        float.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum.core.goodput import goodput
        >>> goodput(4, 32.0, 128.0, 0.5, 1.0, 64.0)     # 128 items in 3 s, at efficiency 192 / 256
        32.0
    """
    batch = steps * micro_batch_items
    return batch / window_time(steps, micro_time, end_time) * efficiency(batch, reference_batch, noise_scale)


def best_steps(noise_scale, micro_batch_items, micro_time, end_time, min_steps, max_steps):
    """
    The N in [`min_steps`, `max_steps`] of the highest goodput: the smallest n >= 1 with n (n + 1) >= t_end B /
    (t_micro c), clipped into the bounds (a tie goes to the smaller N; see the module's text).

    Args:
        noise_scale (float): B >= 0 in items (``math.inf`` allowed).
        micro_batch_items (float): c, items per micro-batch over all devices, > 0.
        micro_time (float): t_micro, > 0.
        end_time (float): t_end, >= 0.
        min_steps (int): The smallest N, >= 1.
        max_steps (int): The largest N, >= `min_steps`.

    Returns:
        int.

    Raises:
        TypeError: If a time or `micro_batch_items` is not a real number, or a bound not an int.
        ValueError: If `noise_scale` is NaN or negative, or another argument is out of its range.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum.core.goodput import best_steps
        >>> best_steps(384.0, 32.0, 0.5, 1.0, 2, 64)     # Q = 1 * 384 / (0.5 * 32) = 24, and 4 * 5 < 24 <= 5 * 6
        5
        >>> best_steps(0.0, 32.0, 0.5, 1.0, 2, 64), best_steps(float("inf"), 32.0, 0.5, 1.0, 2, 64)
        (2, 64)
    """
    owner = "best_steps"
    if math.isnan(noise_scale) or noise_scale < 0:
        raise ValueError(f"For '{owner}', 'noise_scale' must be a number >= 0 (math.inf allowed), but got "
                         f"{noise_scale}: without an estimate there is nothing to choose by.")
    _check_constants(owner, micro_time, end_time)
    _check_positive(owner, "micro_batch_items", micro_batch_items)
    check_positive_int(owner, "min_steps", min_steps)
    check_int_at_least(owner, "max_steps", max_steps, min_steps)
    if end_time == 0 or noise_scale == 0:
        return min_steps
    if math.isinf(noise_scale):
        return max_steps
    quotient = end_time * noise_scale / (micro_time * micro_batch_items)
    steps = max(1, math.ceil((math.sqrt(1.0 + 4.0 * quotient) - 1.0) / 2.0))
    while steps > 1 and (steps - 1) * steps >= quotient:  # the square root's rounding, corrected exactly
        steps -= 1
    while steps * (steps + 1) < quotient:
        steps += 1
    return min(max(steps, min_steps), max_steps)


def fit_window_time(steps, seconds):
    """
    t_micro and t_end from measured windows: the fastest time at each N (other work on the machine only ever adds
    time to a window, so the fastest is the least disturbed), and the least-squares line through those times
    (exactly through them for two N). A negative intercept (noise) is read as t_end = 0, the slope then fitted
    through the origin.

    Args:
        steps (list[int]): Each window's N, >= 1; at least two different values.
        seconds (list[float]): Each window's wall time, > 0.

    Returns:
        (float, float): t_micro > 0 and t_end >= 0.

    Raises:
        TypeError: If a time is not a real number or an N not an int.
        ValueError: If the lists differ in length, hold fewer than two different N or a time <= 0, or the time does
            not grow with N (the measurements are noise: calibrate with more windows, or give the constants).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum.core.goodput import fit_window_time
        >>> fit_window_time([2, 2, 2, 4, 4, 4], [2.0, 2.5, 9.0, 3.5, 3.0, 3.0])     # fastest: 2.0 and 3.0
        (0.5, 1.0)
    """
    owner = "fit_window_time"
    points = fastest_times(owner, steps, seconds)
    if len(points) < 2:
        raise ValueError(f"For '{owner}', 'steps' must hold at least two different N to tell a micro-batch's time "
                         f"from a window end's, but got {[n for n, _ in points]}.")
    constants = line_of(points)
    if constants is None:
        raise ValueError(f"For '{owner}', the window time must grow with N, but the fastest times were "
                         f"{shown_times(points)}: the measurements are noise (a busy machine?). Calibrate with more "
                         f"windows, or further apart N, or pass micro_time and end_time measured in a quiet run.")
    return constants


def line_of(points):
    """(t_micro, t_end) of the least-squares line through `points` [(N, seconds)] at two N or more, t_end read as 0
    (the line through the origin) where the intercept is negative; None where the time does not grow with N."""
    mean_n = sum(n for n, _ in points) / len(points)
    mean_t = sum(t for _, t in points) / len(points)
    slope = sum((n - mean_n) * (t - mean_t) for n, t in points) / sum((n - mean_n) ** 2 for n, _ in points)
    if not slope > 0:
        return None
    intercept = mean_t - slope * mean_n
    if intercept < 0:
        return through_origin(points), 0.0
    return slope, intercept


def fastest_times(owner, steps, seconds):
    """[(N, the fastest window's seconds at N)], by N, from each window's `steps` and `seconds` (checked)."""
    if len(steps) != len(seconds):
        raise ValueError(f"For '{owner}', 'steps' and 'seconds' must have one entry per window, but got {len(steps)} "
                         f"and {len(seconds)} entries.")
    for value in seconds:
        _check_positive(owner, "seconds", value)
    groups = {}
    for count, time in zip(steps, seconds):
        groups.setdefault(check_positive_int(owner, "steps", count), []).append(float(time))
    return [(count, min(times)) for count, times in sorted(groups.items())]


def through_origin(points):
    """t_micro of the least-squares line through the origin and `points` [(N, seconds)]: t_end read as 0."""
    return sum(n * t for n, t in points) / sum(n * n for n, _ in points)


def shown_times(points):
    """`points` [(N, seconds)] for a message."""
    return ", ".join(f"N={n}: {t:.4g} s" for n, t in points)


def _check_real(owner, name, value, expected):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"For '{owner}', '{name}' must be {expected}, but got {value!r} of type "
                        f"{type(value).__name__}.")


def _check_positive(owner, name, value):
    _check_real(owner, name, value, "a finite number > 0")
    if not 0 < value < math.inf:
        raise ValueError(f"For '{owner}', '{name}' must be a finite number > 0, but got {value!r}.")


def _check_constants(owner, micro_time, end_time):
    _check_positive(owner, "micro_time", micro_time)
    _check_real(owner, "end_time", end_time, "a finite number >= 0")
    if not 0 <= end_time < math.inf:
        raise ValueError(f"For '{owner}', 'end_time' must be a finite number >= 0, but got {end_time!r}.")


class GoodputAccumulation:
    r"""
    An accumulation policy that sets N, the micro-batches per window, to the N of the highest goodput (throughput x
    statistical efficiency, see the module ``ms_accum.core.goodput``) within [`min_steps`, `max_steps`], every
    `interval` windows, from the smoothed noise scale and window times measured in a calibration at the run's start
    (or given). N changes only between windows, so every window is still exactly the large-batch step of its own
    size; while there is no noise estimate (NaN), N stays where it is.

    Calibration: windows 0 to `calibration_windows` - 1 run at ``calibration_steps[0]``, the next
    `calibration_windows` at ``calibration_steps[1]``; their times, reported through :meth:`observe` (in data
    parallel, the slowest device's), are fitted by :func:`fit_window_time` once the last of them is reported, and
    frozen. The first decision is at the end of the window after the calibration (whose N was set before the
    calibration's last time came in: it runs at ``calibration_steps[1]`` too), not at the next multiple of
    `interval`. Give `micro_time` and `end_time` instead to skip it.

    Args:
        min_steps (int): The smallest N, >= 1; 1 only in data parallel over 2 devices or more (on one device a
            window of one micro-batch carries no noise estimate, and the cell refuses it).
        max_steps (int): The largest N, > `min_steps`.
        interval (int): Windows between decisions, >= 1. Default: ``10``.
        calibration_windows (int): Windows timed at each of the two calibration N, >= 2 (the run's first window
            is not timed). Default: ``5``.
        calibration_steps (tuple[int, int], optional): The two calibration N, different, within the bounds.
            Default: ``None``: (`min_steps`, min(`max_steps`, 2 x `min_steps`)).
        micro_time (float, optional): t_micro in seconds, > 0, given instead of calibrated. Default: ``None``.
        end_time (float, optional): t_end in seconds, >= 0, given with `micro_time`. Default: ``None``.

    Raises:
        TypeError: If a count is not an int, `calibration_steps` not a pair of ints, or a time not a real number.
        ValueError: If a count is out of its range, the calibration N are equal or out of bounds, or only one of
            `micro_time` and `end_time` is given.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum.core.goodput import GoodputAccumulation
        >>> policy = GoodputAccumulation(min_steps=2, max_steps=64, interval=10, calibration_windows=3)
        >>> [policy.next_steps(2, update, 384.0, 32.0) for update in range(6)]   # calibration: 3 at N=2, 3 at N=4
        [2, 2, 4, 4, 4, 4]
        >>> for update, (steps, seconds) in enumerate([(2, 9.0), (2, 2.0), (2, 2.0), (4, 3.0), (4, 3.0), (4, 3.0)]):
        ...     policy.observe(update, steps, seconds)           # window 0 compiled: not counted
        ms_accum: goodput calibrated on windows 2 to 6 (the fastest: N=2: 2 s, N=4: 3 s): t_micro = 0.5 s a
        micro-batch, t_end = 1 s a window's end; N is chosen for goodput from window 8 on, every 10 windows.
        >>> policy.frozen, policy.device_constants
        (True, (0.5, 1.0))
        >>> policy.next_steps(4, 9, 384.0, 32.0)                # a decision: Q = 1 * 384 / (0.5 * 32) = 24
        5
        >>> policy.next_steps(4, 9, float("nan"), 32.0)         # no estimate: N stays
        4
    """

    def __init__(self, min_steps, max_steps, interval=10, calibration_windows=5, calibration_steps=None,
                 micro_time=None, end_time=None):
        owner = "GoodputAccumulation"
        for name, value in (("min_steps", min_steps), ("max_steps", max_steps), ("interval", interval)):
            check_positive_int(owner, name, value)
        if max_steps <= min_steps:
            raise ValueError(f"For '{owner}', 'max_steps' must be > 'min_steps' ({min_steps}), but got {max_steps}: "
                             f"with one N there is nothing to choose. Pass N as an int instead.")
        check_int_at_least(owner, "calibration_windows", calibration_windows, 2)
        pair = calibration_steps if calibration_steps is not None else (min_steps, min(max_steps, 2 * min_steps))
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"For '{owner}', 'calibration_steps' must be a tuple of two different ints in "
                            f"[{min_steps}, {max_steps}], the N of the calibration's two halves, such as "
                            f"({min_steps}, {min(max_steps, 2 * min_steps)}), but got {calibration_steps!r} of type "
                            f"{type(calibration_steps).__name__}.")
        first, second = pair
        if not (is_int(first) and is_int(second)):
            raise TypeError(f"For '{owner}', 'calibration_steps' must be two different ints in [{min_steps}, "
                            f"{max_steps}], but got {calibration_steps!r}, holding "
                            f"{type(first).__name__} and {type(second).__name__}.")
        if first == second or not (min_steps <= first <= max_steps and min_steps <= second <= max_steps):
            raise ValueError(f"For '{owner}', 'calibration_steps' must be two different ints in [{min_steps}, "
                             f"{max_steps}], but got {calibration_steps!r}.")
        if (micro_time is None) != (end_time is None):
            raise ValueError(f"For '{owner}', 'micro_time' and 'end_time' must be given together (or neither, to "
                             f"calibrate), but got micro_time={micro_time!r}, end_time={end_time!r}.")
        self.min_steps, self.max_steps, self.interval = int(min_steps), int(max_steps), int(interval)
        self.calibration_windows = int(calibration_windows)
        self.calibration_steps = (int(first), int(second))
        self.given = micro_time is not None
        self.micro_time, self.end_time = 0.0, 0.0
        if self.given:
            _check_constants(owner, micro_time, end_time)
            self.micro_time, self.end_time = float(micro_time), float(end_time)
        self.observed = {}  # window index -> (N, seconds), during the calibration
        self._restarted = True  # the next window reported compiled graphs: not timed

    @property
    def frozen(self):
        """bool: whether t_micro and t_end are known (given, or calibrated and frozen)."""
        return self.micro_time > 0

    @property
    def calibration_end(self):
        """int: the windows of the calibration (0 when the constants are given)."""
        return 0 if self.given else 2 * self.calibration_windows

    @property
    def first_decision(self):
        """int: the window at whose end the first decision after the calibration is made (the one after it, whose
        N was set before the calibration's last time came in); -1 when the constants are given."""
        return -1 if self.given else self.calibration_end

    @property
    def initial_steps(self):
        """int: the first window's N (the calibration's first N, or `min_steps` when the constants are given)."""
        return self.min_steps if self.given else self.calibration_steps[0]

    @property
    def device_constants(self):
        """(t_micro, t_end): what the device's Parameters hold; (0.0, 0.0) until frozen (the device then follows
        the calibration)."""
        return (self.micro_time, self.end_time)

    @property
    def device_policy(self):
        """(min_steps, max_steps, interval, calibration_windows, first N, second N, :attr:`first_decision`): what
        :func:`goodput_steps_on_device` takes, graph constants."""
        return (self.min_steps, self.max_steps, self.interval, self.calibration_windows) + self.calibration_steps + \
            (self.first_decision,)

    def __repr__(self):
        constants = f", micro_time={self.micro_time}, end_time={self.end_time}" if self.frozen else ""
        return (f"GoodputAccumulation(min_steps={self.min_steps}, max_steps={self.max_steps}, "
                f"interval={self.interval}, calibration_windows={self.calibration_windows}, "
                f"calibration_steps={self.calibration_steps}"
                f"{constants})")

    def next_steps(self, current, update, noise_scale, micro_batch_items):
        """
        The N of the window after window `update` (counted from 0), which ran with `current` micro-batches.

        Args:
            current (int): The N of window `update`.
            update (int): The index of the window just ended.
            noise_scale (float): The smoothed noise scale after it, in items (NaN: no estimate yet).
            micro_batch_items (float): c, items per micro-batch over all devices (the last window's items over its
                micro-batches on one device).

        Returns:
            int: the calibration's N during the calibration; at a decision (`update` + 1 a multiple of `interval`,
            or `update` the calibration's end: the first window after it; the constants frozen, an estimate there)
            the best N; else `current`.

        Raises:
            ValueError: If the calibration is over but its window times were not reported (:meth:`observe`).
        """
        if not self.frozen:
            if update >= self.calibration_end:
                raise ValueError(f"For 'GoodputAccumulation', the times of the calibration's windows (0 to "
                                 f"{self.calibration_end - 1}) must be reported through observe() after each "
                                 f"window's N is decided, but the policy reached window {update + 1} without them. "
                                 f"Report them, or pass micro_time and end_time.")
            return self.calibration_steps[0 if update + 1 < self.calibration_windows else 1]
        decision = (update + 1) % self.interval == 0 or update == self.first_decision
        if not decision or not math.isfinite(noise_scale) or not micro_batch_items > 0:
            return current
        return best_steps(noise_scale, micro_batch_items, self.micro_time, self.end_time, self.min_steps,
                          self.max_steps)

    def observe(self, update, steps, seconds):
        """
        Report window `update`'s wall time (from the previous window's end to its own), after its successor's N
        was decided. Kept during the calibration (the first window reported after the policy was built or loaded
        is left out: it compiled graphs); once the calibration's last window is reported, the constants are fitted
        and frozen, and printed in a line. Ignored once frozen. Where the windows were no slower at the larger N
        (a micro-batch costs less than the timing noise), the constants are frozen at t_end = 0, the line through
        the origin, with a warning: the policy then keeps N at `min_steps`, and the run goes on.

        Args:
            update (int): The window's index, from 0.
            steps (int): Its micro-batches (a partial window's too).
            seconds (float): Its wall time, > 0.

        Raises:
            TypeError: If `seconds` is not a real number.
            ValueError: If an argument is out of range, or the calibration's windows reported were not at two
                different N.
        """
        owner = "GoodputAccumulation"
        check_int_at_least(owner, "update", update, 0)
        check_positive_int(owner, "steps", steps)
        _check_positive(owner, "seconds", seconds)
        if self.frozen:
            return
        restarted, self._restarted = self._restarted, False
        if not restarted and update < self.calibration_end:
            self.observed[int(update)] = (int(steps), float(seconds))
        if update >= self.calibration_end - 1:
            counts, times = zip(*self.observed.values()) if self.observed else ((), ())
            points = fastest_times(owner, counts, times)
            if len(points) < 2:
                raise ValueError(f"For '{owner}', the calibration must time windows at two N, "
                                 f"{self.calibration_steps}, but the windows timed were "
                                 f"{self.state_dict()['observed']} "
                                 f"([window, N, seconds]). Report each window's time after its N was decided, or "
                                 f"pass micro_time and end_time.")
            constants = line_of(points)
            self.micro_time, self.end_time = constants or (through_origin(points), 0.0)
            if constants is not None:  # what the decisions from now on rest on, for the run's log
                print(f"ms_accum: goodput calibrated on windows {min(self.observed) + 1} to {update + 1} (the "
                      f"fastest: {shown_times(points)}): t_micro = {self.micro_time:.4g} s a micro-batch, t_end = "
                      f"{self.end_time:.4g} s a window's end; N is chosen for goodput from window "
                      f"{self.first_decision + 2} on, every {self.interval} windows.", flush=True)
            else:  # the time did not grow with N: a micro-batch costs less than the timing noise
                warn(f"For '{owner}', the calibration's windows did not take longer at the larger N (the "
                     f"fastest: {shown_times(points)}): a micro-batch costs less than the timing noise "
                     f"here. The constants are frozen at t_micro = {self.micro_time:.4g} s and t_end = 0, "
                     f"so the policy keeps N at min_steps ({self.min_steps}), the smallest batch. To choose "
                     f"N for throughput, pass 'calibration_steps' further apart (such as ({self.min_steps}, "
                     f"{min(self.max_steps, 8 * self.min_steps)})) or more 'calibration_windows', or "
                     f"micro_time and end_time measured in a quiet run.", UserWarning)

    def state_dict(self):
        """The policy's state, numbers only (a state file's entry): the frozen constants (0 before) and the
        calibration's observations so far, as [window, N, seconds] rows."""
        return {"micro_time": self.micro_time, "end_time": self.end_time,
                "observed": [[update, steps, seconds] for update, (steps, seconds) in sorted(self.observed.items())]}

    def load_state_dict(self, state):
        """Take the state :meth:`state_dict` gave (a resumed run); the next window reported is not timed."""
        owner = "GoodputAccumulation"
        if not isinstance(state, dict) or set(state) != {"micro_time", "end_time", "observed"}:
            raise ValueError(f"For '{owner}', 'state' must be the dict state_dict() returns, with keys "
                             f"['end_time', 'micro_time', 'observed'], but got {state!r}.")
        micro_time, end_time = state["micro_time"], state["end_time"]
        if micro_time:
            _check_constants(owner, micro_time, end_time)
        self.micro_time, self.end_time = float(micro_time), float(end_time)
        self.observed = {int(update): (int(steps), float(seconds)) for update, steps, seconds in state["observed"]}
        self._restarted = True


def goodput_steps_on_device(policy, current, update, smooth_grad_sq, smooth_trace, items, micro_batches, micro_time,
                            end_time):
    """
    :meth:`GoodputAccumulation.next_steps` in a graph, for a policy applied on the device (inside ``ms.jit`` or a
    compiled cell). `policy` is :attr:`GoodputAccumulation.device_policy` (Python numbers: graph constants); the
    others are scalar Tensors: the open window's N and index (from 0), the smoothed estimates after it, its items
    over all devices and its micro-batches on this device, and the constants t_micro and t_end from the device's
    Parameters (t_micro 0: not frozen yet, the calibration's N). Returns the next N, int32. The same rule as the
    host's in float32: the host and the device agree but where Q = t_end B / (t_micro c) lies within float32
    rounding of some n (n + 1) (the tests compare the two on a grid).
    """
    min_steps, max_steps, interval, calibration_windows, first, second, after_calibration = policy
    current = ops.cast(current, mstype.float32)
    per_micro_batch = items / ops.maximum(ops.cast(micro_batches, mstype.float32), 1.0)
    noise, valid = noise_scale_on_device(smooth_grad_sq, smooth_trace)
    ready = micro_time > 0.0
    due = ops.logical_or((update + 1) % interval == 0, update == after_calibration)
    decide = ops.logical_and(ops.logical_and(ready, due), ops.logical_and(valid, per_micro_batch > 0.0))
    denominator = ops.select(decide, micro_time * per_micro_batch, ops.ones_like(micro_time))
    quotient = end_time * noise / denominator
    steps = ops.maximum(ops.ceil((ops.sqrt(1.0 + 4.0 * quotient) - 1.0) / 2.0), 1.0)
    steps = ops.select(ops.logical_and(steps > 1.0, (steps - 1.0) * steps >= quotient), steps - 1.0, steps)
    steps = ops.select(steps * (steps + 1.0) < quotient, steps + 1.0, steps)
    chosen = ops.minimum(ops.maximum(steps, float(min_steps)), float(max_steps))
    calibrating = ops.select(update + 1 < calibration_windows, ops.full_like(current, float(first)),
                             ops.full_like(current, float(second)))
    return ops.cast(ops.select(ready, ops.select(decide, chosen, current), calibrating), mstype.int32)
