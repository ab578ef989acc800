"""The training steps of plain training and of ms_accum's paths, as the benchmarks run them: ``TrainOneStepCell``,
the three cells, and the dataset-fed trainers (``Model.train``, the driver, ``Model_ACCU``)."""
from .models import lenet_parts


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
    """(plain TrainOneStepCell, TrainForwardBackward, TrainOptim, TrainClear), on two separate fresh LeNet5s."""
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
