r"""The optimizer's learning rate read from the run's progress, not from its update count.

When the global batch changes during a run, a schedule over updates (a warm-up of 1,000 updates, a cosine decay)
changes its length in data. Read from progress instead, it keeps it: progress counts reference steps, the updates a
run at the reference batch G0 would have made on the same data (G / G0 per window), or AdaScale's sum of gains
(``lr_scaling.py``). The learning rate of a window is then

    schedule(floor(progress)) x f

where `schedule` is the optimizer's own learning rate (a float, a list or 1-D Tensor with one entry per reference step,
or a :class:`mindspore.nn.learning_rate_schedule.LearningRateSchedule`) and f the window's factor from the scaling rule.
The schedule receives whole reference steps as an int32 Tensor of shape (1,), exactly what an optimizer hands it in its
``global_step``, so every schedule an optimizer takes today takes progress too, and with f = 1 and progress = the update
index the step is the original's bit for bit. A list should hold an entry for every reference step the run reaches: its
items over G0 for ``"linear"`` and ``"sqrt"``, at most that for the AdaScale rules while G >= G0. The trainers check
that before training where a micro-batch's items are its samples; beyond a list's end its last entry is read (where the
optimizer's own Gather fails on CPU), so that a run whose loss counts tokens, whose reference steps nobody can count in
advance, goes on at the list's final rate, which telemetry shows.

Progress and f live in the Parameters of a :class:`ProgressState`, which a window's end writes on the device:
:func:`prepare_window_rate` before the optimizer step (f, and G0 at the first window), :func:`advance_progress` after
it (unless the window was skipped, as the optimizer's ``global_step`` is not advanced then). Progress is kept as
whole steps (int32) and a fraction in [0, 1) (float32), so that it stays exact for integer increments and does not
drift over a long run with fractional ones (a single float32 counter near 10^5 would round every increment to
0.008).

An optimizer reads them once :func:`rewire_learning_rate` has replaced its ``learning_rate`` with
:class:`ProgressLearningRate` cells (one per parameter group), or when it was built with one.
"""
import numbers

import numpy as np

from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype
from mindspore.nn import LARS, AdaFactor, CellList, Optimizer, OptTFTWrapper
from mindspore.nn.learning_rate_schedule import LearningRateSchedule

from .compiled import write_parameter
from .lr_scaling import check_reference_batch, scaling_on_device

# nn optimizers that read their learning rate otherwise than through Optimizer.get_lr at each step
_NOT_REWIRABLE = {
    LARS: "LARS copies the learning rate of the optimizer it wraps when it is built",
    AdaFactor: "AdaFactor reads its learning rate through its relative_step, scale_parameter and warmup_init options "
               "as well",
    OptTFTWrapper: "OptTFTWrapper reads the learning rate of the optimizer it wraps",
}


def _scalar(name, value, dtype=mstype.float32, shape=()):
    return Parameter(Tensor(np.full(shape, value), dtype), name=name, requires_grad=False)


class ProgressState:
    """
    The Parameters a learning rate read from progress needs, written by a window's end on the device.

    Args:
        prefix (str): Name prefix of the Parameters (the keys of a checkpoint). Default: ``"accu_lr"``.
        reference_batch (float, optional): G0, the reference batch in items, > 0. Default: ``None``: the items of
            the first window (written by :func:`prepare_window_rate`).

    Attributes:
        steps (Parameter): int32, shape (1,): whole reference steps of progress, what the schedule receives.
        fraction (Parameter): float32: the fraction of a reference step beyond them, in [0, 1).
        factor (Parameter): float32: f, the factor of the window being applied (1 until a window writes it).
        reference_batch (Parameter): float32: G0 (0 until the first window's end when not given).
        applied_rate (Parameter): float32: the learning rate the optimizer's last step read (its first parameter
            group's), for telemetry: progress has moved on once the window's end is over.

    Raises:
        TypeError: If `prefix` is not a str, or `reference_batch` is not a number or None.
        ValueError: If `reference_batch` is not a finite number > 0.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum.core.progress_lr import ProgressState
        >>> state = ProgressState(reference_batch=64)
        >>> state.progress, [p.name for p in state.parameters]
        (0.0, ['accu_lr.progress_steps', 'accu_lr.progress_fraction', 'accu_lr.factor', 'accu_lr.reference_batch'])
        >>> state.set_progress(2.5)
        >>> state.progress, int(state.steps.asnumpy()[0])
        (2.5, 2)
    """

    def __init__(self, prefix="accu_lr", reference_batch=None):
        if not isinstance(prefix, str):
            raise TypeError(f"For 'ProgressState', 'prefix' must be a str, but got {type(prefix).__name__}.")
        reference = check_reference_batch("ProgressState", reference_batch)
        self.steps = _scalar(f"{prefix}.progress_steps", 0, mstype.int32, (1,))
        self.fraction = _scalar(f"{prefix}.progress_fraction", 0.0)
        self.factor = _scalar(f"{prefix}.factor", 1.0)
        self.applied_rate = _scalar(f"{prefix}.applied_rate", 0.0)
        self.reference_batch = _scalar(f"{prefix}.reference_batch", reference or 0.0)
        self.rule = None  # the rule of the cell that advances it, for messages

    def adopt_reference_batch(self, owner, reference_batch):
        """A later cell taking this state over with `reference_batch` (a checked number, or None): G0 written if the
        state has none yet; refused if it has another."""
        if reference_batch is None:
            return
        current = float(self.reference_batch.asnumpy())
        if current == 0.0:
            write_parameter(self.reference_batch, np.float32(reference_batch))
        elif current != float(np.float32(reference_batch)):
            raise ValueError(f"For '{owner}', 'reference_batch' must be the G0 of the progress the optimizer reads, "
                             f"{current:g}, but got {reference_batch:g}: progress counted in other reference steps "
                             f"would read the schedule elsewhere. Drop reference_batch (the run goes on at G0 = "
                             f"{current:g}), or build a new optimizer.")

    @property
    def parameters(self):
        """(steps, fraction, factor, reference_batch): what :func:`prepare_window_rate` and
        :func:`advance_progress` take."""
        return (self.steps, self.fraction, self.factor, self.reference_batch)

    @property
    def progress(self):
        """float: reference steps of progress (reads the device)."""
        return float(self.steps.asnumpy()[0]) + float(self.fraction.asnumpy())

    def set_progress(self, progress):
        """Set the progress from the host (a number >= 0): to start a run, or a run resumed from a state that had
        no progress, at its update count."""
        if isinstance(progress, bool) or not isinstance(progress, numbers.Real) or not 0 <= progress < 2 ** 31:
            raise ValueError(f"For 'ProgressState', 'progress' must be a number in [0, 2**31), but got {progress!r}.")
        whole = int(np.floor(progress))
        write_parameter(self.steps, np.array([whole], np.int32))
        write_parameter(self.fraction, np.float32(progress - whole))


class ProgressLearningRate(LearningRateSchedule):
    r"""
    A learning rate read from the run's progress: ``learning_rate(floor(progress)) x f``, with progress and f from a
    :class:`ProgressState`. The step the optimizer hands it (its ``global_step``) is not read.

    Build an optimizer with it (``nn.Momentum(params, ProgressLearningRate(lr, state), 0.9)``), or let
    :func:`rewire_learning_rate` put it in place of an optimizer's own learning rate.

    Args:
        learning_rate (Union[float, int, Tensor, Parameter, list, tuple, LearningRateSchedule]): The schedule in
            reference steps: a number >= 0 (or a 0-d Tensor or Parameter: a constant rate, read from the
            Parameter at each step), a list, tuple or 1-D Tensor with one entry per reference step, or a
            :class:`mindspore.nn.learning_rate_schedule.LearningRateSchedule` (a built-in one, or a user's own),
            called with whole reference steps as an int32 Tensor of shape (1,).
        state (ProgressState): Where progress and f are read.
        record (bool): Whether the rate is written to the state's ``applied_rate`` each time it is read (one cell
            per state records: the first parameter group's). Default: ``True``.

    Inputs:
        - **global_step** (Tensor) - The optimizer's step; not read.

    Outputs:
        Tensor, float32, the learning rate (shape (1,) for a list or a schedule that returns one, else a scalar:
        the optimizer reshapes it).

    Raises:
        TypeError: If `learning_rate` is none of the above, or `state` is not a :class:`ProgressState`.
        ValueError: If `learning_rate` is a negative or non-finite number, or an empty or 2-D list or Tensor.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import Tensor, nn
        >>> from ms_accum.core.compiled import write_parameter
        >>> from ms_accum.core.progress_lr import ProgressLearningRate, ProgressState
        >>> state = ProgressState()
        >>> rate = ProgressLearningRate([0.1, 0.2, 0.3, 0.4], state)
        >>> state.set_progress(2.7)
        >>> write_parameter(state.factor, 0.5)
        >>> print(rate(Tensor([0])))     # the entry of reference step 2, times 0.5
        [0.15]
        >>> net = nn.Dense(2, 1)
        >>> optimizer = nn.Momentum(net.trainable_params(), rate, 0.9)
    """

    def __init__(self, learning_rate, state, record=True):
        # no prefix: the wrapped schedule's Parameters keep their names (an optimizer's checkpoint keys), and the
        # state's are shared by every group's cell
        super(LearningRateSchedule, self).__init__(auto_prefix=False)  # pylint: disable=bad-super-call
        if not isinstance(state, ProgressState):
            raise TypeError(f"For 'ProgressLearningRate', 'state' must be a ProgressState, but got "
                            f"{type(state).__name__}.")
        self.progress_steps = state.steps
        self.factor = state.factor
        self.progress_state = state  # not read in construct: what a later cell adopts (progress_state_of)
        # not read here: held so that the optimizer's checkpoint holds the whole progress (its fraction, and G0)
        self.progress_fraction = state.fraction
        self.reference_batch = state.reference_batch
        self.applied_rate = state.applied_rate if record else None
        self.fixed, self.table, self.schedule = None, None, None
        if isinstance(learning_rate, LearningRateSchedule):
            self.schedule = learning_rate
        elif isinstance(learning_rate, Parameter) and learning_rate.ndim == 0:
            self.fixed = learning_rate  # the optimizer's own Parameter: a rate written to it still takes effect
        else:
            values = _rates(learning_rate)
            if values.ndim == 0:
                self.fixed = Parameter(Tensor(values, mstype.float32), name="learning_rate")
            else:
                self.table = Parameter(Tensor(values, mstype.float32), name="learning_rate")
        # a list's entries: its own table, or the table of the optimizer's _IteratorLearningRate it wraps
        table = getattr(self.base, "learning_rate", self.base)
        self.list_length = table.shape[0] if isinstance(table, Tensor) and table.ndim == 1 else None
        self.last_step = None if self.list_length is None else Tensor([self.list_length - 1], mstype.int32)

    @property
    def base(self):
        """The rate read at progress, before the factor: the schedule, the list (a Parameter) or the fixed rate."""
        return next(rate for rate in (self.schedule, self.table, self.fixed) if rate is not None)

    def set_data(self, data):
        """
        Set a constant base rate by hand, as ``optimizer.learning_rate.set_data(...)`` sets an optimizer's own
        constant rate: a cell's learning-rate rule puts this cell in that place, and its factor still applies to
        the rate set (the rate of a window is `data` x f). It writes with an assign, not ``Parameter.set_data``
        (which in PYNATIVE_MODE detaches a Parameter from the ``ms.jit`` graphs that ran with it), so the next
        window reads it in either mode, on every path: called from Python between windows, or between the calls of
        a jit step that holds an Accumulator (docs/resume_and_checkpoints.md).

        Args:
            data (Union[float, Tensor]): The new base rate, a finite number >= 0.

        Returns:
            Parameter, the base rate's Parameter.

        Raises:
            TypeError: If the base rate is a list or a schedule (no one value to set), or `data` is not a number or
                a 0-d Tensor.
            ValueError: If `data` is negative or not finite.
        """
        if self.fixed is None:
            raise TypeError("For 'ProgressLearningRate', 'set_data' sets a constant base rate, but this rate is read "
                            "from a list or a schedule at the run's progress: there is no one value to set. Change "
                            "the list or schedule itself (ops.assign into its Parameter), or build the optimizer "
                            "with a constant rate.")
        if isinstance(data, (list, tuple)) or (isinstance(data, Tensor) and data.ndim):
            shape = tuple(data.shape) if isinstance(data, Tensor) else (len(data),)
            raise TypeError(f"For 'ProgressLearningRate', 'data' must be a number or a 0-d Tensor, the constant "
                            f"rate, but got {type(data).__name__} of shape {shape}.")
        if isinstance(data, bool) or not isinstance(data, (numbers.Real, Tensor)):
            raise TypeError(f"For 'ProgressLearningRate', 'data' must be a number or a 0-d Tensor, the constant "
                            f"rate, but got {type(data).__name__}.")
        write_parameter(self.fixed, _rates(data, argument="data"))
        return self.fixed

    def construct(self, global_step):
        steps = self.progress_steps
        if self.last_step is not None:  # a list: its last entry beyond its end
            steps = ops.minimum(steps, self.last_step)
        if self.schedule is not None:
            base = self.schedule(steps)
        elif self.table is not None:
            base = ops.gather(self.table, steps, 0)
        else:
            base = self.fixed
        rate = base * self.factor
        if self.applied_rate is None:
            return rate
        return ops.depend(rate, ops.assign(self.applied_rate, ops.reshape(rate, ())))


def _rates(learning_rate, argument="learning_rate"):
    """A float32 numpy scalar or 1-D array from a number, a list or tuple, or a Tensor; raises otherwise, naming
    `argument`."""
    owner = "ProgressLearningRate"
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (numbers.Real, list, tuple, Tensor)):
        raise TypeError(f"For '{owner}', '{argument}' must be a number, a list, a Tensor or a "
                        f"LearningRateSchedule, but got {type(learning_rate).__name__}.")
    values = learning_rate.asnumpy() if isinstance(learning_rate, Tensor) else np.array(learning_rate)
    if values.dtype.kind not in "iuf" or values.ndim > 1 or values.size == 0:
        raise ValueError(f"For '{owner}', '{argument}' must be a number or a non-empty 1-D sequence of numbers, "
                         f"but got {values.ndim}-D {values.dtype} of shape {values.shape}.")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError(f"For '{owner}', '{argument}' must hold finite numbers >= 0, but got "
                         f"{values if values.ndim == 0 else values[~(np.isfinite(values) & (values >= 0))][:3]}.")
    return values.astype(np.float32)


def _rates_of(optimizer):
    """The optimizer's learning rate, one entry per parameter group."""
    return list(optimizer.learning_rate) if optimizer.is_group_lr else [optimizer.learning_rate]


def progress_rates(optimizer):
    """The optimizer's :class:`ProgressLearningRate` cells, one per parameter group, or () when it reads its rate
    from its update count."""
    return tuple(rate for rate in _rates_of(optimizer) if isinstance(rate, ProgressLearningRate))


def progress_state_of(optimizer):
    """
    The :class:`ProgressState` whose progress `optimizer` reads its learning rate from (it was rewired, or built with
    :class:`ProgressLearningRate`), or None when it reads its rate from its update count.

    Args:
        optimizer (mindspore.nn.Optimizer): The optimizer.

    Returns:
        ProgressState or None.

    Raises:
        ValueError: If its parameter groups read the progress of different states.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum.core.progress_lr import ProgressLearningRate, ProgressState, progress_state_of
        >>> state = ProgressState()
        >>> optimizer = nn.SGD(nn.Dense(2, 1).trainable_params(), ProgressLearningRate(0.1, state))
        >>> progress_state_of(optimizer) is state
        True
    """
    inner = getattr(optimizer, "opt", None)  # LARS reads the rate of the optimizer it wraps
    if isinstance(inner, Optimizer):
        return progress_state_of(inner)
    states = {id(rate.progress_state): rate.progress_state for rate in progress_rates(optimizer)}
    if len(states) > 1:
        raise ValueError(f"For 'progress_state_of', the optimizer's parameter groups must read one run's progress, "
                         f"but they read {len(states)} ProgressStates. Build every group's ProgressLearningRate on "
                         f"one state.")
    return next(iter(states.values()), None)


def rewire_learning_rate(optimizer, state, owner="rewire_learning_rate"):
    """
    Make `optimizer` read its learning rate from `state`'s progress and factor: each learning rate it holds (one,
    or one per parameter group) is wrapped in a :class:`ProgressLearningRate`, in place. Its weight decay, its
    ``global_step`` and its checkpoint names are kept; the state's Parameters join its own, so that its checkpoint
    holds the progress. Do it before its first step.

    Works for every ``mindspore.nn`` optimizer that reads its rate through ``Optimizer.get_lr`` at each step (SGD,
    Momentum, Adam, AdamWeightDecay, LazyAdam, AdamOffload, AdaMax, RMSProp, Adagrad, ProximalAdagrad, Adadelta,
    Lamb, ASGD, FTRL, Rprop) and for a user's subclass of ``nn.Optimizer`` that does the same (it calls
    ``self.get_lr()``, which it does not override).

    Args:
        optimizer (mindspore.nn.Optimizer): The optimizer to rewire.
        state (ProgressState): Where progress and f are read.
        owner (str): The API asking, for messages. Default: ``"rewire_learning_rate"``.

    Returns:
        The same optimizer.

    Raises:
        TypeError: If `optimizer` is not a ``mindspore.nn.Optimizer`` or `state` not a :class:`ProgressState`.
        ValueError: If the optimizer reads its learning rate another way (LARS, AdaFactor, OptTFTWrapper, a class
            that overrides ``get_lr``), or was rewired already.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum.core.progress_lr import ProgressState, rewire_learning_rate
        >>> net = nn.Dense(2, 1)
        >>> optimizer = nn.Momentum(net.trainable_params(), nn.CosineDecayLR(0.0, 0.1, 100), 0.9)
        >>> state = ProgressState()
        >>> optimizer = rewire_learning_rate(optimizer, state)
        >>> state.set_progress(50)
        >>> print(round(float(optimizer.get_lr()), 6))     # the cosine at reference step 50, not at the update
        0.05
    """
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"For '{owner}', 'optimizer' must be a mindspore.nn.Optimizer, but got "
                        f"{type(optimizer).__name__}.")
    if not isinstance(state, ProgressState):
        raise TypeError(f"For '{owner}', 'state' must be a ProgressState, but got {type(state).__name__}.")
    kind = type(optimizer)
    reason = next((text for refused, text in _NOT_REWIRABLE.items() if isinstance(optimizer, refused)), None)
    if reason is None and kind.get_lr is not Optimizer.get_lr:
        reason = f"{kind.__name__} overrides get_lr, so it may not read the rate from its learning_rate"
    if reason is not None:
        raise ValueError(f"For '{owner}', the optimizer must read its learning rate through Optimizer.get_lr at each "
                         f"step, but {reason}. Build the optimizer (for LARS or OptTFTWrapper, the one it wraps) "
                         f"with learning_rate=ms_accum.core.progress_lr.ProgressLearningRate(rate, ProgressState()), "
                         f"whose state a cell with a learning-rate rule adopts, or leave its rate read from its update "
                         f"count (no learning-rate scaling).")
    rates = _rates_of(optimizer)
    if any(isinstance(rate, ProgressLearningRate) for rate in rates):
        raise ValueError(f"For '{owner}', the optimizer must read its learning rate from its update count, but it "
                         f"reads it from progress already (a ProgressLearningRate). Rewire each optimizer once, or "
                         f"pass it to an ms_accum cell with a learning-rate rule, which adopts its progress.")
    wrapped = {}
    for rate in rates:
        if id(rate) not in wrapped:
            wrapped[id(rate)] = ProgressLearningRate(rate, state, record=not wrapped)  # the first group's records
    delattr(optimizer, "learning_rate")  # a Parameter, a ParameterTuple or a Cell: Cell refuses to overwrite it
    if optimizer.is_group_lr:
        optimizer.learning_rate = CellList([wrapped[id(rate)] for rate in rates], auto_prefix=False)
    else:
        optimizer.learning_rate = wrapped[id(rates[0])]
    optimizer.dynamic_lr = True
    return optimizer


def prepare_window_rate(rule, lr_params, items, smooth_grad_sq=None, smooth_trace=None):
    """
    In a graph, at a window's end before the optimizer step: G0 set to the window's `items` if it is not set yet
    (the run's first window), and the window's factor f written, from its items over all devices and the smoothed
    noise estimates after its own record (read by the AdaScale rules only). Returns the window's progress
    increment, a float32 scalar Tensor, for :func:`advance_progress`; the writes are done once it is computed.

    Args:
        rule (str): A concrete rule (``lr_scaling.resolve_scaling_rule``), a graph constant.
        lr_params (tuple): A :class:`ProgressState`'s ``parameters``.
        items (Tensor): G, the window's items over all devices, float32 scalar.
        smooth_grad_sq (Tensor): The smoothed |G|^2; None unless the rule is an AdaScale rule.
        smooth_trace (Tensor): The smoothed tr(Sigma); likewise.
    """
    _, _, factor, reference = lr_params
    items = ops.cast(items, mstype.float32)
    reference_now = ops.select(reference > 0.0, reference * 1.0, items)
    scale, increment = scaling_on_device(rule, items, reference_now, smooth_grad_sq, smooth_trace)
    done = ops.depend(ops.assign(reference, reference_now), ops.assign(factor, scale))
    return ops.depend(increment, done)


# A sum within this much below a whole reference step is that step. Increments are float32 (G / G0 rounded): three
# windows of float32(5/3) from 1 sum to 5.9999998, which floor() takes for step 5, and the schedule would be read
# one entry early from then on. Exact sums of such ratios reach whole steps every few windows, where the error
# starts again from 0; 2^-14 covers about 500 windows' roundings, and moves a sum that is really that close to the
# next step by at most 6e-5 of a step.
WHOLE_STEP_SNAP = 2.0 ** -14


def advance_progress(lr_params, increment, skipped=None):
    """
    In a graph, after the window's optimizer step: progress += `increment`, unless `skipped` (a bool Tensor: the
    window was skipped and the optimizer not stepped; None: it was applied). Whole steps go to the int32 counter,
    the rest stays in the fraction; a sum short of a whole step by float32 rounding (:data:`WHOLE_STEP_SNAP`) is that
    step. Returns a Tensor to depend on.
    """
    steps, fraction, _, _ = lr_params
    if skipped is not None:
        increment = ops.select(skipped, ops.zeros_like(increment), increment)
    total = fraction + increment
    whole = ops.floor(total + WHOLE_STEP_SNAP)
    done = ops.assign_add(steps, ops.reshape(ops.cast(whole, mstype.int32), (1,)))
    return ops.depend(done, ops.assign(fraction, ops.maximum(total - whole, ops.zeros_like(total))))
