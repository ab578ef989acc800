"""ms_accum: gradient accumulation for MindSpore.

Single device: :class:`TrainForwardBackward`, :class:`TrainOptim` and :class:`TrainClear` share ``grad_sum``
buffers; :class:`GradientAccumulation` drives them over a dataset, with a fixed N, an
:class:`AccumulationSchedule` or an :class:`AdaptiveAccumulation` policy driven by the measured noise scale.
Parallel: :class:`TrainAccuStepsCell` and :class:`TrainAccuStepsWithLossScaleCell` accumulate and communicate
once per window; :class:`Model_ACCU` trains them, alternating two graphs in dataset sink mode.
Functional (value_and_grad loops): :class:`Accumulator`.
The micro-batch for a memory budget and a global batch: :func:`plan_micro_batch`.
"""
from .compat import UNTESTED_RELEASE as _UNTESTED_RELEASE
from .core.user_warning import warn as _warn

if _UNTESTED_RELEASE is not None:  # a MindSpore newer than the tested ones: said at the user's import line
    _warn(_UNTESTED_RELEASE, RuntimeWarning)

# The names, after the warning: one failing on that release follows the warning that names what to install.
from .core.adaptive import AdaptiveAccumulation
from .core.goodput import GoodputAccumulation
from .cells.parallel_loss_scale import TrainAccuStepsWithLossScaleCell
from .cells.parallel import ACCUMULATE_PHASE, UPDATE_PHASE, TrainAccuStepsCell
from .tools.batchnorm import adjust_batchnorm_momentum
from .trainers.checkpoint import (CheckpointError, is_accumulation_buffer, load_network_checkpoint, read_checkpoint,
                         save_checkpoint_atomic)
from .trainers.driver import GradientAccumulation, TrainState, updates_per_epoch
from .core.open_window import PARTIAL_WINDOW_POLICIES
from .tools.equivalence import EquivalenceReport, check_equivalence
from .cells.functional import Accumulator
from .trainers.model_accu import Model_ACCU
from .trainers.nonfinite import NonFiniteWindowError, NonFiniteWindowWarning
from .cells.single_device import TrainClear, TrainForwardBackward, TrainOptim
from .core.global_batch import steps_for_global_batch
from .core.schedule import AccumulationSchedule
from .trainers.elastic import RunLayout
from .trainers.out_of_memory import is_device_out_of_memory
from .trainers.planner import (FreshProcessMeasure, InProcessMeasure, Measurement, MemoryBudgetError, MemoryModel,
                               MicroBatchPlan, parse_memory, plan_micro_batch, report_measurement)
from .trainers.state import load_training_state, save_training_state
from .trainers.telemetry import WindowRecord, WindowTelemetry

__version__ = "0.4.0"

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
    "GoodputAccumulation",
    "steps_for_global_batch",
    "TrainAccuStepsCell",
    "TrainAccuStepsWithLossScaleCell",
    "Model_ACCU",
    "NonFiniteWindowWarning",
    "NonFiniteWindowError",
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
    "RunLayout",
    "plan_micro_batch",
    "MicroBatchPlan",
    "MemoryBudgetError",
    "Measurement",
    "MemoryModel",
    "FreshProcessMeasure",
    "InProcessMeasure",
    "report_measurement",
    "parse_memory",
    "is_device_out_of_memory",
]
