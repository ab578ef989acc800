"""The accumulation window of the parallel cells and the functional accumulator: float32-capable buffers,
counters, and the once-per-window reduction across devices.

The rules themselves (weighting, finishing, reset) live in ``window.py``; this mixin binds them to a cell's own
buffers and to its data-parallel reducer.
"""
from mindspore import Parameter, ParameterTuple, Tensor, context, jit, mutable, ops
from mindspore import dtype as mstype
from mindspore.common.initializer import initializer
from mindspore.communication.management import GlobalComm
from mindspore.context import ParallelMode
from mindspore.nn import DistributedGradReducer, Identity

from . import window
from ._compat import get_device_num, get_gradients_mean, get_parallel_mode
from ._checks import check_clip_norm, check_positive_int
from .noise_scale import NoiseMeasure, NoiseState, check_noise_scale
from .schedule import AccumulationSchedule

WINDOW_PREFIX = "accu_window"


def float32_buffers(weights, prefix):
    """Zero float32 buffers shaped like `weights`, named '<prefix>.<weight name>'."""
    return ParameterTuple(Parameter(initializer("zeros", p.shape, mstype.float32), name=f"{prefix}.{p.name}",
                                    requires_grad=False) for p in weights)


def data_parallel_reducer(weights):
    """What :class:`mindspore.nn.TrainOneStepCell` sets up for the parallel context in force: (parallel mode,
    whether gradients are reduced, the device count, the reducer)."""
    parallel_mode = get_parallel_mode()
    reducer_flag = parallel_mode in (ParallelMode.DATA_PARALLEL, ParallelMode.HYBRID_PARALLEL)
    if not reducer_flag:
        return parallel_mode, False, 1, Identity()
    degree = get_device_num()
    return parallel_mode, True, degree, DistributedGradReducer(weights, get_gradients_mean(), degree)


class AccumulationWindow(NoiseMeasure):
    """
    Mixin: the window's buffers and counters and the once-per-window reduction (and, if asked, the noise scale's
    measurement), for the parallel cells and the functional accumulator.

    It relies on the attributes that :class:`mindspore.nn.TrainOneStepCell` (or :func:`data_parallel_reducer`)
    sets: `grad_reducer`, `reducer_flag`, `degree`, `parallel_mode`.
    """

    def _init_window(self, owner, accumulation_steps, accu_grads, clip_norm=None, steps_name="accumulation_steps",
                     items_source="returned by the loss network", rebuild="new cells", noise_scale=False):
        self.owner_name, self.steps_name = owner, steps_name
        self.items_source, self.rebuild_hint = items_source, rebuild
        self.accumulation_steps = accumulation_steps
        self.accu_windows = Parameter(Tensor(0, mstype.int32), name=f"{WINDOW_PREFIX}.windows", requires_grad=False)
        self.clip_norm = check_clip_norm(owner, clip_norm)
        self.accu_grads = accu_grads
        state = window.WindowState(WINDOW_PREFIX)
        self.accu_items, self.accu_micro_steps, self.accu_loss, self.accu_min_items = state.counters
        self.accu_last_items, self.accu_last_grad_norm, self.accu_last_clipped = state.last
        self.window_map = ops.HyperMap()
        mode = check_noise_scale(owner, noise_scale)
        self._init_noise(NoiseState(WINDOW_PREFIX, mode) if mode else None)
        self._eager = False  # PYNATIVE: add each micro-batch with one compiled graph (see _add_micro_batch)
        self.is_distributed = self.parallel_mode != ParallelMode.STAND_ALONE
        self.device_degree = float(self.degree) if self.reducer_flag else 1.0
        self.window_allreduce = ops.AllReduce(group=GlobalComm.WORLD_COMM_GROUP) if self.is_distributed else None

    @property
    def accumulation_steps(self):
        """Micro-batches per update: an int, or the :class:`AccumulationSchedule` when N changes between windows
        (windows are counted from 0 in ``accu_windows``). Set it before the first call."""
        schedule = self.accumulation_schedule
        return schedule if schedule.constant is None else schedule.constant

    @accumulation_steps.setter
    def accumulation_steps(self, value):
        if not isinstance(value, (dict, AccumulationSchedule)):
            check_positive_int(self.owner_name, self.steps_name, value)
        schedule = AccumulationSchedule(value, self.owner_name, self.steps_name)
        self.accumulation_schedule = schedule
        self._constant_steps = schedule.constant  # decided when compiled: no table lookup for a fixed N
        self._stage_firsts = Tensor(schedule.firsts, mstype.int32)
        self._stage_counts = Tensor(schedule.counts, mstype.int32)

    def _steps_now(self):
        """In a graph: the N of the open window (the schedule's entry for ``accu_windows``)."""
        if self._constant_steps is not None:
            return self._constant_steps
        stage = ops.reduce_sum(ops.cast(self.accu_windows >= self._stage_firsts, mstype.int32)) - 1
        return self._stage_counts[stage]

    def _window_counters(self):
        return (self.accu_items, self.accu_micro_steps, self.accu_loss, self.accu_min_items)

    def _note_mode(self):
        """Called before each call from Python: whether construct runs eagerly (PYNATIVE_MODE)."""
        self._eager = context.get_context("mode") == context.PYNATIVE_MODE

    def _add_micro_batch(self, loss, items, grads, weight=None):
        """accu_grads += weight * grads (weight: the items by default); counters take in the micro-batch.

        In PYNATIVE_MODE this runs as one compiled graph, with the gradients handed over as a mutable tuple (as
        constants, MindSpore would compile a new graph per call): a few small operators per parameter, launched
        one by one, cost about 3 ms per LeNet micro-batch otherwise.
        """
        weight = items if weight is None else weight
        if self._eager:
            return self._add_compiled(loss, items, mutable(grads), weight)
        return self._add(loss, items, grads, weight)

    def _add(self, loss, items, grads, weight):
        return window.add_micro_batch(self.window_map, self.accu_grads, grads, weight, loss, items,
                                      self._window_counters(), self._noise_sums(), self.noise_every)

    _add_compiled = jit(_add)

    def _window_sum_over_devices(self, value):
        """Sum of a float32 tensor over all devices (the value itself on one device)."""
        if self.is_distributed:
            return self.window_allreduce(value)
        return value

    def _window_gradients(self, unscale=1.0):
        """The gradient the optimizer receives: the buffers over the window's items on all devices (and over the
        loss scale), reduced once, clipped. Records the window (accu_last_*) for telemetry.

        Returns (grads, the window's mean loss on this device once the records are written).
        """
        window.check_items(self.owner_name, self.accu_min_items, self.items_source, self.rebuild_hint)
        total = self.accu_items + 0.0
        if self.reducer_flag:
            total = self._window_sum_over_devices(total)
        per_device = ops.maximum(total / self.device_degree, 1e-12)  # the reducer averages over devices
        grads, recorded = window.finish_gradients(
            self.window_map, self.accu_grads, per_device * unscale, self.grad_reducer, self.clip_norm,
            (self.accu_last_items, self.accu_last_grad_norm, self.accu_last_clipped), total)
        if self.measure_noise:
            norm = ops.depend(self.accu_last_grad_norm, recorded) * 1.0
            recorded = ops.depend(recorded, self._record_noise(
                norm, total, unscale, self._window_sum_over_devices if self.reducer_flag else None))
        return grads, ops.depend(window.mean_loss(self._window_counters()), recorded)

    def _reset_window(self, result):
        """Zero the buffers and counters after `result` is computed, and count the window; returns `result`."""
        result = ops.depend(result, ops.assign_add(self.accu_windows, ops.ones_like(self.accu_windows)))
        return window.reset_window(self.window_map, self.accu_grads, self._window_counters(), result)
