"""What the benchmarks share: MindSpore on CPU with train.py's defaults, the one LeNet5 job they all train (sparse
softmax cross-entropy, Momentum(0.01, 0.9)), plain or through the three accumulation cells, one update of each,
and the timing loop."""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "model_zoo_lenet"))
sys.path.insert(0, ROOT)


def start_mindspore(mode):
    """Apply train.py's CPU defaults (before MindSpore loads), then set the CPU device and `mode`."""
    from src.cpu_speed import apply_env_defaults, set_mode  # pylint: disable=import-outside-toplevel
    apply_env_defaults()
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    ms.set_device("CPU")
    set_mode(mode)


def sample_arrays(count=None):
    """The bundled Fashion-MNIST sample's training images as train.py prepares them (float32 N x 1 x 32 x 32,
    normalised) and their int32 labels, in file order; repeated to `count` samples when given."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    from src.dataset import create_dataset  # pylint: disable=import-outside-toplevel
    sample = create_dataset(os.path.join(ROOT, "model_zoo_lenet", "data", "fashion_mnist_sample"), 1000, "train",
                            shuffle=False)
    pairs = list(sample.create_tuple_iterator(num_epochs=1, output_numpy=True))
    images, labels = np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])
    if count is not None:
        reps = -(-count // len(images))
        images, labels = np.tile(images, (reps, 1, 1, 1))[:count], np.tile(labels, reps)[:count]
    return images, labels


def lenet_parts():
    """A fresh (LeNet5, loss, optimizer)."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    from src.lenet import LeNet5  # pylint: disable=import-outside-toplevel
    net = LeNet5()
    return (net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            nn.Momentum(net.trainable_params(), 0.01, 0.9))


def three_cells(net, loss, optimizer):
    """(TrainForwardBackward, TrainOptim, TrainClear) on fresh grad_sum buffers."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
    return (ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), optimizer, grad_sum),
            ms_accum.TrainOptim(optimizer, grad_sum), ms_accum.TrainClear(grad_sum))


def plain_step(net, loss, optimizer):
    """nn.TrainOneStepCell over the loss network."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    return nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)


def plain_and_three_cells():
    """(plain TrainOneStepCell, TrainForwardBackward, TrainOptim, TrainClear), on two separate fresh networks."""
    return (plain_step(*lenet_parts()),) + three_cells(*lenet_parts())


def dataset_trainer(config, steps):
    """run(dataset, epochs) for the dataset-fed configurations, each on a fresh LeNet, with a TimeMonitor callback:
    'plain-b-data' (`Model.train` over `TrainOneStepCell`), 'driver' (`GradientAccumulation.train_process`) or
    'model-accu' (`Model_ACCU.train` over `TrainAccuStepsCell`), the last two with N = `steps`."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    net, loss, opt = lenet_parts()
    callbacks = [ms.train.TimeMonitor()]
    if config == "driver":
        trainer = ms_accum.GradientAccumulation(net, loss, opt)

        def run(dataset, epochs):
            trainer.train_process(epochs, dataset, steps, ckpt_path=None, log_every=0, callbacks=callbacks)
        return run
    if config == "model-accu":
        model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt,
                                                                accumulation_steps=steps))
    elif config == "plain-b-data":
        model = ms.train.Model(plain_step(net, loss, opt))
    else:
        raise ValueError(f"'config' must be 'plain-b-data', 'driver' or 'model-accu', but got {config!r}.")

    def run(dataset, epochs):
        model.train(epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    return run


def window_of(batches, k, n):
    """The k-th run of `n` consecutive items of `batches`, cycling through them."""
    return [batches[(k * n + s) % len(batches)] for s in range(n)]


def plain_updates(step, window):
    """One plain step per (inputs...) tuple of `window`; returns when the last one has finished."""
    for batch in window:
        out = step(*batch)
    out.asnumpy()


def accumulated_update(cells, window):
    """One update of the three cells (forward_backward, optim, clear) over `window`, reading its loss back."""
    forward_backward, optim, clear = cells
    for batch in window:
        forward_backward(*batch)
    optim().asnumpy()
    clear()


def timed(update, seconds, warmup):
    """Samples per second of update(k), which returns the samples it trained on, after `warmup` updates."""
    for k in range(warmup):
        update(k)
    samples, updates, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        samples += update(warmup + updates)
        updates += 1
    return samples / (time.perf_counter() - start)
