"""Non-finite windows in a training run: reported with the micro-batches that made them, and a limit.

The engine skips a window whose gradient holds a NaN or an inf on every path (without a loss scale; with one,
that is the loss-scale overflow skip): parameters and optimizer state stay as they were, so the learning rate does
not advance either. The trainers add what only a loop that knows the data's order can: a warning that names the
window and the positions of its micro-batches in their epoch, ``nonfinite="raise"`` to stop at the first such
window with that message (a cell's own "raise" cannot name the data), and a stop after `max_nonfinite_windows`
skipped in a row, the last good state written first; and a warning for a window applied with a loss that is not
finite (its gradient was: the gradient decides a skip).
"""
import math

from ..core.user_warning import warn


# Fifty skipped windows in a row cannot be one bad sample: without a loss scale the data or the model is broken;
# with a dynamic loss scale, fifty halvings take even a 2**24 scale below 2**-26, where no float16 gradient
# survives. A run that skips a bad window now and then never comes near it.
DEFAULT_MAX_NONFINITE_WINDOWS = 50
CHECK_EVERY = 16  # windows between two reads of the skip records; fewer than the engine's SKIP_HISTORY_BITS


class NonFiniteWindowWarning(RuntimeWarning):
    """
    A window's gradient was not finite and the window was skipped, or its loss was not finite while its gradient
    was, and it was applied; the message names the window and the positions of its micro-batches in their epoch.
    Issued by :meth:`GradientAccumulation.train_process` and :meth:`Model_ACCU.train` (the second kind with
    ``nonfinite="raise"`` too).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import warnings
        >>> import ms_accum
        >>> warnings.simplefilter("error", ms_accum.NonFiniteWindowWarning)  # stop at the first, as nonfinite="raise"
        >>> warnings.resetwarnings()
    """


class NonFiniteWindowError(RuntimeError):
    """
    Training stopped on non-finite windows: ``nonfinite="raise"`` met one, or `max_nonfinite_windows` were skipped
    in a row. The message names the last window and its micro-batches, and where the state was written.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> issubclass(ms_accum.NonFiniteWindowError, RuntimeError)
        True
    """


def micro_batch_positions(first, count, micro_batches_per_epoch):
    """'positions 44 to 47 of epoch 2' for micro-batches [first, first + count) of a run (counted from 0), epochs
    from 1 and positions from 0 in each epoch's order; a window across an epoch's end names both parts."""
    parts, index, end = [], first, first + count
    while index < end:
        epoch, position = divmod(index, micro_batches_per_epoch)
        last = min(end, (epoch + 1) * micro_batches_per_epoch) - 1
        span = f"position {position}" if last == index else f"positions {position} to {last % micro_batches_per_epoch}"
        parts.append(f"{span} of epoch {epoch + 1}")
        index = last + 1
    return " and ".join(parts)


class NonFiniteGuard:
    """
    Reads the engine's skip records every :data:`CHECK_EVERY` windows (every window with ``nonfinite="raise"``) and
    acts on every window skipped since: a read waits for the device, so reading every window would slow a busy
    run (docs/performance_history.md, The non-finite check: the items check in the skip's branch); the engine
    keeps the last windows' skips as bits, so no skipped window goes unreported.

    Args:
        owner (str): The trainer, for messages.
        nonfinite (str): ``"skip"`` (warn and go on), ``"raise"`` (stop at the first non-finite window) or
            ``"apply"`` (nothing is checked, so nothing is reported).
        max_windows (int): Stop once this many windows in a row were skipped.
        records (tuple): The engine's (``accu_nonfinite_streak``, ``accu_skip_history``).
        loss_scaled (bool): Whether a loss scale is in use (its overflows are not warned about one by one).
        save_state (callable): Writes the run's state as it is now (called before stopping), or None.
    """

    def __init__(self, owner, nonfinite, max_windows, records, loss_scaled, save_state=None):
        self.owner, self.nonfinite, self.max_windows = owner, nonfinite, max_windows
        self.history = records[1]
        self.run = int(float(records[0].asnumpy()))  # windows skipped in a row before the first one noted
        self.loss_scaled, self.save_state = loss_scaled, save_state
        self.every = 1 if nonfinite == "raise" else min(CHECK_EVERY, max_windows)
        # windows not yet read: ((update, first micro-batch, micro-batches, micro-batches per epoch), mean loss)
        self.pending = []

    def after_window(self, update, first_micro_batch, micro_batches, micro_batches_per_epoch, outputs=None):
        """Note update `update` (from 1), whose window held micro-batches [first_micro_batch, + micro_batches) of
        the run and gave `outputs` (its loss, or (loss, overflow, loss scale)); every few windows, read the device
        and warn, or stop with :class:`NonFiniteWindowError`."""
        if self.nonfinite == "apply" and not self.loss_scaled:
            return  # nothing is checked, so nothing is skipped
        loss = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        self.pending.append(((update, first_micro_batch, micro_batches, micro_batches_per_epoch), loss))
        if len(self.pending) >= self.every:
            self.check()

    def check(self):
        """Read the skip records now and act on the windows noted since the last read (at an epoch's end, say):
        warn of each skipped window, or stop at the first that reaches the limit (or, with "raise", is skipped),
        naming in the error the skipped windows run after it, before the read."""
        if not self.pending:
            return
        bits = int(float(self.history.asnumpy()))
        pending, self.pending = self.pending, []
        last = len(pending) - 1
        stop, later = None, []
        for index, (window, loss) in enumerate(pending):  # oldest first; the newest window is the lowest bit
            self.run = self.run + 1 if (bits >> (last - index)) & 1 else 0
            if not self.run:
                self._check_loss(window, loss)
                continue
            if stop is not None:
                later.append(window)
            elif self._stops(self.run):
                stop = (window, self.run)
            elif not self.loss_scaled:
                warn(f"{self._message(window, self.run)}; training stops after {self.max_windows}.",
                     NonFiniteWindowWarning)
        if stop is not None:
            newest, _ = pending[-1]
            self._stop(*stop, later, newest)

    def _check_loss(self, window, loss):
        """Warn if an applied window's loss is not finite: its gradient was, so nothing was skipped."""
        value = float(loss.asnumpy()) if loss is not None else 0.0
        if math.isfinite(value):
            return
        update, first, micro_batches, micro_batches_per_epoch = window
        where = micro_batch_positions(first, micro_batches, micro_batches_per_epoch)
        warn(f"For '{self.owner}', window {update}'s loss is {value} but its gradient is finite, so the "
             f"window was applied. Its micro-batches are {where} (counted from 0 in the epoch's data "
             f"order). A sample whose gradient is zero but whose loss is not (a NaN target under nn.L1Loss, "
             f"say) still counts in the window's mean, and a loss term that does not reach the parameters "
             f"can be NaN unseen: inspect those micro-batches.", NonFiniteWindowWarning)

    def _stops(self, in_a_row):
        return in_a_row >= self.max_windows or (self.nonfinite == "raise" and not self.loss_scaled)

    def _cause(self):
        return "overflowed under the loss scale" if self.loss_scaled else "had a non-finite gradient (a NaN or an inf)"

    def _message(self, window, in_a_row):
        update, first, micro_batches, micro_batches_per_epoch = window
        where = micro_batch_positions(first, micro_batches, micro_batches_per_epoch)
        return (f"For '{self.owner}', window {update} {self._cause()} and was skipped: parameters and optimizer state "
                f"are unchanged. Its micro-batches are {where} (counted from 0 in the epoch's data order). "
                f"{in_a_row} window(s) skipped in a row")

    def _stop(self, window, in_a_row, later, newest):
        """Write the state (as it is now: after `newest`, the last window run before the read) and raise."""
        saved = self.save_state() if self.save_state is not None else None
        if in_a_row < self.max_windows:
            reason, instead = "nonfinite='raise'", "pass nonfinite='skip' to skip such windows"
        else:
            reason = f"max_nonfinite_windows={self.max_windows} reached"
            instead = "pass a larger max_nonfinite_windows"
        also = ""
        if later:
            named = ", ".join(f"window {update} ({micro_batch_positions(first, count, per_epoch)})"
                              for update, first, count, per_epoch in later)
            also = f"Run after it, before the skips were read, and also skipped: {named}. "
        after = "this window" if newest is window else f"window {newest[0]}, the last one run"
        kept = f"The state as of {after} (parameters of the last good window) is in {saved!r}; " if saved else \
            "No state_path was given, so no state was written; "
        raise NonFiniteWindowError(f"{self._message(window, in_a_row)} ({reason}). {also}{kept}inspect those "
                                   f"micro-batches, then resume, or {instead}.")
