"""The window engine: adding a micro-batch and ending a window, written once for every path.

Every accumulating cell of ms_accum (the three single-device cells, the parallel cells, :class:`Accumulator`) is a
thin front end over :class:`WindowEngine`. The engine binds the rules of ``window.py`` to the cell's buffers, its
counters and its choices, decided once when the cell is built:

- adding a micro-batch (:meth:`WindowEngine._add_micro_batch`): its gradient weighted by its items, its items,
  loss and noise sums;
- ending a window (:meth:`WindowEngine._end_window`): the item checks, the division by the window's items on all
  devices (and by the loss scale), the one reduction across devices, clipping, the noise-scale record, the
  overflow decision taken on every device alike, the optimizer step or its skip, the loss-scale update once per
  window, and the reset;
- choosing N (:meth:`WindowEngine.set_gradient_accumulation_steps`, :meth:`WindowEngine._steps_now`): an int, a
  schedule ``{first_update: N}`` counted in the ``accu_windows`` Parameter, or a policy;
- running each call as a compiled graph in PYNATIVE_MODE too (:class:`compiled.CompiledCall`).

The engine knows nothing of datasets, Model or training loops.
"""
import contextlib
import time
from typing import NamedTuple

import numpy as np

from mindspore import Parameter, ParameterTuple, Tensor, context, jit, mutable, ops
from mindspore import dtype as mstype
from mindspore.common.initializer import initializer
from mindspore.communication.management import GlobalComm
from mindspore.context import ParallelMode
from mindspore.nn import DistributedGradReducer, Identity

from . import window
from ..compat import get_device_num, get_gradients_mean, get_mode, get_parallel_mode
from .adaptive import AdaptiveAccumulation, next_steps_on_device
from .goodput import GoodputAccumulation, goodput_steps_on_device
from .checks import check_choice
from .compile_cache import call_signature, check_cached_call, check_cached_settings, compile_cache_on
from .compiled import (CompiledCall, branch_parameters, read_before_branch, through_a_branch,
                       write_parameter)
from .deprecation import renamed
from .loss_scale import update_scale
from .lr_scaling import ADASCALE_RULES, check_reference_batch, resolve_scaling_rule
from .noise_scale import NoiseMeasure
from .progress_lr import (ProgressState, advance_progress, prepare_window_rate, progress_state_of,
                          rewire_learning_rate)
from .runtime_checks import assert_in_graph
from .schedule import STEPS_NAME, AccumulationSchedule, check_steps, shown_steps_name
from .weighting import LossAndItems, warn_summed_loss

WINDOW_PREFIX = "accu_window"
NONFINITE_POLICIES = ("skip", "raise", "apply")


class CellNaming(NamedTuple):
    """What an engine cell names, chosen by whoever builds it: `owner`, the name its errors give (a trainer that
    builds the cell for its user gives its own), `rebuild_hint`, what to build anew after an error, and the
    prefixes of its buffers' and counters' Parameter names (the keys of a state file). `float32_buffers`: float32
    buffers whatever the parameters' type, instead of buffers of the parameters' own type."""
    owner: str
    rebuild_hint: str = "new cells"
    buffer_prefix: str = "accu_grads"
    window_prefix: str = WINDOW_PREFIX
    float32_buffers: bool = False

    def buffers(self, weights):
        """Zero buffers shaped like `weights`, named '<buffer_prefix>.<weight name>'."""
        if self.float32_buffers:
            return float32_buffers(weights, self.buffer_prefix)
        return weights.clone(prefix=self.buffer_prefix, init="zeros")


def check_nonfinite(owner, nonfinite, loss_scaled):
    """`nonfinite` checked against :data:`NONFINITE_POLICIES`; with a loss scale only "skip" is taken: its overflow
    skip decides what a window holding an inf or a NaN does, and "raise" or "apply" would be silently ignored."""
    nonfinite = check_choice(owner, "nonfinite", nonfinite, NONFINITE_POLICIES)
    if loss_scaled and nonfinite != "skip":
        raise ValueError(f"For '{owner}', 'nonfinite' must be 'skip' with a loss scale, whose overflow skip decides "
                         f"what a window holding an inf or a NaN does (skipped, the scale lowered, training goes "
                         f"on), but got {nonfinite!r}. Drop 'nonfinite' or the loss scale; to stop a run whose "
                         f"windows keep overflowing, lower 'max_nonfinite_windows' of the training call.")
    return nonfinite


def slowest_device_seconds(seconds):
    """The largest of every device's `seconds` (float32: the same number on every device), through one AllGather
    of a host scalar, which runs eagerly in both modes (MindSpore's AllReduce takes only a sum on CPU). Every
    device of the world group must call it, as many times."""
    gathered = ops.AllGather(GlobalComm.WORLD_COMM_GROUP)(Tensor(np.array([seconds], np.float32)))
    return float(np.max(gathered.asnumpy()))


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


class WindowEngine(CompiledCall, NoiseMeasure):
    """
    Mixin: the rules of an accumulation window bound to one cell's buffers, counters and choices.

    A front end calls :meth:`_init_engine` in its constructor, then :meth:`_add_micro_batch` for each micro-batch
    and :meth:`_end_window` at a window's end. The cell's attributes after :meth:`_init_engine`, on every path:
    ``accu_grads`` (the buffers), ``accu_items``, ``accu_micro_steps``, ``accu_loss``, ``accu_min_items`` (the open
    window), ``accu_last_items``, ``accu_last_grad_norm``, ``accu_last_clipped`` (the last window applied),
    ``accu_windows`` (windows ended) and ``accu_steps`` (an adaptive policy's N), both None where the caller
    counts windows, ``accu_scale`` (the loss scale's Parameter, or None), the skip records
    (``accu_skipped_windows``, ``accu_nonfinite_streak``, ``accu_skip_history``), and the noise-scale Parameters
    of :class:`NoiseMeasure`.

    Reduction across devices uses the attributes :class:`mindspore.nn.TrainOneStepCell` sets (`grad_reducer`,
    `reducer_flag`, `degree`, `parallel_mode`); a cell that is not a TrainOneStepCell gets them from
    :func:`data_parallel_reducer` or, on one device, from :meth:`_init_engine`'s defaults.
    """


    def _init_engine(self, owner, buffers, state, clip_norm=None, average=True, noise=None, loss_scale=None,
                     count_windows=True, items_source="returned by the loss network", rebuild="new cells",
                     nonfinite="skip", divide_in_place=True, window_end_in_python=False):
        """Bind the engine. `state`: the window's :class:`window.WindowState`; `noise`: a NoiseState or None;
        `loss_scale`: (kind, updater, scale Parameter) from ``loss_scale.py``, or None; `nonfinite`: what a window
        whose gradient is not finite does without a loss scale, ``"skip"``, ``"raise"`` or ``"apply"`` (no check,
        as MindSpore's TrainOneStepCell); `window_end_in_python`: whether a window ends in a graph of its own that the
        front end launches from Python (the parallel cells), not inside a step of the user's: under "raise" its graph
        skips the window and the front end raises once the graph has run (so that the cell can go on), and it can
        time the windows for a goodput policy; `divide_in_place`: the window's end divides (and clips) the buffers in
        place and hands them to the optimizer, instead of a divided copy beside them."""
        self.owner_name, self.items_source, self.rebuild_hint = owner, items_source, rebuild
        # MindSpore's compile cache cannot store a raise in a graph: check with Assert instead (runtime_checks.py)
        self.compile_cache_on = compile_cache_on()
        self._cached_calls = set() if self.compile_cache_on else None  # CompiledCall's: the calls checked
        self.accu_grads = buffers
        self.accu_items, self.accu_micro_steps, self.accu_loss, self.accu_min_items = state.counters
        self.accu_items_unit = state.items_unit
        self.accu_last_items, self.accu_last_grad_norm, self.accu_last_clipped = state.last
        self.accu_skipped_windows, self.accu_nonfinite_streak, self.accu_skip_history = state.skips
        self.nonfinite = check_nonfinite(owner, nonfinite, loss_scale is not None)
        self.window_end_in_python = window_end_in_python
        self.accu_windows = Parameter(Tensor(0, mstype.int32), name=f"{state.prefix}.windows",
                                      requires_grad=False) if count_windows else None
        self.accu_steps = Parameter(Tensor(1, mstype.int32), name=f"{state.prefix}.steps",
                                    requires_grad=False) if count_windows else None
        self.clip_norm, self.average = clip_norm, average
        if average and isinstance(getattr(self, "network", None), LossAndItems):
            warn_summed_loss(owner, self.network.network)
        self.divide_in_place = divide_in_place
        self.window_map = ops.HyperMap()
        self._init_noise(noise)
        self.scale_kind, self.loss_scale_manager, self.accu_scale = loss_scale or (None, None, None)
        if not hasattr(self, "reducer_flag"):
            self.parallel_mode, self.reducer_flag, self.degree, self.grad_reducer = \
                ParallelMode.STAND_ALONE, False, 1, Identity()
        self._device_policy = None  # an AdaptiveAccumulation's constants, once N is set to one
        self._goodput = False  # N chosen by a GoodputAccumulation (set_gradient_accumulation_steps)
        self.is_distributed = self.parallel_mode != ParallelMode.STAND_ALONE
        if self.is_distributed and not GlobalComm.INITED:  # else a segmentation fault at the first window's end
            raise RuntimeError(f"For '{owner}', the parallel mode is '{self.parallel_mode}', which reduces gradients "
                               f"across devices, but their communication is not initialized. Call "
                               f"mindspore.communication.init() before building the cell (launched with msrun), or "
                               f"set the parallel mode to 'stand_alone' to train on one device.")
        # With `average`, the window's mean over every device's items whatever MindSpore's gradients_mean says: the
        # buffers are divided by the items over all devices, times the device count the reducer divides by again
        # (gradients_mean=True; with False it sums). The raw sum (average=False) is reduced as gradients_mean says.
        reducer_mean = self.reducer_flag and getattr(self.grad_reducer, "mean", True)
        self.device_degree = float(self.degree) if reducer_mean else 1.0
        self.window_allreduce = ops.AllReduce(group=GlobalComm.WORLD_COMM_GROUP) if self.is_distributed else None
        self._cache_slot = None  # the cell's entry among the compile cache's recorded settings (compile_cache.py)
        self._window_prefix = state.prefix
        self.lr_scaling, self.lr_state = "none", None  # set by _init_lr_scaling
        # the optimizer's Parameters read before the skip branch, by Assert and by TensorShape: _init_lr_scaling
        self.optimizer_parameters = self.optimizer_other_parameters = None

    def _init_lr_scaling(self, optimizer, lr_scaling="none", reference_batch=None):
        """Bind `optimizer` and a learning-rate rule (``lr_scaling.py``) to the window's end: with a rule other than
        ``"none"``, `optimizer` is rewired to read its rate from the progress and factor of a :class:`ProgressState`
        whose Parameters ('<window prefix>.lr.*') are the cell's (``accu_lr_*``), so that the window's graph writes
        them and a state file holds them. With ``"none"`` (the default) nothing is built and the optimizer is
        untouched. Then the optimizer's Parameters, as the rule left them, are those the window's end reads before
        its skip branch (:func:`compiled.branch_parameters`). Called by a front end after :meth:`_init_engine`,
        before the cell's first call."""
        self._bind_lr_rule(optimizer, lr_scaling, reference_batch)
        self.optimizer_parameters, self.optimizer_other_parameters = branch_parameters(optimizer)

    def _bind_lr_rule(self, optimizer, lr_scaling, reference_batch):
        owner = self.owner_name
        reference = check_reference_batch(owner, reference_batch)
        adopted = progress_state_of(optimizer)
        if lr_scaling == "none" and adopted is not None:
            raise ValueError(f"For '{owner}', 'lr_scaling' must be a rule when the optimizer reads its learning rate "
                             f"from progress (an earlier ms_accum cell's rule rewired it, or it was built with a "
                             f"ProgressLearningRate), but got 'none': nothing would advance that progress, and the "
                             f"optimizer's schedule would stand still. Pass the rule it was trained with "
                             f"({adopted.rule or 'linear, sqrt or adascale'}), which continues its progress, "
                             f"or build a new optimizer.")
        rule = resolve_scaling_rule(owner, lr_scaling, optimizer)
        if rule == "none":
            if reference is not None:
                raise ValueError(f"For '{owner}', 'reference_batch' is read by a learning-rate rule only, but got "
                                 f"{reference_batch!r} with lr_scaling='none'. Pass lr_scaling='linear', 'sqrt' or "
                                 f"'adascale', or drop reference_batch.")
            return
        if not self.average:
            raise ValueError(f"For '{owner}', 'lr_scaling'={lr_scaling!r} scales the learning rate of the window's "
                             f"mean gradient, but got average=False: the update is then the raw sum of its "
                             f"micro-batches' gradients, which already grows with N, and the rule would scale it a "
                             f"second time. Pass average=True (the large-batch step at the rule's rate), or "
                             f"lr_scaling='none'.")
        if rule in ADASCALE_RULES and not self.measure_noise:
            raise ValueError(f"For '{owner}', 'lr_scaling'={lr_scaling!r} reads AdaScale's gain from the window's "
                             f"gradient noise scale, but {owner} does not measure it. Build it with noise_scale=True "
                             f"(or 'first'), or pass lr_scaling='linear' or 'sqrt'.")
        if adopted is None:
            state = ProgressState(prefix=f"{self._window_prefix}.lr", reference_batch=reference)
            rewire_learning_rate(optimizer, state, owner)
        else:  # progress goes on from where the optimizer's earlier run left it
            state = adopted
            state.adopt_reference_batch(owner, reference)
        state.rule = rule
        self.lr_scaling, self.lr_state = rule, state
        self.accu_lr_steps, self.accu_lr_fraction, self.accu_lr_factor, self.accu_lr_reference = state.parameters
        self.accu_lr_applied = state.applied_rate

    def _lr_params(self):
        return (self.accu_lr_steps, self.accu_lr_fraction, self.accu_lr_factor, self.accu_lr_reference)

    # ------------------------------------------------------------------ names of ms_accum 0.1
    last_items = renamed("last_items", "accu_last_items")
    last_grad_norm = renamed("last_grad_norm", "accu_last_grad_norm")
    last_clipped = renamed("last_clipped", "accu_last_clipped")

    # ------------------------------------------------------------------ the compile cache
    def _compile_settings(self):
        """What the cell's graphs freeze when they compile, as strings: compared with the settings of graphs
        MindSpore's compile cache would load instead of compiling (compile_cache.py)."""
        schedule = getattr(self, "accumulation_schedule", None)
        steps = None if schedule is None else self.gradient_accumulation_steps
        if getattr(self, "_goodput", False):  # its constants are Parameters' values, not frozen
            steps = f"GoodputAccumulation{self._device_policy}"
        elif getattr(self, "adaptive_policy", None) is not None:  # its initial N is a Parameter's value, not frozen
            min_steps, max_steps, interval, max_factor = self._device_policy
            steps = (f"AdaptiveAccumulation(min_steps={min_steps}, max_steps={max_steps}, interval={interval}, "
                     f"max_factor={max_factor})")
        settings = dict(cell=type(self).__name__, owner=self.owner_name,  # a trainer builds its cell its own way
                        buffers_named=self.accu_grads[0].name.split(".")[0] if self.accu_grads else None,
                        mode=get_mode(), device=context.get_context("device_target"),
                        clip_norm=self.clip_norm, average=self.average, nonfinite=self.nonfinite,
                        noise_scale=(self.noise_every or "first") if self.measure_noise else False,
                        loss_scale=self.scale_kind, sens=getattr(self, "sens", None),
                        divide_in_place=self.divide_in_place, device_degree=self.device_degree,
                        lr_scaling=self.lr_scaling,
                        gradient_accumulation_steps=steps,
                        buffers=tuple(tuple(buffer.shape) for buffer in self.accu_grads))
        return {key: str(value) for key, value in settings.items()}

    def _check_compile_cache(self):
        """With the compile cache on, refuse settings other than those of the graphs it would load."""
        self._cache_slot = check_cached_settings(self.owner_name, self._cache_slot, self._compile_settings())

    def _check_cached_call(self, args):
        """With the compile cache on, refuse a call whose graph is not the one the cache would load for it: another
        cell's, or one compiled for inputs of other shapes (CompiledCall calls it with each call's arguments)."""
        signature = call_signature(self.phase, args)
        if signature not in self._cached_calls:
            check_cached_call(self.owner_name, self._cache_slot, signature)
            self._cached_calls.add(signature)

    # ------------------------------------------------------------------ choosing N
    def set_gradient_accumulation_steps(self, steps, arg_name=STEPS_NAME, owner=None):
        """
        Set N, the micro-batches of each window, before the window it governs opens. The one place N is checked:
        the cells' constructors, the trainers and :class:`Model_ACCU` pass the user's value through here.

        Args:
            steps (Union[int, dict, str, AccumulationSchedule, AdaptiveAccumulation]): An int >= 1, a schedule
                ``{first_update: N}`` (windows counted from 0 in ``accu_windows``), or a policy applied on the device
                (its N in ``accu_steps``; needs the noise scale).
            arg_name (str): The argument as the user wrote it, for messages (an older name such as
                ``'mini_steps'`` included). Default: ``'gradient_accumulation_steps'``.
            owner (str, optional): The API the user called, for messages. Default: ``None``, the cell's.

        Returns:
            The cell itself.

        Raises:
            TypeError: If `steps` is not an int, a schedule or an :class:`AdaptiveAccumulation`.
            ValueError: If `steps` is < 1, a schedule is malformed, or a policy is given to a cell that does not
                measure the noise scale.
        """
        owner = owner or self.owner_name
        policy = None
        if isinstance(steps, (AdaptiveAccumulation, GoodputAccumulation)):
            kind = type(steps).__name__
            article = "an" if kind[0] in "AEIOU" else "a"
            if not self.measure_noise:
                raise ValueError(f"For '{owner}', {shown_steps_name(arg_name)} as {article} {kind} policy needs the "
                                 f"noise scale, but {self.owner_name} was built with noise_scale=False. Build it with "
                                 f"noise_scale=True (or 'first').")
            if steps.min_steps < 2 and (self.degree if self.reducer_flag else 1) < 2:
                raise ValueError(f"For '{owner}', {shown_steps_name(arg_name)} as {article} {kind} policy must "
                                 f"have 'min_steps' >= 2 on one device, but got min_steps={steps.min_steps}: a "
                                 f"window of one micro-batch carries no noise-scale estimate, so N = 1 could never "
                                 f"be left. Halve the micro-batch and pass min_steps=2 for the same smallest batch "
                                 f"(min_steps=1 is for data parallel over 2 devices or more).")
            policy, steps = steps, steps.initial_steps
        else:
            check_steps(owner, arg_name, steps)
        if isinstance(policy, GoodputAccumulation) and not policy.given:
            if not self.window_end_in_python:
                raise ValueError(f"For '{owner}', {shown_steps_name(arg_name)} as a GoodputAccumulation policy must "
                                 f"be told each window's time to calibrate, but {self.owner_name} ends its windows "
                                 f"inside a compiled step of yours, which cannot time them. Pass the window-time "
                                 f"constants you measured: GoodputAccumulation(..., micro_time=t_micro, "
                                 f"end_time=t_end).")
        schedule = AccumulationSchedule(steps, owner, arg_name)
        self.steps_name = arg_name
        self._steps_unset = False  # N given (a parallel cell built without it warns: checks.warn_steps_unset)
        self.adaptive_policy = policy
        self.accumulation_schedule = schedule
        # decided when compiled: no table lookup for a fixed N, the device's N for a policy
        self._constant_steps = schedule.constant if policy is None else None
        self._stage_firsts = Tensor(schedule.firsts, mstype.int32)
        self._stage_counts = Tensor(schedule.counts, mstype.int32)
        self._device_policy = policy.device_policy if policy is not None else None
        self._goodput = isinstance(policy, GoodputAccumulation)  # decided when compiled: which rule chooses N
        if self._goodput:
            self._bind_goodput(policy)
        write_parameter(self.accu_steps, schedule.steps_at(0))  # not set_data: see write_parameter
        if self._cache_slot is not None:  # N changed after the cell was first called
            self._check_compile_cache()
        return self

    @contextlib.contextmanager
    def steps_kept_on_error(self):
        """
        A context in which a trainer sets N for a run and checks the rest of the run: if it raises, N (its value,
        the name it was given under and whether it was given at all) is set back to what it was, so that a call
        refused before training leaves the cell as it found it.
        """
        steps, name, unset, schedule = (self.gradient_accumulation_steps, self.steps_name, self._steps_unset,
                                        self.accumulation_schedule)
        try:
            yield self
        except BaseException:
            if self.accumulation_schedule is not schedule:  # N was set inside: each setting makes a new schedule
                self.set_gradient_accumulation_steps(steps, name)
                self._steps_unset = unset
            raise

    @property
    def gradient_accumulation_steps(self):
        """Micro-batches per update: an int, the :class:`AccumulationSchedule` when N changes between windows
        (windows are counted from 0 in ``accu_windows``), or the :class:`AdaptiveAccumulation` policy (its N in
        ``accu_steps``). Set it before the first call (see :meth:`set_gradient_accumulation_steps`)."""
        if self.adaptive_policy is not None:
            return self.adaptive_policy
        return self.accumulation_schedule.as_given

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value):
        self.set_gradient_accumulation_steps(value)

    @property
    def accumulation_steps(self):
        """The seed's name for :attr:`gradient_accumulation_steps`."""
        return self.gradient_accumulation_steps

    @accumulation_steps.setter
    def accumulation_steps(self, value):
        self.set_gradient_accumulation_steps(value, "accumulation_steps")

    def _steps_now(self):
        """In a graph: the N of the open window (the policy's, or the schedule's entry for ``accu_windows``)."""
        if self._constant_steps is not None:
            return self._constant_steps
        if self._device_policy is not None:
            return self.accu_steps + 0
        stage = ops.reduce_sum(ops.cast(self.accu_windows >= self._stage_firsts, mstype.int32)) - 1
        return self._stage_counts[stage]

    def next_window_steps(self):
        """From Python: the N of the open window (or of the next one, between windows). Reads the device for a
        schedule or a policy."""
        if self._constant_steps is not None:
            return self._constant_steps
        if self._device_policy is not None:
            return int(self.accu_steps.asnumpy())
        return self.accumulation_schedule.steps_at(int(self.accu_windows.asnumpy()))

    # ------------------------------------------------------------------ a goodput policy's measurements
    def _bind_goodput(self, policy):
        """A :class:`GoodputAccumulation`'s constants (t_micro, t_end) and calibration rows in Parameters of the
        cell ('<window prefix>.goodput_*'), so that the window's end reads the constants on the device and a state
        file holds what the policy measured; written from the host (:meth:`observe_window`)."""
        rows = 2 * policy.calibration_windows
        if getattr(self, "accu_goodput_constants", None) is None:
            self.accu_goodput_constants = Parameter(Tensor([0.0, 0.0], mstype.float32),
                                                    name=f"{self._window_prefix}.goodput_constants",
                                                    requires_grad=False)
        if getattr(self, "accu_goodput_observed", None) is None or \
                self.accu_goodput_observed.shape[0] != max(rows, 1):
            self.accu_goodput_observed = Parameter(Tensor(-np.ones((max(rows, 1), 3), np.float32)),
                                                   name=f"{self._window_prefix}.goodput_observed",
                                                   requires_grad=False)
        self._write_goodput(policy)
        self._last_window_end = time.perf_counter()  # the policy leaves the first window it is told of untimed

    def _write_goodput(self, policy):
        """The policy's host state to its Parameters; remembered, so that a state loaded into them since is seen."""
        observed = -np.ones(self.accu_goodput_observed.shape, np.float32)
        for row, values in enumerate(policy.state_dict()["observed"][:observed.shape[0]]):
            observed[row] = values
        constants = np.array(policy.device_constants, np.float32)
        write_parameter(self.accu_goodput_constants, constants)
        write_parameter(self.accu_goodput_observed, observed)
        self._goodput_written = (constants, observed)

    def _window_micro_batches(self):
        """Before a window's end from Python: its micro-batches, read from the device for a goodput policy that is
        still calibrating (which times windows), else None. Once the policy is frozen nothing is timed: the read
        waited for the window's micro-batches before the window's end could start, and with the reads and writes
        of :meth:`observe_window` cost LeNet5 7 ms a window of 16 (docs/batch_schedules.md)."""
        if not self._goodput or self.adaptive_policy.frozen:
            return None
        return int(self.accu_micro_steps.asnumpy())

    def _time_window(self, micro_batches):
        """After a window's end from Python (the parallel cells' ``end_window``, under the trainers too): its wall
        time since the previous window's end reported to a goodput policy, once the device has chosen the next N
        (reading the window count waits for it). With the policy frozen (`micro_batches` None), only its
        constants are read, to see a state loaded into the cell since; such a state is taken as
        :meth:`observe_window` takes it, this window untimed (a policy that takes a state leaves its next window
        untimed anyway)."""
        if not self._goodput:
            return
        now = time.perf_counter()
        if micro_batches is None:
            if np.array_equal(self.accu_goodput_constants.asnumpy(), self._goodput_written[0]):
                self._last_window_end = now
                return
            micro_batches = 1  # not read: a state was loaded, so this window is not timed
        update = int(self.accu_windows.asnumpy()) - 1
        self.observe_window(update, micro_batches, max(now - self._last_window_end, 1e-9))
        self._last_window_end = now

    def observe_window(self, update, micro_batches, seconds):
        """
        Report window `update`'s wall time (seconds since the previous window's end, the device synchronised) to a
        :class:`GoodputAccumulation` policy, after the window's end chose the next N; nothing for another N. Once
        the policy's calibration is fitted its constants go to the device, which decides with them from then on.
        A state loaded into the cell since the last report (a resumed run) is taken into the policy first. In data
        parallel, while the policy calibrates, the time reported is the slowest device's
        (:func:`slowest_device_seconds`): every device calls this for every window, and all fit and freeze the
        same constants, hence choose the same N.

        Args:
            update (int): The window's index, from 0.
            micro_batches (int): Its micro-batches.
            seconds (float): Its wall time, > 0.
        """
        policy = self.adaptive_policy
        if not self._goodput:
            return
        constants, observed = self.accu_goodput_constants.asnumpy(), self.accu_goodput_observed.asnumpy()
        if not (np.array_equal(constants, self._goodput_written[0]) and
                np.array_equal(observed, self._goodput_written[1])):  # loaded from a state file
            policy.load_state_dict({"micro_time": float(constants[0]), "end_time": float(constants[1]),
                                    "observed": [row.tolist() for row in observed if row[0] >= 0]})
            self._write_goodput(policy)  # what the Parameters hold now, for the next window's comparison
        if policy.frozen:  # nothing to time, nothing to write
            return
        if self.is_distributed:
            seconds = slowest_device_seconds(seconds)
        policy.observe(update, micro_batches, seconds)
        self._write_goodput(policy)

    def _adapt_steps(self):
        """After the window's noise record: the policy's N for the next window, in ``accu_steps``."""
        if self._goodput:
            constants = self.accu_goodput_constants * 1.0
            chosen = goodput_steps_on_device(self._device_policy, self.accu_steps, self.accu_windows,
                                             self.noise_smooth_grad_sq, self.noise_smooth_trace,
                                             self.accu_last_items, self.accu_micro_steps, constants[0], constants[1])
            return ops.assign(self.accu_steps, chosen)
        chosen = next_steps_on_device(self._device_policy, self.accu_steps, self.accu_windows,
                                      self.noise_smooth_grad_sq, self.noise_smooth_trace, self.accu_last_items,
                                      self.accu_micro_steps)
        return ops.assign(self.accu_steps, chosen)

    # ------------------------------------------------------------------ adding a micro-batch
    def _window_counters(self):
        return (self.accu_items, self.accu_micro_steps, self.accu_loss, self.accu_min_items)

    def _item_ratio(self, items):
        """The micro-batch's weight in the buffers' unit: its items over ``accu_items_unit``, which the window's
        first micro-batch sets to its items and the window's end divides back. A front end that runs the backward
        multiplies the gradient's seed by it before its backward, so that the gradient arrives weighted and is
        added as it is (``buffer += grad * weight`` held a product of a parameter's size beside the gradients);
        Accumulator, handed finished gradients, adds with it in place (``grad_ops.accumulate_weighted``). Near 1,
        so that a float16 backward runs at about the scale it would without accumulation, and exactly 1 for equal
        micro-batches. None with ``average=False``."""
        if not self.average:
            return None
        unit = ops.select(self.accu_micro_steps == 0, items, self.accu_items_unit)
        return ops.depend(items / unit, ops.assign(self.accu_items_unit, unit))

    def _add_micro_batch(self, loss, items, grads, weight=None, seed_ratio=None):
        """accu_grads += weight * grads (weight: the items by default, 1 when the cell sums instead of averaging;
        gradients whose seed was multiplied by `seed_ratio`, from :meth:`_item_ratio`, are added as they are);
        counters take in the micro-batch.

        Where the cell's step runs eagerly (PYNATIVE_MODE, its network not compiled: see ``compiled.py``), this
        still runs as one compiled graph, with the gradients handed over as a mutable tuple (as constants,
        MindSpore would compile a new graph per call).
        """
        if seed_ratio is not None:
            weight = None
        elif weight is None:
            weight = items if self.average else ops.ones_like(items)
        if self._eager:
            return self._add_compiled(loss, items, mutable(grads), weight, seed_ratio)
        out = self._add(loss, items, grads, weight, seed_ratio)
        if self._branched and loss is not None:
            out = through_a_branch(out)
        return out

    def _add(self, loss, items, grads, weight, seed_ratio=None):
        noise_weights = None
        if self.measure_noise:  # items * |g|^2 of the micro-batch's mean gradient g (grads: g * seed_ratio)
            noise_weights = (items, items) if seed_ratio is None else (items / (seed_ratio * seed_ratio), items)
        return window.add_micro_batch(self.window_map, self.accu_grads, grads, weight, loss, items,
                                      self._window_counters(), self._noise_sums(), self._measures_micro_batch(),
                                      noise_weights)

    _add_compiled = jit(_add)

    # ------------------------------------------------------------------ ending a window
    def _sum_over_devices(self, value):
        """Sum of a float32 tensor over all devices (the value itself on one device)."""
        if self.is_distributed:
            return self.window_allreduce(value)
        return value

    def _local_overflow(self):
        """1.0 if the window overflowed on this device (an inf or nan in its buffers: one overflowing micro-batch
        stays there through every later addition), else 0.0."""
        return ops.cast(window.buffers_overflow(self.window_map, self.accu_grads), mstype.float32)

    def _window_overflow(self, norm):
        """Whether the window is skipped: with a loss scale, an overflow on any device (every device decides
        alike); without one, a gradient that is not finite, read from its global `norm` (computed after the
        reduction, so the same on every device, and already there for telemetry and clipping: the check costs
        one scalar test). With nonfinite="raise" such a window raises instead. With a loss scale, a window whose
        norm is not finite though no device overflowed is an overflow too: its squared sums overflowed float32 (a
        scale near 2^64 on gradients near 1), so it has no norm to clip by or to record, and the scale must drop."""
        if self.scale_kind is None:
            if self.nonfinite == "apply":  # no check: the window is applied whatever it holds
                return False
            overflow = ops.logical_not(ops.isfinite(norm))
            if self.nonfinite == "raise" and self.compile_cache_on and not self.window_end_in_python:
                overflow = window.assert_finite(overflow, norm)  # else raised in the skip's branch (_step_unless)
            return overflow
        overflow = self._sum_over_devices(self._local_overflow()) > 0.0
        return ops.logical_or(overflow, ops.logical_not(ops.isfinite(norm)))

    def _window_check(self):
        """(whether the window must be refused, an error raised instead of its update; the values the error shows).
        By default, a micro-batch that reported no items (its loss, a mean over nothing, is meaningless) or items
        that are not finite (NaN or inf, counted as -inf: its weight is not a count). A front end with more to
        check overrides this and :meth:`_refuse_window`."""
        smallest = self.accu_min_items * 1.0  # a Tensor, not the Parameter, so that the message shows its value
        return smallest <= 0.0, (smallest,)

    def _refuse_window(self, refused, shown):
        """Raise the refused window's error if `refused` (`shown`: from :meth:`_window_check`)."""
        window.check_items(self.owner_name, refused, shown[0], self.items_source, self.rebuild_hint)

    def _skips_windows(self):
        """Whether the window's end has a skip branch (a loss scale, or nonfinite other than "apply")."""
        return self.scale_kind is not None or self.nonfinite != "apply"

    def _raises_nonfinite(self):
        """Whether a window whose gradient is not finite raises in the skip's branch: nonfinite="raise" without a
        loss scale (whose overflows are skipped), in a cell that raises in its graph, and without the compile cache
        (there MindSpore's ``Assert`` checks it, in :meth:`_window_overflow`)."""
        return self.nonfinite == "raise" and self.scale_kind is None and not self.window_end_in_python and \
            not self.compile_cache_on

    def _after_optimizer_reads(self, condition):
        """`condition` after the optimizer's Parameters are taken as inputs (:func:`compiled.read_before_branch`), for a
        runtime branch on it that holds the optimizer step: so that a Parameter the host replaced with ``set_data``
        between calls is what the step reads and writes."""
        if self.optimizer_parameters is None and self.optimizer_other_parameters is None:
            return condition
        return ops.depend(condition, read_before_branch(self.window_map, self.optimizer_parameters,
                                                        self.optimizer_other_parameters))

    def _step_unless(self, overflow, refused, shown, optimizer, grads, result, read_before_skip=True):
        """One optimizer step unless the window overflowed or is `refused` (None: checked already). The skip's
        runtime branch also raises the refused window's error, and with nonfinite="raise" a non-finite window's:
        a branch of its own slowed the window's end (docs/performance_history.md, The non-finite check). A refused
        window's error comes first: a micro-batch without items is also what makes a window's gradient NaN. With
        `read_before_skip`, the optimizer's Parameters are read before that branch (see :meth:`_end_window`)."""
        stop = overflow if refused is None else ops.logical_or(overflow, refused)
        if read_before_skip and not isinstance(stop, bool):  # no branch under "apply"
            stop = self._after_optimizer_reads(stop)
        if stop:
            if refused is not None:
                self._refuse_window(refused, shown)
            if self._raises_nonfinite():
                window.check_finite(self.owner_name, overflow)
        else:
            result = ops.depend(result, optimizer(grads))
        return result

    def _end_window(self, optimizer, reset=True, read_before_skip=True):
        """
        The window's update: check the window (:meth:`_window_check`), divide the buffers by the window's items on
        all devices (and by the loss scale), reduce once across devices, clip, record the window (and its
        noise-scale estimates), decide the overflow on every device alike, update the loss scale once, step
        `optimizer` unless the window overflowed or is refused, and, with `reset`, clear the buffers and counters
        and count the window. With `read_before_skip` the optimizer's Parameters are read before the skip branch
        (:meth:`_after_optimizer_reads`); False where the caller read them before a runtime branch of its own that
        holds this whole window end (Accumulator's), so that they are not read twice.

        Returns:
            (the window's mean loss on this device, whether the window was skipped (a loss-scale overflow, or a
            gradient that is not finite), the loss scale for the next window (None without one)).
        """
        refused, shown = self._window_check()
        checked = None
        if self.compile_cache_on:  # the compile cache cannot store a raise (runtime_checks.py)
            checked, refused = assert_in_graph(ops.logical_not(refused), list(shown)), None
        elif not self._skips_windows():  # no skip branch to share: a branch of its own, before anything
            self._refuse_window(refused, shown)
            refused = None
        total = self.accu_items + 0.0
        if checked is not None:
            total = ops.depend(total, checked)
        if self.reducer_flag:
            total = self._sum_over_devices(total)
        if self.average:  # the buffers hold sum(items * gradient) / accu_items_unit
            divisor = ops.maximum(total / self.device_degree, 1e-12) / self.accu_items_unit
        else:  # the raw sum: handed on as it is where it may be (in place), else copied (see finish_gradients)
            divisor = None if self.divide_in_place else ops.ones_like(total)
        unscale = 1.0
        if self.scale_kind is not None:
            unscale = ops.reshape(self.accu_scale, ()) * 1.0
            divisor = unscale if divisor is None else divisor * unscale
        grads, recorded = window.finish_gradients(
            self.window_map, self.accu_grads, divisor, self.grad_reducer, self.clip_norm,
            (self.accu_last_items, self.accu_last_grad_norm, self.accu_last_clipped), total, self.divide_in_place,
            self.reducer_flag)
        norm = ops.depend(self.accu_last_grad_norm, recorded) * 1.0
        if self.measure_noise:
            recorded = ops.depend(recorded, self._record_noise(
                norm, total, unscale, self._sum_over_devices if self.reducer_flag else None))
        loss_sum = self.accu_loss + 0.0
        if self.reducer_flag:  # the window's mean loss over every device's items, as one device would report it
            loss_sum = self._sum_over_devices(loss_sum)
        mean_loss = ops.depend(loss_sum / ops.maximum(total, 1e-12), recorded)
        increment = None
        if self.lr_state is not None:  # the window's learning-rate factor, written before the step reads it
            noise = (None, None)
            if self.lr_scaling in ADASCALE_RULES:  # the smoothed estimates after this window's own record
                noise = (ops.depend(self.noise_smooth_grad_sq * 1.0, recorded),
                         ops.depend(self.noise_smooth_trace * 1.0, recorded))
            increment = prepare_window_rate(self.lr_scaling, self._lr_params(), total, *noise)
        overflow = self._window_overflow(norm)
        next_scale = None
        if self.scale_kind is not None:
            overflow = update_scale(self.scale_kind, self.loss_scale_manager, self.accu_scale, overflow)
            next_scale = ops.depend(ops.reshape(self.accu_scale, ()) * 1.0, overflow)
        if increment is not None:
            if isinstance(overflow, bool):  # nonfinite="apply": no flag to order by, order the loss instead
                mean_loss = ops.depend(mean_loss, increment)
            else:
                overflow = ops.depend(overflow, increment)
        mean_loss = self._step_unless(overflow, refused, shown, optimizer, grads, mean_loss, read_before_skip)
        if increment is not None:  # a skipped window moves neither progress nor the optimizer's global_step
            mean_loss = ops.depend(mean_loss, advance_progress(
                self._lr_params(), ops.depend(increment, mean_loss), None if isinstance(overflow, bool) else overflow))
        mean_loss = window.count_skip((self.accu_skipped_windows, self.accu_nonfinite_streak, self.accu_skip_history),
                                      overflow, mean_loss)
        if self.accu_windows is not None and self._device_policy is not None:
            mean_loss = ops.depend(mean_loss, self._adapt_steps())
        if reset:
            mean_loss = self._reset_window(mean_loss)
        return mean_loss, overflow, next_scale

    def drop(self):
        """
        Discard the open window: buffers and counters cleared, no optimizer step, and the window not counted (the
        next window takes its place in a schedule).

        Returns:
            Tensor, int32 scalar: the micro-batches the discarded window held.
        """
        return self._clear_window(self.accu_micro_steps + 0)

    def _clear_window(self, result):
        """Zero the buffers and counters after `result` is computed (the window not counted); returns `result`."""
        return window.reset_window(self.accu_grads, self._window_counters(), result)

    def _reset_window(self, result):
        """Zero the buffers and counters after `result` is computed, and count the window; returns `result`."""
        if self.accu_windows is not None:
            result = ops.depend(result, ops.assign_add(self.accu_windows, ops.ones_like(self.accu_windows)))
        return self._clear_window(result)
