"""train.py --trainer functional: LeNet trained with the MindSpore 2.x functional loop and ms_accum.Accumulator.

The loop is what a user writes: value_and_grad of the micro-batch's mean loss, a jit-compiled train step that
hands the gradient and the micro-batch's size to the accumulator, and the partial-window policy at the end of
every epoch (flush, drop, or carry the window on). Checkpoints have train.py's format (network, optimizer,
epoch_num, step_num), so eval.py and --resume read them.
"""
import math
import time

import mindspore as ms
from mindspore import nn

import ms_accum
from ms_accum.core.noise_scale import noise_scale_of
from ms_accum.trainers.state import dataset_starting_at


def train_functional(net, loss_fn, optimizer, dataset, epochs, steps, files, clip_norm=None, initial_epoch=0,
                     log_every=100, noise_scale=False, average=True, partial_window="flush", initial_updates=0,
                     nonfinite="skip"):
    """Train for epochs initial_epoch+1..epochs with `steps` (N: an int, a schedule or an AdaptiveAccumulation),
    `initial_updates` windows already done (a schedule continues from there); write each epoch's checkpoint
    through `files` (an EpochFiles). Returns the path of the last checkpoint."""
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
    for epoch in range(initial_epoch + 1, epochs + 1):
        start, micro, samples = time.time(), 0, 0
        for images, labels in iterator:
            loss, _ = train_step(images, labels)
            micro += 1
            if log_every and micro % log_every == 0:  # reads the device only when printing
                print(f"epoch {epoch} micro-batch {micro}/{micro_per_epoch}: "
                      f"{int(accumulator.accu_windows.asnumpy())} updates so far, micro-batch loss "
                      f"{float(loss.asnumpy()):.4f}", flush=True)
            samples += images.shape[0]
        if partial_window == "flush" or (partial_window == "carry" and epoch == epochs):
            accumulator.flush()
        elif partial_window == "drop":
            accumulator.drop()
        before, done = done, int(accumulator.accu_windows.asnumpy())
        last = files.write(state, epoch, done - before, done)
        elapsed = time.time() - start
        skipped = int(float(accumulator.accu_skipped_windows.asnumpy()))
        print(f"epoch {epoch}/{epochs}: {done - before} updates, {samples} samples in {elapsed:.1f} s "
              f"({samples / elapsed:.0f} samples/s){_noise_summary(accumulator)}"
              f"{f', {skipped} windows skipped (not finite) so far' if skipped else ''}", flush=True)
    return last


def _noise_summary(accumulator):
    """', noise scale B items, N now' when the accumulator measures the noise scale, else ''."""
    if accumulator.noise_records is None:
        return ""
    _, _, grad_sq, trace = (float(value.asnumpy()) for value in accumulator.noise_records)
    noise = noise_scale_of(grad_sq, trace)
    shown = "not yet estimated" if math.isnan(noise) else f"{noise:.0f} samples"
    return f", noise scale {shown}, N now {accumulator.next_window_steps()}"
