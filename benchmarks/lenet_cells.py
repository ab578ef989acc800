"""What benchmarks/paired.py and benchmarks/cell_times.py share: MindSpore on CPU with train.py's defaults, and a
plain TrainOneStepCell beside the three accumulation cells, each on its own fresh LeNet5."""
import os
import sys

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


def plain_and_three_cells():
    """(plain TrainOneStepCell, TrainForwardBackward, TrainOptim, TrainClear): LeNet5, sparse softmax
    cross-entropy, Momentum(0.01, 0.9); the plain cell and the three cells train separate networks."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    from src.lenet import LeNet5  # pylint: disable=import-outside-toplevel

    def parts():
        net = LeNet5()
        return (nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                nn.Momentum(net.trainable_params(), 0.01, 0.9))

    loss_net, opt = parts()
    plain = nn.TrainOneStepCell(loss_net, opt)
    loss_net, opt = parts()
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    return (plain, ms_accum.TrainForwardBackward(loss_net, opt, grad_sum), ms_accum.TrainOptim(opt, grad_sum),
            ms_accum.TrainClear(grad_sum))
