"""train.py --trainer functional: LeNet trained with the MindSpore 2.x functional loop and ms_accum.Accumulator.

The loop is what a user writes: value_and_grad of the micro-batch's mean loss, a jit-compiled train step that
hands the gradient and the micro-batch's size to the accumulator, and the partial-window policy at the end of
every epoch (flush, drop, or carry the window on). Checkpoints have train.py's format (network, optimizer,
epoch_num, step_num), so eval.py and --resume read them. With a WindowTelemetry (--telemetry_csv), each window
is a row, as with the other trainers.
"""
import contextlib
import math
import time
from functools import partial

import mindspore as ms
from mindspore import nn
from mindspore.train.callback import RunContext

import ms_accum
from ms_accum.compat import InternalCallbackParam
from ms_accum.core.noise_scale import noise_scale_of
from ms_accum.trainers.state import dataset_starting_at
from ms_accum.trainers.telemetry import window_record


def train_functional(net, loss_fn, optimizer, dataset, epochs, steps, files, clip_norm=None, initial_epoch=0,
                     log_every=100, noise_scale=False, average=True, partial_window="flush", initial_updates=0,
                     nonfinite="skip", telemetry=None):
    """Train for epochs initial_epoch+1..epochs with `steps` (N: an int, a schedule or an AdaptiveAccumulation),
    `initial_updates` windows already done (a schedule continues from there); write each epoch's checkpoint
    through `files` (an EpochFiles), and each window to `telemetry` (a WindowTelemetry, or None). Returns the path
    of the last checkpoint."""
    loss_net = nn.WithLossCell(net, loss_fn)
    grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters)
    accumulator = ms_accum.Accumulator(optimizer, steps, clip_norm=clip_norm, noise_scale=noise_scale,
                                       average=average, nonfinite=nonfinite)

    @ms.jit
    def train_step(images, labels):
        loss, grads = grad_fn(images, labels)
        return loss, accumulator(grads, images.shape[0])

    accumulator.accu_windows.set_data(ms.Tensor(initial_updates, ms.int32))
    net.set_train(True)
    micro_per_epoch = dataset.get_dataset_size()
    with dataset_starting_at(dataset, initial_epoch * micro_per_epoch):  # the data order of an uninterrupted run
        iterator = dataset.create_tuple_iterator(num_epochs=epochs)
    state = ms_accum.TrainState(loss_net, optimizer)
    last, done = None, int(accumulator.accu_windows.asnumpy())
    # the CSV is closed also when training raises (MindSpore's callback manager does so for the other trainers)
    with contextlib.nullcontext() if telemetry is None else telemetry:
        rows = None if telemetry is None else _WindowRows(telemetry, accumulator, optimizer, epochs, micro_per_epoch,
                                                         initial_epoch, done)
        for epoch in range(initial_epoch + 1, epochs + 1):
            # samples of the epoch's updates, as the other trainers count them: a window carried in from the epoch
            # before counts here, one carried on or dropped at its end does not
            start, micro, samples = time.time(), 0, _open_samples(accumulator)
            for images, labels in iterator:
                if rows is not None:
                    rows.opens(epoch)
                loss, ended = train_step(images, labels)
                if rows is not None:
                    rows.added(loss, images.shape[0], ended)
                micro += 1
                if log_every and micro % log_every == 0:  # reads the device only when printing
                    print(f"epoch {epoch} micro-batch {micro}/{micro_per_epoch}: "
                          f"{int(accumulator.accu_windows.asnumpy())} updates so far, micro-batch loss "
                          f"{float(loss.asnumpy()):.4f}", flush=True)
                samples += images.shape[0]
            if partial_window != "flush" and not (partial_window == "carry" and epoch == epochs):
                samples -= _open_samples(accumulator)
            if partial_window == "flush" or (partial_window == "carry" and epoch == epochs):
                accumulator.flush()
                if rows is not None:
                    rows.flushed()
            elif partial_window == "drop":
                accumulator.drop()
                if rows is not None:
                    rows.dropped()
            before, done = done, int(accumulator.accu_windows.asnumpy())
            last = files.write(state, epoch, done - before, done)
            elapsed = time.time() - start
            skipped = int(float(accumulator.accu_skipped_windows.asnumpy()))
            print(f"epoch {epoch}/{epochs}: {done - before} updates, {samples} samples in {elapsed:.1f} s "
                  f"({samples / elapsed:.0f} samples/s){_noise_summary(accumulator)}"
                  f"{f', {skipped} windows skipped (not finite) so far' if skipped else ''}", flush=True)
        if rows is not None:
            rows.end()
    return last


def _open_samples(accumulator):
    """The samples of the accumulator's open window (the train step hands it each micro-batch's samples)."""
    return int(round(float(accumulator.accu_items.asnumpy())))


class _WindowRows:
    """A WindowTelemetry fed by the functional loop: a row per window (an update), from the accumulator's records
    of its last window and the loop's micro-batch losses. It reads the device at every micro-batch, to know
    whether the jit step ended a window (the accumulator decides that on the device)."""

    def __init__(self, telemetry, accumulator, optimizer, epochs, micro_per_epoch, initial_epoch, updates):
        self.telemetry, self.accumulator, self.optimizer = telemetry, accumulator, optimizer
        cb_params = InternalCallbackParam()
        cb_params.epoch_num, cb_params.cur_epoch_num, cb_params.cur_step_num = epochs, initial_epoch, updates
        cb_params.batch_num, cb_params.total_updates = 1, None
        cb_params.micro_batches_done = initial_epoch * micro_per_epoch
        cb_params.total_micro_batches = epochs * micro_per_epoch
        self.run_context = RunContext(cb_params)
        self.window, self.window_steps = [], 0  # the open window's (loss, samples) and its N
        telemetry.on_train_begin(self.run_context)

    def opens(self, epoch):
        """Before a micro-batch: the epoch, and the N of a window it opens."""
        self.run_context.original_args().cur_epoch_num = epoch
        if not self.window:
            self.window_steps = self.accumulator.next_window_steps()

    def added(self, loss, samples, ended):
        """After the jit step: its micro-batch loss and samples, and whether it ended the window."""
        self.window.append((loss, samples))
        self.run_context.original_args().micro_batches_done += 1
        if bool(ended.asnumpy()):
            self._row()

    def flushed(self):
        """After Accumulator.flush: the partial window it applied, if one was open."""
        if self.window:
            self._row()

    def dropped(self):
        self.window = []

    def _row(self):
        cb_params = self.run_context.original_args()
        cb_params.cur_step_num += 1
        items = sum(samples for _, samples in self.window)
        mean_loss = sum(float(loss.asnumpy()) * samples for loss, samples in self.window) / items
        accumulator = self.accumulator
        cb_params.window_record = partial(window_record, cb_params, ms.Tensor(mean_loss, ms.float32),
                                          len(self.window), (accumulator.accu_last_items,
                                                             accumulator.accu_last_grad_norm,
                                                             accumulator.accu_last_clipped,
                                                             accumulator.accu_nonfinite_streak),
                                          self.optimizer, accumulator.noise_records, self.window_steps)
        self.telemetry.on_train_step_end(self.run_context)
        self.window = []

    def end(self):
        self.telemetry.on_train_end(self.run_context)


def _noise_summary(accumulator):
    """', noise scale B items, N now' when the accumulator measures the noise scale, else ''."""
    if accumulator.noise_records is None:
        return ""
    _, _, grad_sq, trace = (float(value.asnumpy()) for value in accumulator.noise_records)
    noise = noise_scale_of(grad_sq, trace)
    # NaN: no window measured yet, or the smoothed |G|^2 is not > 0 now (the noise swamps the signal); an adaptive
    # N then stays where an earlier estimate put it
    shown = ("not estimated" if grad_sq == 0.0 else "none now (smoothed |G|^2 <= 0)") if math.isnan(noise) else \
        f"{noise:.0f} samples"
    return f", noise scale {shown}, N now {accumulator.next_window_steps()}"
