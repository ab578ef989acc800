"""train.py --trainer functional: LeNet trained with the MindSpore 2.x functional loop and ms_accum.Accumulator.

The loop is what a user writes: value_and_grad of the micro-batch's mean loss, a jit-compiled train step that
hands the gradient and the micro-batch's size to the accumulator, a flush at the end of every epoch. Checkpoints
have train.py's format (network, optimizer, epoch_num, step_num), so eval.py and --resume read them.
"""
import os
import time

import mindspore as ms
from mindspore import nn

import ms_accum
from ms_accum.trainers.state import dataset_starting_at


def train_functional(net, loss_fn, optimizer, dataset, epochs, accumulation_steps, directory, clip_norm=None,
                     initial_epoch=0, log_every=100):
    """Train for epochs initial_epoch+1..epochs; write checkpoint_lenet-<epoch>_<updates in epoch>.ckpt after
    each epoch. Returns the path of the last checkpoint."""
    loss_net = nn.WithLossCell(net, loss_fn)
    grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters)
    accumulator = ms_accum.Accumulator(optimizer, accumulation_steps, clip_norm=clip_norm)

    @ms.jit
    def train_step(images, labels):
        loss, grads = grad_fn(images, labels)
        return loss, accumulator(grads, images.shape[0])

    net.set_train(True)
    steps = dataset.get_dataset_size()
    with dataset_starting_at(dataset, initial_epoch * steps):  # the data order of an uninterrupted run
        iterator = dataset.create_tuple_iterator(num_epochs=epochs)
    updates_per_epoch = ms_accum.updates_per_epoch(steps, accumulation_steps, "flush")
    state = ms_accum.TrainState(loss_net, optimizer)
    last = None
    for epoch in range(initial_epoch + 1, epochs + 1):
        start, micro, window_samples = time.time(), 0, 0
        for images, labels in iterator:
            loss, _ = train_step(images, labels)
            micro += 1
            if log_every and micro % (accumulation_steps * log_every) == 0:  # reads the device only when printing
                print(f"epoch {epoch} update {micro // accumulation_steps}/{updates_per_epoch}: micro-batch loss "
                      f"{float(loss.asnumpy()):.4f}", flush=True)
            window_samples += images.shape[0]
        accumulator.flush()
        last = os.path.join(directory, f"checkpoint_lenet-{epoch}_{updates_per_epoch}.ckpt")
        ms_accum.save_checkpoint_atomic(state, last, append_dict={"epoch_num": epoch,
                                                                  "step_num": epoch * updates_per_epoch})
        elapsed = time.time() - start
        print(f"epoch {epoch}/{epochs}: {updates_per_epoch} updates, {window_samples} samples in {elapsed:.1f} s "
              f"({window_samples / elapsed:.0f} samples/s)", flush=True)
    return last
