"""Adaptive accumulation: the number of micro-batches per window chosen from the measured gradient noise scale."""
import math

from mindspore import ops
from mindspore import dtype as mstype

from .checks import check_positive_int
from .schedule import is_int


class AdaptiveAccumulation:
    r"""
    An accumulation policy that sets N, the micro-batches per window, from the smoothed gradient noise scale
    B_simple (see ``docs/noise_scale.md``): every `interval` windows, N moves towards B_simple / b, where b is the
    items per micro-batch of the last window, by at most a factor `max_factor` (or by one micro-batch, where
    that factor would not move an integer N: 2 x 1.2 is still 2), within [`min_steps`, `max_steps`]. N changes
    only between windows, so every window is still exactly the large-batch step of its own size; while there is
    no estimate (NaN), N stays where it is.

    Give it wherever N is given (``gradient_accumulation_steps`` of the parallel cells, of :class:`Accumulator` and of
    the trainers, without dataset sink mode), with ``noise_scale=True``. It is applied on the device after each window
    (:func:`next_steps_on_device`), inside a compiled step too. :class:`WindowTelemetry` records the N of every window
    (``accumulation_steps``).

    Args:
        min_steps (int): The smallest N, >= 1; also the first windows' N unless `initial_steps` is given. 1 only
            in data parallel over 2 devices or more, where a window of N = 1 still holds one micro-batch a device
            and so a noise estimate; on one device a window of one micro-batch carries none, N = 1 could never be
            left, and the cell refuses it (halve the micro-batch and pass 2).
        max_steps (int): The largest N, >= `min_steps`.
        interval (int): Windows between decisions, >= 1 (the smoothed estimate spans about ten windows).
            Default: ``10``.
        max_factor (float): The largest factor by which one decision may raise or lower N, > 1; a decision may
            always move N by one. Default: ``2.0``.
        initial_steps (int, optional): The first windows' N, in [`min_steps`, `max_steps`]. Default: ``None``
            (`min_steps`).

    Raises:
        TypeError: If `min_steps`, `max_steps`, `interval` or `initial_steps` is not an int, or `max_factor` is not
            a number.
        ValueError: If `min_steps` is < 1, `max_steps` < `min_steps`, `interval` < 1, `max_factor` is not a finite
            number > 1, or `initial_steps` is outside the bounds.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> policy = ms_accum.AdaptiveAccumulation(min_steps=2, max_steps=16, interval=10)
        >>> policy.next_steps(current=2, update=9, noise_scale=400.0, micro_batch_items=32.0)
        4
        >>> policy.next_steps(current=8, update=9, noise_scale=100.0, micro_batch_items=32.0)
        4
        >>> policy.next_steps(current=2, update=9, noise_scale=float("nan"), micro_batch_items=32.0)
        2
    """

    def __init__(self, min_steps, max_steps, interval=10, max_factor=2.0, initial_steps=None):
        owner = "AdaptiveAccumulation"
        for name, value in (("min_steps", min_steps), ("max_steps", max_steps), ("interval", interval)):
            check_positive_int(owner, name, value)
        if max_steps < min_steps:
            raise ValueError(f"For '{owner}', 'max_steps' must be >= 'min_steps' ({min_steps}), but got {max_steps}: "
                             f"pass the largest N as max_steps and the smallest as min_steps.")
        if isinstance(max_factor, bool) or not isinstance(max_factor, (int, float)):
            raise TypeError(f"For '{owner}', 'max_factor' must be a number > 1, but got {type(max_factor).__name__}.")
        if not 1.0 < max_factor < math.inf:
            raise ValueError(f"For '{owner}', 'max_factor' must be a finite number > 1, but got {max_factor}.")
        initial = min_steps if initial_steps is None else initial_steps
        if not is_int(initial):
            raise TypeError(f"For '{owner}', 'initial_steps' must be an int or None, but got {initial!r}.")
        if not min_steps <= initial <= max_steps:
            raise ValueError(f"For '{owner}', 'initial_steps' must be in [{min_steps}, {max_steps}], but got "
                             f"{initial}.")
        self.min_steps, self.max_steps = int(min_steps), int(max_steps)
        self.interval, self.max_factor, self.initial_steps = int(interval), float(max_factor), int(initial)

    @property
    def device_policy(self):
        """(min_steps, max_steps, interval, max_factor): what :func:`next_steps_on_device` takes."""
        return (self.min_steps, self.max_steps, self.interval, self.max_factor)

    def __repr__(self):
        return (f"AdaptiveAccumulation(min_steps={self.min_steps}, max_steps={self.max_steps}, "
                f"interval={self.interval}, max_factor={self.max_factor}, initial_steps={self.initial_steps})")

    def next_steps(self, current, update, noise_scale, micro_batch_items):
        """
        The N of the window after window `update` (counted from 0), which ran with `current` micro-batches.

        Args:
            current (int): The N of window `update`.
            update (int): The index of the window just applied.
            noise_scale (float): The smoothed noise scale after it, in items (NaN: no estimate yet).
            micro_batch_items (float): Items per micro-batch (the last window's items over its micro-batches).

        Returns:
            int, in [`min_steps`, `max_steps`], within a factor `max_factor` of `current` or one from it; `current`
            itself between decisions (`update` + 1 not a multiple of `interval`) or without an estimate.
        """
        if (update + 1) % self.interval or not math.isfinite(noise_scale) or not micro_batch_items > 0:
            return current
        target = max(noise_scale, 0.0) / micro_batch_items
        low = max(self.min_steps, min(current - 1, math.ceil(current / self.max_factor)))
        high = min(self.max_steps, max(current + 1, math.floor(current * self.max_factor)))
        return int(min(max(round(target), low), high))


def next_steps_on_device(policy, current, update, smooth_grad_sq, smooth_trace, items, micro_batches):
    """
    :meth:`AdaptiveAccumulation.next_steps` in a graph, for a policy applied on the device (inside ``ms.jit`` or a
    compiled cell). `policy` is the tuple (min_steps, max_steps, interval, max_factor) of Python numbers (graph
    constants); the others are scalar Tensors: the open window's N and index (from 0), the smoothed estimates after
    it, its items over all devices and its micro-batches on this device. Returns the next N, int32. The same rule
    as the host's, rounding half to even as Python's round does (the tests compare the two on a grid).
    """
    min_steps, max_steps, interval, max_factor = policy
    current = ops.cast(current, mstype.float32)
    per_micro_batch = items / ops.maximum(ops.cast(micro_batches, mstype.float32), 1.0)
    decide = ops.logical_and((update + 1) % interval == 0, smooth_grad_sq > 0.0)
    decide = ops.logical_and(decide, ops.logical_and(ops.isfinite(smooth_trace), per_micro_batch > 0.0))
    noise = ops.maximum(smooth_trace, 0.0) / ops.select(decide, smooth_grad_sq, ops.ones_like(smooth_grad_sq))
    target = ops.round(noise / ops.select(decide, per_micro_batch, ops.ones_like(per_micro_batch)))
    low = ops.maximum(ops.minimum(current - 1.0, ops.ceil(current / max_factor)), float(min_steps))
    high = ops.minimum(ops.maximum(current + 1.0, ops.floor(current * max_factor)), float(max_steps))
    chosen = ops.minimum(ops.maximum(target, low), high)
    return ops.cast(ops.select(decide, chosen, current), mstype.int32)
