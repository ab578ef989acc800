"""ms_accum: gradient accumulation for MindSpore.

Single device: :class:`TrainForwardBackward`, :class:`TrainOptim` and :class:`TrainClear` share ``grad_sum``
buffers; :class:`GradientAccumulation` drives them over a dataset, with a fixed N, an
:class:`AccumulationSchedule` or an :class:`AdaptiveAccumulation` policy driven by the measured noise scale.
Parallel: :class:`TrainAccuStepsCell` and :class:`TrainAccuStepsWithLossScaleCell` accumulate and communicate
once per window; :class:`Model_ACCU` trains them, alternating two graphs in dataset sink mode.
Functional (value_and_grad loops): :class:`Accumulator`.
"""
from .adaptive import AdaptiveAccumulation
from .accu_loss_scale import TrainAccuStepsWithLossScaleCell
from .accu_steps import ACCUMULATE_PHASE, UPDATE_PHASE, TrainAccuStepsCell
from .batchnorm import adjust_batchnorm_momentum
from .checkpoint import (CheckpointError, is_accumulation_buffer, load_network_checkpoint, read_checkpoint,
                         save_checkpoint_atomic)
from .driver import PARTIAL_WINDOW_POLICIES, GradientAccumulation, TrainState, updates_per_epoch
from .equivalence import EquivalenceReport, check_equivalence
from .functional import Accumulator
from .model_accu import Model_ACCU
from .single_device import TrainClear, TrainForwardBackward, TrainOptim
from .schedule import AccumulationSchedule
from .state import load_training_state, save_training_state
from .telemetry import WindowRecord, WindowTelemetry

__version__ = "0.1.0"

__all__ = [
    "TrainForwardBackward",
    "TrainOptim",
    "TrainClear",
    "GradientAccumulation",
    "TrainState",
    "PARTIAL_WINDOW_POLICIES",
    "updates_per_epoch",
    "AccumulationSchedule",
    "AdaptiveAccumulation",
    "TrainAccuStepsCell",
    "TrainAccuStepsWithLossScaleCell",
    "Model_ACCU",
    "Accumulator",
    "adjust_batchnorm_momentum",
    "check_equivalence",
    "EquivalenceReport",
    "WindowTelemetry",
    "WindowRecord",
    "ACCUMULATE_PHASE",
    "UPDATE_PHASE",
    "save_checkpoint_atomic",
    "read_checkpoint",
    "load_network_checkpoint",
    "is_accumulation_buffer",
    "CheckpointError",
    "save_training_state",
    "load_training_state",
]
