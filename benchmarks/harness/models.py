"""The networks, losses and optimizers the benchmarks train, seeded: LeNet5, the wide and tiny MLPs, the transformer
block model and the text model, which the project builds itself, and MindCV's models and optimizer where asked
for (MindCV is imported only then)."""
from .data import TEXT_VOCAB

PROJECT_MODELS = ("block", "lenet", "mlp", "tiny", "text")  # built here, without MindCV


def plain_parts(net):
    """(`net`, sparse softmax cross-entropy, Momentum(0.01, 0.9)): the plain training of LeNet5 and the MLPs."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    return (net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9))


def lenet_parts():
    """A fresh (LeNet5, loss, optimizer)."""
    from src.lenet import LeNet5  # pylint: disable=import-outside-toplevel
    return plain_parts(LeNet5())


def wide_mlp(width, inputs=1024, classes=10, flatten=False):
    """The wide MLP inputs -> width -> width -> classes (ReLU), behind a Flatten with `flatten`: at width 2048,
    6.3 million parameters and the least compute per parameter."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    layers = [nn.Dense(inputs, width), nn.ReLU(), nn.Dense(width, width), nn.ReLU(), nn.Dense(width, classes)]
    return nn.SequentialCell(([nn.Flatten()] if flatten else []) + layers)


def block_model(classes, seed=0):
    """A transformer block model: 4 encoder layers (d 256, 4 heads, feed-forward 1024) over 64 positions, mean
    pooled, a classifier."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    ms.set_seed(seed)

    class Blocks(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layers = nn.CellList([nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
                                       for _ in range(4)])
            self.head = nn.Dense(256, classes)

        def construct(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(x.mean(1))
    return Blocks()


def text_model(classes):
    """A text classifier: an embedding table (TEXT_VOCAB x 256, its first and largest parameter), the mean over the
    tokens, a classifier."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel

    class EmbeddingBag(nn.Cell):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(TEXT_VOCAB, 256)
            self.head = nn.Dense(256, classes)

        def construct(self, ids):
            return self.head(self.table(ids).mean(1))
    return EmbeddingBag()


def build(model, classes, width=2048, optimizer="mindcv"):
    """(network, loss, optimizer), seeded (the same initial weights every time). `model`: 'block' (the transformer
    block model), 'lenet' (LeNet5), 'mlp' (the wide MLP at `width`), 'tiny' (an MLP 1024-16-classes: 64 KiB of
    parameters), 'text' (the text model) or a MindCV model name. `optimizer`: 'mindcv' (MindCV's momentum with
    weight decay and its label-smoothed cross-entropy) or 'momentum' (``nn.Momentum`` and the plain
    cross-entropy)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    ms.set_seed(0)
    if model == "block":
        net = block_model(classes)
    elif model == "lenet":
        from src.lenet import LeNet5  # pylint: disable=import-outside-toplevel
        net = LeNet5(num_class=classes)
    elif model == "mlp":
        net = wide_mlp(width, classes=classes)
    elif model == "tiny":
        net = nn.SequentialCell(nn.Dense(1024, 16), nn.ReLU(), nn.Dense(16, classes))
    elif model == "text":
        net = text_model(classes)
    else:
        net = mindcv_module(f"--model {model}").create_model(model, num_classes=classes)
    if optimizer == "momentum":
        return plain_parts(net)
    mindcv = mindcv_module("--optimizer mindcv")
    loss = mindcv.create_loss(name="CE", label_smoothing=0.1)
    return net, loss, mindcv.create_optimizer(net.trainable_params(), opt="momentum", lr=0.01, momentum=0.9,
                                              weight_decay=1e-4)


def resnet18_parts():
    """A fresh (MindCV's ResNet18 on 1 x 32 x 32 images and 10 classes, loss, optimizer): 11.2 million parameters
    under convolutions, much compute per parameter, as in most image models."""
    return plain_parts(mindcv_module("--models resnet18").create_model("resnet18", num_classes=10, in_channels=1))


def mindcv_module(wanted_by):
    """MindCV, imported for `wanted_by` (what asked for it); an ImportError that says what to do without it."""
    try:
        import mindcv  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError(f"{wanted_by} needs MindCV, which is not installed: pip install mindcv==0.3.0, or use a "
                          f"model the project builds ({', '.join(PROJECT_MODELS)}) with --optimizer momentum "
                          f"where the benchmark has one.") from error
    return mindcv


def model_name(text):
    """argparse type: a model :func:`build` makes, one of :data:`PROJECT_MODELS` or a MindCV model name (an unknown
    one ended each measured process in a traceback). Checking a MindCV name imports MindCV, so MindSpore:
    train.py's CPU defaults are set first, as ``harness.start_mindspore`` does."""
    import argparse  # pylint: disable=import-outside-toplevel
    if text in PROJECT_MODELS:
        return text
    from src.cpu_speed import apply_env_defaults  # pylint: disable=import-outside-toplevel
    apply_env_defaults()
    try:
        from mindcv.models import is_model  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(PROJECT_MODELS)} or, with MindCV installed "
                                         f"(pip install mindcv==0.3.0), a MindCV model name, but got "
                                         f"{text!r}") from None
    if not is_model(text):
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(PROJECT_MODELS)} or a MindCV model name "
                                         f"(mindcv.list_models()), but got {text!r}")
    return text


COST_MODELS = {"lenet": lenet_parts, "mlp": lambda: plain_parts(wide_mlp(2048, flatten=True)),
               "resnet18": resnet18_parts}
