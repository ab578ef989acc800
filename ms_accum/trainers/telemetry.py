"""Window telemetry: one record per update, printed as progress and/or written to CSV.

The trainers (GradientAccumulation.train_process and Model_ACCU.train) put a ``window_record`` function into the
callback parameters at every update; it reads the figures from the device only when a callback asks for them.
"""
import csv
import math
import os
import time
from dataclasses import asdict, dataclass, fields

import numpy as np

from mindspore import Parameter, Tensor
from mindspore import dtype as mstype
from mindspore.nn import CellList
from mindspore.train import Callback

from ..core.noise_scale import noise_scale_of
from ..core.progress_lr import ProgressLearningRate
from .elastic import count


@dataclass
class WindowRecord:
    """
    The figures of one update (one accumulation window), as :class:`WindowTelemetry` keeps them in ``records``.

    Args:
        epoch (int): The epoch, from 1.
        update (int): The update within the run, from 1.
        micro_batches (int): Micro-batches in the window, on each device (N; in data parallel every device runs N).
        items (float): Samples (or items) in the window, over all devices.
        loss (float): The window's mean loss over its items.
        grad_norm (float): The global norm of the applied gradient, before clipping.
        clipped (bool): Whether the gradient was clipped.
        loss_scale (float): The loss scale after the window's update, the one the next window runs with (a
            dynamic scale halved after an overflowing window; 1.0 without loss scaling).
        overflow (bool): Whether the window was skipped: it overflowed under the loss scale, or its gradient was
            not finite.
        learning_rate (float): The learning rate of the update (of the optimizer's last step for a skipped window,
            which takes none; 0 before any, when the rate is read from progress).
        accumulation_steps (int): The micro-batches the schedule asked of this window (more than
            `micro_batches` for a partial window at an epoch's end). Default: ``0`` (not given).
        grad_sq (float): The window's unbiased estimate of |G|^2, the squared norm of the true gradient (NaN when
            the noise scale is not measured, or the window had one micro-batch or overflowed). Default: NaN.
        noise_trace (float): The window's unbiased estimate of tr(Sigma), the trace of the per-item gradient
            covariance (NaN as for `grad_sq`). Default: NaN.
        noise_scale (float): B_simple = tr(Sigma) / |G|^2 in items, from the exponentially smoothed estimates of
            this and earlier windows (NaN before the first estimate, or while the smoothed |G|^2 is not positive;
            0 while the smoothed tr(Sigma) is negative). Default: NaN.
        progress (float): The run's progress after the window, in reference steps (G / G0 per applied window, or
            AdaScale's gains), for an optimizer that reads its rate from progress (a cell built with
            `lr_scaling`); NaN otherwise. Default: NaN.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> record = ms_accum.WindowRecord(epoch=1, update=1, micro_batches=4, items=128.0, loss=0.52,
        ...                                grad_norm=1.3, clipped=False, loss_scale=1.0, overflow=False,
        ...                                learning_rate=0.01)
        >>> record.items / record.micro_batches
        32.0
    """

    epoch: int
    update: int
    micro_batches: int
    items: float
    loss: float
    grad_norm: float
    clipped: bool
    loss_scale: float
    overflow: bool
    learning_rate: float
    accumulation_steps: int = 0
    grad_sq: float = math.nan
    noise_trace: float = math.nan
    noise_scale: float = math.nan
    progress: float = math.nan


def _scalar(value):
    return float(np.asarray(value.asnumpy() if isinstance(value, Tensor) else value).reshape(-1)[0])


def _first_rate(optimizer):
    """The optimizer's learning rate, its first parameter group's for grouped rates."""
    rate = optimizer.learning_rate
    if isinstance(rate, (list, tuple, CellList)):
        rate = rate[0]
    return rate


def learning_rate_applied(optimizer):
    """The learning rate of the optimizer's last step (the first parameter group's, for grouped rates): for one
    that reads it from progress, the rate its step recorded (the factor included; progress has moved on since)."""
    rate = _first_rate(optimizer)
    if isinstance(rate, ProgressLearningRate):
        return _scalar(rate.applied_rate)
    if isinstance(rate, (Parameter, Tensor)):
        return _scalar(rate)
    step = max(int(_scalar(optimizer.global_step)) - 1, 0)
    return _scalar(rate(Tensor(step, mstype.int32)))


def rate_held(optimizer):
    """The optimizer's constant learning rate (a Parameter: the first group's) copied on the device now, without
    waiting for it, for a record read later: a callback earlier in the list may set the next update's rate before
    the record is read. None for a rate read from the step or from progress (:func:`learning_rate_applied` reads
    what the step used, at any time)."""
    rate = _first_rate(optimizer)
    return rate * 1 if isinstance(rate, (Parameter, Tensor)) else None


def progress_of(optimizer):
    """The run's progress in reference steps for an optimizer that reads its rate from progress, else NaN."""
    rate = _first_rate(optimizer)
    if not isinstance(rate, ProgressLearningRate):
        return math.nan
    return _scalar(rate.progress_steps) + _scalar(rate.progress_fraction)


def window_record(cb_params, outputs, micro_batches, last, optimizer, noise=None, accumulation_steps=0, rate=None):
    """A WindowRecord from an update's outputs (a loss, or (loss, overflow, loss scale) with loss scaling), the
    window's records `last` (its items, its gradient norm before clipping, whether it was clipped, the windows
    skipped in a row up to it: it was skipped itself when that is not 0), the noise
    scale's records `noise` (a NoiseMeasure's ``noise_records``, or None), the `accumulation_steps` asked and the
    update's learning rate as :func:`rate_held` took it (None: read from `optimizer`)."""
    items, grad_norm, clipped, streak = last
    grad_sq = noise_trace = scale_b = math.nan
    if noise is not None:
        grad_sq, noise_trace, smooth_grad_sq, smooth_trace = (_scalar(value) for value in noise)
        scale_b = noise_scale_of(smooth_grad_sq, smooth_trace)
    if isinstance(outputs, (tuple, list)):
        loss, overflow, scale = _scalar(outputs[0]), bool(_scalar(outputs[1])), _scalar(outputs[2])
    else:
        loss, overflow, scale = _scalar(outputs), _scalar(streak) > 0, 1.0
    return WindowRecord(epoch=int(cb_params.cur_epoch_num), update=int(cb_params.cur_step_num),
                        micro_batches=int(micro_batches), items=_scalar(items), loss=loss,
                        grad_norm=_scalar(grad_norm), clipped=bool(_scalar(clipped)), loss_scale=scale,
                        overflow=overflow,
                        learning_rate=learning_rate_applied(optimizer) if rate is None else _scalar(rate),
                        accumulation_steps=int(accumulation_steps), grad_sq=grad_sq, noise_trace=noise_trace,
                        noise_scale=scale_b, progress=progress_of(optimizer))


def _open_csv(path, mode):
    """`path` opened for writing text (`mode` "w" or "a"), its directory made; a ValueError naming 'csv_path' if
    the system refuses."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return open(path, mode, newline="", encoding="utf-8")  # pylint: disable=consider-using-with
    except OSError as error:
        raise ValueError(f"For 'WindowTelemetry', 'csv_path' must be a file that can be written, but {str(path)!r} "
                         f"cannot: {error.strerror or error}. Pass a path in a directory you can write to."
                         ) from error


class WindowTelemetry(Callback):
    r"""
    Reports every update: the window's mean unscaled loss over its items, its micro-batches and items (samples,
    unless the loss network returns ``(loss, num_items)``), the gradient's global norm before clipping and whether
    it was clipped, the loss scale, skipped (overflowing) windows and the learning rate applied (with a learning-rate
    rule, the rate the step read, its factor included, and the run's progress); with the trainer's
    ``noise_scale=True``, the window's estimates of |G|^2 and tr(Sigma) and the smoothed noise scale.

    Works with :class:`GradientAccumulation` and :class:`Model_ACCU`. Progress lines give updates done out of the
    total (no total when an adaptive N decides the updates as it goes), the throughput and the time left (from the
    micro-batches still to run), both measured from the end of the run's first update so that its compilation does
    not count (the first update's line gives its time instead); the CSV gets one row per update
    (columns: the fields of :class:`WindowRecord`, then ``skipped`` and ``elapsed_s``, seconds since training
    began), flushed as it goes. A run resumed from a training state keeps the rows its CSV holds for the updates
    before its first, and counts ``skipped`` and ``elapsed_s`` on from them.

    Args:
        csv_path (str, optional): CSV file to write; its directory is created. Default: ``None``.
        print_every (int): Print a progress line every this many updates; 0 to stay quiet. Default: ``0``.

    Raises:
        TypeError: If `csv_path` is neither a str nor None.
        ValueError: If `print_every` is negative, or `csv_path` cannot be written (its directory cannot be made,
            or it is a directory).
        RuntimeError: At the first update, if the trainer provides no window records.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> telemetry = ms_accum.WindowTelemetry(csv_path="runs/telemetry.csv", print_every=50)
        >>> # trainer.train_process(10, dataset, 4, callbacks=[telemetry])
    """

    COLUMNS = [f.name for f in fields(WindowRecord)] + ["skipped", "elapsed_s"]

    def __init__(self, csv_path=None, print_every=0):
        super().__init__()
        if isinstance(print_every, bool) or not isinstance(print_every, int) or print_every < 0:
            raise ValueError(f"For 'WindowTelemetry', 'print_every' must be an int >= 0, but got {print_every!r}.")
        if csv_path is not None:
            if not isinstance(csv_path, (str, os.PathLike)):
                raise TypeError(f"For 'WindowTelemetry', 'csv_path' must be a str path or None, but got "
                                f"{type(csv_path).__name__}.")
            _open_csv(csv_path, "a").close()  # refused now, before training compiles, if it cannot be written
        self.csv_path = csv_path
        self.print_every = print_every
        self.records = []
        self.skipped = 0
        self._file = self._writer = None
        self._start = self._items = 0.0
        self._warm = None  # (time, items, update, done) at the end of this run's first update
        self._last = None  # (time, done, in all) at the newest update
        self._elapsed_before = 0.0

    def on_train_begin(self, run_context):
        self._start, self._items = time.time(), 0.0
        self._warm = self._last = None
        self._elapsed_before = 0.0  # elapsed_s of the last row a resumed run keeps (_open_at)

    def _open_at(self, update):
        """Open the CSV at this run's first update, `update`. A run resumed there keeps the rows the earlier run
        wrote for the updates before it (from a file with these columns), and its ``skipped`` and ``elapsed_s`` go
        on from the last of them; the rows of updates it trains again, and any other file, are replaced."""
        kept = _rows_before(self.csv_path, update, self.COLUMNS)
        self._file = _open_csv(self.csv_path, "w")
        self._writer = csv.writer(self._file)
        self._writer.writerow(self.COLUMNS)
        self._writer.writerows(kept)
        if kept:
            self.skipped, self._elapsed_before = int(kept[-1][-2]), float(kept[-1][-1])

    def on_train_step_end(self, run_context):
        cb_params = run_context.original_args()
        make_record = cb_params.get("window_record")
        if make_record is None:
            raise RuntimeError("For 'WindowTelemetry', the trainer must provide window records: use it with "
                               "ms_accum.GradientAccumulation.train_process or ms_accum.Model_ACCU.train.")
        record = make_record()
        if self.csv_path and self._file is None:
            self._open_at(record.update)
        self.records.append(record)
        self.skipped += record.overflow
        self._items += record.items
        now = time.time()
        elapsed = now - self._start
        progress = _progress(cb_params, record.update)
        if self._warm is None:
            self._warm = (now, self._items, record.update, progress[0])
        self._last = (now, *progress)
        if self._writer:
            self._writer.writerow(list(asdict(record).values()) + [self.skipped,
                                                                   round(self._elapsed_before + elapsed, 3)])
            self._file.flush()
        if self.print_every and record.update % self.print_every == 0:
            total = _updates_in_all(cb_params)
            clipped = " (clipped)" if record.clipped else ""
            this_one = " (this one)" if record.overflow else ""
            noise = "" if math.isnan(record.noise_scale) else f" | noise scale {record.noise_scale:.4g} items"
            out_of = "" if total is None else f"/{total}"  # an adaptive N decides the run's updates as it goes
            partial = f" of {record.accumulation_steps} (partial)" \
                if 0 < record.micro_batches < record.accumulation_steps else ""
            print(f"update {record.update}{out_of} (epoch {record.epoch}/{cb_params.epoch_num}) "
                  f"loss {record.loss:.4f} | window: {count(record.micro_batches, 'micro-batch')}{partial}, "
                  f"{record.items:.0f} items | grad norm {record.grad_norm:.3g}{clipped} | lr "
                  f"{record.learning_rate:.3g} | loss scale {record.loss_scale:g}, {self.skipped} skipped{this_one}"
                  f"{noise} | {self._pace(now, elapsed, record.update)}", flush=True)

    def _pace(self, now, elapsed, update):
        """Throughput from the end of the run's first update (whose graphs compile) to `now`, and the time left
        (:meth:`seconds_left`); at the first update, its time instead."""
        warm_time, warm_items, warm_update, _ = self._warm
        if update == warm_update:
            return f"first update after {elapsed:.1f} s (compiling included)"
        left = self.seconds_left()
        left = "" if left is None else f", {left:.0f} s left"
        return f"{(self._items - warm_items) / max(now - warm_time, 1e-9):.0f} items/s{left}"

    def seconds_left(self):
        """
        The run's time left at its newest update, in seconds, as the progress lines give it: the time since the end
        of the run's first update (whose graphs compile) over the work done since, times the work still to do
        (micro-batches where the trainer gives them, else updates).

        Returns:
            float, or None before the run's second update, or where the run's total is not known.
        """
        if self._last is None:
            return None
        now, done, total = self._last
        warm_time, _, _, warm_done = self._warm
        if total is None or done == warm_done:  # no total, or nothing run since the first update to time
            return None
        return (now - warm_time) / (done - warm_done) * max(total - done, 0)

    def on_train_end(self, run_context):
        """Close the CSV file (its rows are flushed as they are written)."""
        self._close()

    def __exit__(self, *err):
        """Close the CSV file also when training raises: MindSpore's callback manager, which the driver and
        Model.train run the callbacks in, exits each callback either way (on_train_end is not called then)."""
        self._close()

    def _close(self):
        if self._file:
            self._file.close()
            self._file = self._writer = None


def _rows_before(path, update, columns):
    """The rows of the CSV at `path` for the updates before `update`, where it is a telemetry CSV with `columns`;
    none where there is no such file."""
    try:
        with open(path, newline="", encoding="utf-8") as file:
            rows = list(csv.reader(file))
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    if not rows or rows[0] != columns:
        return []
    at = columns.index("update")
    try:
        return [row for row in rows[1:] if len(row) == len(columns) and int(row[at]) < update]
    except ValueError:  # a row that is not a telemetry row: the file is someone else's
        return []


def _updates_in_all(cb_params):
    """The run's updates: the trainer's total; None when an adaptive N decides them as it goes (the trainer's loop
    then gives micro-batches); epochs x updates per epoch from a trainer that gives neither. (MindSpore's callback
    parameters raise KeyError, not AttributeError, for a name never set: hence ``get``.)"""
    total = cb_params.get("total_updates")
    if total is None and cb_params.get("total_micro_batches") is None:
        total = int(cb_params.epoch_num) * int(cb_params.batch_num)
    return total


def _progress(cb_params, update):
    """(done, in all) of the run: in micro-batches where the trainer's loop gives them, whose time is the same
    whatever N (a window's time grows with N under a schedule or an adaptive N); else in updates."""
    total = cb_params.get("total_micro_batches")
    if total is not None:
        return cb_params.get("micro_batches_done"), total
    return update, _updates_in_all(cb_params)
