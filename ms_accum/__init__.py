"""ms_accum: gradient accumulation for MindSpore.

Single device: :class:`TrainForwardBackward`, :class:`TrainOptim` and :class:`TrainClear` share ``grad_sum``
buffers; :class:`GradientAccumulation` drives them over a dataset.
"""
from .checkpoint import CheckpointError, load_network_checkpoint, read_checkpoint, save_checkpoint_atomic
from .driver import PARTIAL_WINDOW_POLICIES, GradientAccumulation, TrainState
from .single_device import TrainClear, TrainForwardBackward, TrainOptim

__version__ = "0.1.0"

__all__ = [
    "TrainForwardBackward",
    "TrainOptim",
    "TrainClear",
    "GradientAccumulation",
    "TrainState",
    "PARTIAL_WINDOW_POLICIES",
    "save_checkpoint_atomic",
    "read_checkpoint",
    "load_network_checkpoint",
    "CheckpointError",
]
