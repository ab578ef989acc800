"""The one training loop under :class:`GradientAccumulation` and :class:`Model_ACCU` without sink mode.

It cuts epochs of micro-batches into windows and owns everything both trainers must do alike: the N of each
window (asked of the front end when the window opens), the partial-window policy at an epoch's end, the callbacks
(one step per update), the exact-state writes, the position in the data and stop requests (a stop writes the
state, when it is being kept, so that a resume loses nothing). A front end only runs
micro-batches and windows its own way (:class:`LoopFrontEnd`).

Partial windows: under ``"flush"`` (and ``"carry"`` in the last epoch) the epoch's last micro-batch ends its window,
so no graph beyond the micro-batch's is needed; under ``"drop"`` it is accumulated, then the window is discarded
and its update number given to the next one; under ``"carry"`` the window goes on into the next epoch.
"""

from mindspore.train.callback import Callback, LearningRateScheduler, LossMonitor, RunContext

from ..core.open_window import OpenWindow, epoch_end_action
from ..core.user_warning import warn


def updates_of_epochs(updates_before):
    """Each epoch's updates from :meth:`AccumulationSchedule.run_plan`'s windows begun before each epoch."""
    return [after - before for before, after in zip(updates_before, updates_before[1:])]


def callback_list(callbacks):
    """The user's callbacks as a list: a Callback, a list or tuple of them, or None."""
    if callbacks is None:
        return []
    return [callbacks] if isinstance(callbacks, Callback) else list(callbacks)


def check_rate_callbacks(owner, callbacks, cell):
    """
    Refuse MindSpore's LearningRateScheduler among `callbacks` when `cell` has a learning-rate rule, before training:
    the callback reads and assigns the optimizer's rate as a Parameter, which the rule replaced with a
    :class:`ProgressLearningRate` read at the run's progress (it failed after the first window, in MindSpore's words).
    """
    if cell.lr_state is None or not any(isinstance(callback, LearningRateScheduler)
                                        for callback in callback_list(callbacks)):
        return
    raise ValueError(f"For '{owner}', MindSpore's LearningRateScheduler in 'callbacks' sets the optimizer's learning "
                     f"rate as a Parameter, but under lr_scaling='{cell.lr_scaling}' the rate is a "
                     f"ProgressLearningRate, read from the optimizer's schedule at the run's progress: the callback "
                     f"would fail after the first update. Give the schedule as the optimizer's learning-rate list or "
                     f"LearningRateSchedule, which the rule reads at the run's progress, or set a constant base rate "
                     f"with optimizer.learning_rate.set_data(value) from a callback of your own "
                     f"(docs/batch_schedules.md).")


def check_loss_monitor(owner, callbacks, updates_before, first_epoch):
    """
    Warn if MindSpore's LossMonitor is among `callbacks` (a Callback, a list of them or None) and would label
    updates wrongly. It labels an update step ``(cur_step_num - 1) % batch_num + 1`` of its epoch, right only when
    the updates before each epoch are a multiple of that epoch's own; not so when N follows a schedule, when
    windows are carried across epochs, or when an adaptive policy (`updates_before` None) decides. `first_epoch`:
    the run's first epoch (from 1).
    """
    if not any(isinstance(callback, LossMonitor) for callback in callback_list(callbacks)):
        return
    fix = ("The updates and losses are right; ms_accum.WindowTelemetry(print_every=1) counts the updates within "
           "each epoch.")
    if updates_before is None:
        warn(f"For '{owner}', MindSpore's LossMonitor labels an update 'step (cur_step_num - 1) % "
             f"batch_num + 1' of its epoch, but an adaptive N decides how many updates each epoch has, so "
             f"its step labels may be off after the first epoch. {fix}", UserWarning)
        return
    per_epoch = updates_of_epochs(updates_before)
    wrong = [epoch for epoch in range(first_epoch, len(per_epoch) + 1)
             if per_epoch[epoch - 1] and updates_before[epoch - 1] % per_epoch[epoch - 1]]
    if wrong:
        warn(f"For '{owner}', MindSpore's LossMonitor labels an update 'step (cur_step_num - 1) % "
             f"batch_num + 1' of its epoch, right only when every epoch has as many updates, but this "
             f"run's epochs have {', '.join(str(n) for n in per_epoch)} (N follows a schedule, or windows "
             f"are carried across epochs), so its step labels will be off from epoch {wrong[0]}. {fix}",
             UserWarning)


class LoopFrontEnd:
    """What a trainer supplies to :class:`WindowLoop`: the first five methods are required; the hooks after them
    do nothing unless a trainer needs them."""

    def window_steps(self, update):
        """The N of window `update` (counted from 0), when it opens."""
        raise NotImplementedError

    def accumulate(self, data):
        """Add micro-batch `data` to the open window."""
        raise NotImplementedError

    def update(self, data):
        """Add micro-batch `data`, end the window (one optimizer step, or a skip), clear it; return the outputs."""
        raise NotImplementedError

    def drop(self):
        """Discard the open window."""
        raise NotImplementedError

    def window_record(self, cb_params, outputs, micro_batches, window_steps):
        """A function building the update's :class:`WindowRecord` on demand."""
        raise NotImplementedError

    def nonfinite_guard(self, save_state):
        """The run's :class:`NonFiniteGuard` (`save_state` writes the state now), or None."""
        return None

    def step_begins(self, cb_params, data):
        """A window opens (before ``on_train_step_begin``)."""

    def updated(self, cb_params, update, micro_batches, window_steps, outputs):
        """Window `update` was applied (before ``on_train_step_end``)."""

    def epoch_begins(self, cb_params):
        """An epoch begins (before ``on_train_epoch_begin``)."""

    def epoch_ends(self, cb_params, callbacks):
        """An epoch's micro-batches and its partial window are done (before ``on_train_epoch_end``)."""

    def epoch_ended(self, cb_params):
        """After ``on_train_epoch_end``."""


class WindowLoop:
    """
    Epochs of micro-batches cut into windows.

    Args:
        front (LoopFrontEnd): The trainer's side.
        epochs (int): Epochs of the run.
        micro_batches_per_epoch (int): Micro-batches per epoch.
        partial_window (str): ``"flush"``, ``"drop"`` or ``"carry"``.
        cb_params: The callbacks' parameters (``cur_step_num`` counts updates begun since the start; ``batch_num``
            is set to each epoch's updates when `updates_before` is given; at each update ``micro_batches_done``
            and ``total_micro_batches`` give the run's progress in micro-batches; ``open_micro_batches`` gives the
            micro-batches of a window open across an epoch's begin or end, 0 if none and at every update).
        callbacks: A callback list with the ``on_train_*`` methods.
        start_micro (int): Micro-batches of the run already done (a resume, or initial epochs).
        open_micro_batches (int): Micro-batches of the open window already added (a resumed window), read from the
            device once: the loop's :class:`OpenWindow` counts on from them, the one count of the open window on
            the host (``window``).
        writer (StateWriter): Writes the exact state.
        updates_before (list[int], optional): Windows begun before each epoch (``run_plan``), or None when an
            adaptive policy decides N. Default: ``None``.

    After every update the front end's :class:`NonFiniteGuard` (if any) notes the window, and every few windows and
    at each epoch's end reads which were skipped for a non-finite gradient: it warns naming the window's
    micro-batches, or stops training, the state written first.
    """

    def __init__(self, front, epochs, micro_batches_per_epoch, partial_window, cb_params, callbacks, start_micro,
                 open_micro_batches, writer, updates_before=None):
        self.front, self.epochs, self.per_epoch_micro = front, epochs, micro_batches_per_epoch
        self.per_epoch = None if updates_before is None else updates_of_epochs(updates_before)
        self.partial_window = partial_window
        self.cb_params, self.callbacks = cb_params, callbacks
        self.run_context = RunContext(cb_params)
        self.micro_done, self.writer = start_micro, writer
        self.window = OpenWindow(open_micro_batches, front.window_steps(cb_params.cur_step_num - 1)
                                 if open_micro_batches else 0)
        self.guard = front.nonfinite_guard(lambda: writer.save_now(self.micro_done, cb_params.cur_step_num))

    def run(self, epoch_data):
        """Train; `epoch_data(epoch)` gives the micro-batches (tuples) of epoch `epoch` (from 1), from the position
        reached."""
        cb_params, callbacks, run_context = self.cb_params, self.callbacks, self.run_context
        self._epoch_updates(self.micro_done // self.per_epoch_micro + 1)
        callbacks.on_train_begin(run_context)
        for epoch in range(self.micro_done // self.per_epoch_micro + 1, self.epochs + 1):
            cb_params.cur_epoch_num = epoch
            cb_params.open_micro_batches = self.window.micro_batches
            self._epoch_updates(epoch)
            self.front.epoch_begins(cb_params)
            callbacks.on_train_epoch_begin(run_context)
            for data in epoch_data(epoch):
                boundary = self._micro_batch(data, last_of_epoch=(self.micro_done + 1) % self.per_epoch_micro == 0,
                                             last_epoch=epoch == self.epochs)
                if self.micro_done % self.per_epoch_micro:  # the epoch's last is saved once its epoch has ended
                    self.writer.after(self.micro_done, cb_params.cur_step_num, at_update_boundary=boundary,
                                      open_window=self.window.micro_batches)
                if boundary and run_context.get_stop_requested():
                    self.writer.on_stop(self.micro_done, cb_params.cur_step_num)
                    break
            if self.window.is_open and epoch_end_action(self.partial_window, epoch == self.epochs) == "drop":
                self.front.drop()
                self.window.close()
                cb_params.cur_step_num -= 1  # the window begun is not an update: the next one takes its number
            if self.guard is not None:
                self.guard.check()  # every window of the epoch reported before it ends
            self.writer.after(self.micro_done, cb_params.cur_step_num, at_update_boundary=not self.window.is_open,
                              open_window=self.window.micro_batches)
            cb_params.open_micro_batches = self.window.micro_batches
            self.front.epoch_ends(cb_params, callbacks)
            callbacks.on_train_epoch_end(run_context)
            self.front.epoch_ended(cb_params)
            if run_context.get_stop_requested():
                self.writer.on_stop(self.micro_done, cb_params.cur_step_num)
                break
        callbacks.on_train_end(run_context)

    def _epoch_updates(self, epoch):
        """``batch_num``: epoch `epoch`'s updates when known (at least 1: MindSpore's TimeMonitor divides by it)."""
        if self.per_epoch is not None and epoch <= self.epochs:
            self.cb_params.batch_num = max(1, self.per_epoch[epoch - 1])

    def _micro_batch(self, data, last_of_epoch, last_epoch):
        """Run one micro-batch; returns whether a window ended with it."""
        cb_params = self.cb_params
        if not self.window.is_open:
            cb_params.cur_step_num += 1
            self.window.open(self.front.window_steps(cb_params.cur_step_num - 1))
            self.front.step_begins(cb_params, data)
            self.callbacks.on_train_step_begin(self.run_context)
        full = self.window.add()
        self.micro_done += 1
        ends_epoch = last_of_epoch and epoch_end_action(self.partial_window, last_epoch) == "update"
        if not full and not ends_epoch:
            self.front.accumulate(data)
            return False
        outputs = self.front.update(data)
        window_steps = self.window.steps
        micro_batches = self.window.close()
        cb_params.open_micro_batches = 0
        cb_params.net_outputs = outputs
        cb_params.window_micro_batches = micro_batches
        cb_params.window_micro_steps = micro_batches  # its name before 0.4.0, kept until 0.5.0 (CHANGELOG.md)
        cb_params.micro_batches_done = self.micro_done
        cb_params.total_micro_batches = self.epochs * self.per_epoch_micro
        cb_params.window_record = self.front.window_record(cb_params, outputs, micro_batches, window_steps)
        self.front.updated(cb_params, cb_params.cur_step_num - 1, micro_batches, window_steps, outputs)
        self.callbacks.on_train_step_end(self.run_context)
        if self.guard is not None:
            self.guard.after_window(cb_params.cur_step_num, self.micro_done - micro_batches, micro_batches,
                                    self.per_epoch_micro, outputs)
        return True
