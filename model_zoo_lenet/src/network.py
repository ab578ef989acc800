"""The networks train.py and eval.py build (--network): LeNet5, this model zoo's own, or MindCV's ResNet18 for the
same 1 x 32 x 32 inputs and 10 classes."""
from .lenet import LeNet5

NETWORKS = {"lenet5": "LeNet5", "resnet18": "MindCV's ResNet18"}  # --network: the name a run prints


def create_network(name):
    """
    Build the network `name` for 1 x 32 x 32 inputs and 10 classes.

    Args:
        name (str): ``"lenet5"`` or ``"resnet18"`` (MindCV's, with one input channel).

    Returns:
        Cell, the network.

    Raises:
        ValueError: If `name` is not one of :data:`NETWORKS`, or MindCV is not installed for ``"resnet18"``.
    """
    if name == "lenet5":
        return LeNet5()
    if name == "resnet18":
        try:
            from mindcv.models import create_model  # pylint: disable=import-outside-toplevel
        except ImportError as error:
            raise ValueError(f"'--network resnet18' is MindCV's ResNet18, but MindCV cannot be imported ({error}). "
                             f"Install it (pip install mindcv==0.3.0), or pass --network lenet5.") from error
        return create_model("resnet18", num_classes=10, in_channels=1)
    raise ValueError(f"'--network' must be one of {', '.join(NETWORKS)}, but got {name!r}.")


def checkpoint_stem(name):
    """The file-name stem of `name`'s epoch checkpoints: 'checkpoint_lenet' (the name train.py has always written
    for LeNet5), 'checkpoint_resnet18'."""
    return "checkpoint_lenet" if name == "lenet5" else f"checkpoint_{name}"
