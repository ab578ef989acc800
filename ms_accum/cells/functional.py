"""Accumulator: gradient accumulation for the functional training loop of MindSpore 2.x (value_and_grad)."""

import numpy as np
from mindspore import Parameter, RowTensor, Tensor, mutable, nn, ops
from mindspore import dtype as mstype

from ..core import window
from ..core.checks import check_bool, check_clip_norm, check_optimizer
from ..core.engine import WINDOW_PREFIX, WindowEngine, data_parallel_reducer, float32_buffers
from ..core.loss_scale import scale_kind, scale_parameter
from ..core.noise_scale import noise_state
from ..core.schedule import steps_argument
from ..core.weighting import ITEMS_ARGUMENT, as_weight, check_items_value
from ..core.user_warning import warn


class Accumulator(WindowEngine, nn.Cell):
    r"""
    Gradient accumulation for a loop written with :func:`mindspore.value_and_grad`, the MindSpore 2.x tutorial's
    ``Accumulator`` done right.

    After ``loss, grads = grad_fn(*micro_batch)``, where `grads` is the gradient of the micro-batch's **mean**
    loss (do not divide the loss by N, as the tutorial does: the accumulator averages),
    ``accumulator(grads, num_items)`` adds the micro-batch's gradient weighted by `num_items` (its samples, or
    the tokens its loss averaged over; omitted, every micro-batch weighs the same: give it for every micro-batch of
    a window or for none, since a window that mixes the two is refused). Every N-th
    call steps the optimizer once with the window's weighted mean gradient (so a learning-rate schedule advances
    once per window), clipped by its global norm when `clip_norm` is given, and clears the buffers;
    :meth:`flush` applies a partial window (at the end of an epoch, say). In data parallel the gradients and item
    counts are reduced across devices once per window.

    With a `loss_scaler` (:class:`mindspore.amp.DynamicLossScaler` or :class:`mindspore.amp.StaticLossScaler`),
    `grads` is the gradient of ``loss_scaler.scale(loss)``: the accumulator unscales it, skips the whole window
    when any of its micro-batches overflowed (an inf or nan in the float32 buffers; parameters and optimizer state
    untouched), and calls ``loss_scaler.adjust`` once per window. Do not call ``unscale`` or ``adjust`` yourself.

    It works inside a :func:`mindspore.jit`-compiled train step, and called from Python in either mode (in
    PYNATIVE_MODE a call runs as one compiled graph too). No full-size ``zeros`` copy is kept.

    Args:
        optimizer (Cell): The optimizer; `grads` follow its `parameters`.
        gradient_accumulation_steps (Union[int, dict, str, AccumulationSchedule, AdaptiveAccumulation]): N, the
            micro-batches per update, >= 1; or a schedule ``{first_update: N}`` (see :class:`AccumulationSchedule`):
            windows are counted from 0 in its ``accu_windows`` Parameter (a flushed window counts), so the schedule
            follows a saved and reloaded Accumulator; or an :class:`AdaptiveAccumulation` policy, decided on the
            device after each window, inside a compiled step too (needs `noise_scale`). In a compiled step a change
            of N compiles nothing. A ``GoodputAccumulation`` policy (``ms_accum.core.goodput``) is taken with its
            window-time constants given (`micro_time`, `end_time`): a window ended inside a compiled step cannot be
            timed for its calibration. The tutorial's ``accumulate_step`` (and ``accumulation_steps``, ``mini_steps``)
            is accepted in its place, keyword only.
        clip_norm (float, optional): Clip each window's gradient to this global norm, once per window, as
            ``ops.clip_by_global_norm`` would clip the large batch's gradient. Default: ``None`` (no clipping).
        loss_scaler (Union[mindspore.amp.LossScaler, Cell, Tensor], optional): The scaler the loss was scaled
            with; a loss-scale update cell (:class:`mindspore.nn.DynamicLossScaleUpdateCell`) or a scale Tensor
            is taken too: scale the loss by ``accumulator.accu_scale``. Default: ``None``.
        noise_scale (Union[bool, str]): Measure the gradient noise scale (``True``: every micro-batch;
            ``"first"``: the first of each window, cheaper and noisier): each window yields unbiased estimates
            of |G|^2 and tr(Sigma), in the units `num_items` counts (micro-batches when it is omitted), read through
            ``noise_records``, and the smoothed noise scale through ``b_simple`` (see ``docs/noise_scale.md``).
            Default: ``False``.
        average (bool): ``True`` applies the window's mean gradient weighted by `num_items`; ``False`` the raw sum
            of its micro-batch gradients (the tutorial's behaviour). ``False`` excludes `noise_scale`.
            Default: ``True``.
        nonfinite (str): A window whose gradient holds a NaN or an inf (without a loss scale) is skipped,
            parameters and optimizer state untouched, and counted in ``accu_skipped_windows`` and
            ``accu_nonfinite_streak``: ``"skip"`` goes on, ``"raise"`` raises instead; ``"apply"`` checks nothing
            and applies it, as :class:`mindspore.nn.TrainOneStepCell` does. With a loss scale only ``"skip"`` is
            taken: its overflow skip decides. Default: ``"skip"``.
        lr_scaling (str): The learning-rate rule, as in :class:`TrainAccuStepsCell`: ``"none"``, ``"linear"``,
            ``"sqrt"`` or ``"adascale"`` (needs `noise_scale`); G is the window's `num_items` over all devices
            (its micro-batches when `num_items` is omitted). Default: ``"none"``.
        reference_batch (float, optional): G0 in the same units, > 0; given with a rule only (refused without
            one). Default: ``None``: the first window's.

    Inputs:
        - **grads** (tuple[Tensor]) - The micro-batch's gradient, one Tensor per optimizer parameter (the rows of a
          sparse lookup's gradient, a RowTensor, are added in place; see ``docs/models.md``).
        - **num_items** (Union[Tensor, int, float], optional) - What the micro-batch weighs, > 0. Default:
          ``None`` (weight 1; then omit it for every micro-batch of the window).

    Outputs:
        Tensor, bool scalar: whether this call ended a window (its update was applied, or skipped for an
        overflow or a non-finite gradient, which ``last_overflow`` then says).

    Raises:
        RuntimeError: If the parallel mode reduces gradients across devices (DATA_PARALLEL) but
            ``mindspore.communication.init()`` was not called.
        TypeError: If `optimizer` is not an optimizer, N is missing, given twice or not an integer, `clip_norm` is
            not a number, `loss_scaler` is none of the loss-scale forms, or `noise_scale` is neither a bool nor a
            str; when called, if `num_items` is neither a number nor a Tensor.
        ValueError: If N is < 1 (or a malformed schedule, or a policy without `noise_scale`), `clip_norm` is not a
            finite number > 0, `loss_scaler` starts from a scale that is not a finite number > 0, one of the
            optimizer's parameters has ``requires_grad=False``, or, with MindSpore's compile cache on, if its stored
            graphs were compiled with other settings; when called, if `grads` does
            not hold one gradient per optimizer parameter, each of its shape, or `num_items` is a Tensor of more
            than one element; when a window ends, if a micro-batch of it had `num_items` <= 0, NaN or inf, or some
            of its micro-batches had `num_items` and others not (the optimizer is not stepped); `nonfinite` is not
            ``"skip"`` with a `loss_scaler`; `lr_scaling` or `reference_batch` is refused as listed for
            :class:`TrainOptim`.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> loss_fn = nn.MSELoss()
        >>> optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> accumulator = ms_accum.Accumulator(optimizer, gradient_accumulation_steps=4)
        >>> def forward(x, y):
        ...     return loss_fn(net(x), y)
        >>> grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
        >>> @ms.jit
        ... def train_step(x, y):
        ...     loss, grads = grad_fn(x, y)
        ...     return loss, accumulator(grads, x.shape[0])
        >>> x, y = ms.Tensor(np.ones((8, 4), np.float32)), ms.Tensor(np.zeros((8, 2), np.float32))
        >>> for _ in range(4):
        ...     loss, updated = train_step(x, y)
        >>> bool(updated)
        True
    """

    def __init__(self, optimizer, gradient_accumulation_steps=None, clip_norm=None, loss_scaler=None,
                 noise_scale=False, average=True, nonfinite="skip", lr_scaling="none", reference_batch=None,
                 *, accumulation_steps=None, mini_steps=None, accumulate_step=None):
        super().__init__(auto_prefix=False)
        owner = "Accumulator"
        steps = steps_argument(owner, gradient_accumulation_steps, dict(
            accumulation_steps=accumulation_steps, mini_steps=mini_steps, accumulate_step=accumulate_step))
        self.optimizer = check_optimizer(owner, optimizer)
        self.parallel_mode, self.reducer_flag, self.degree, self.grad_reducer = \
            data_parallel_reducer(optimizer.parameters)
        kind = scale_kind(owner, loss_scaler, "loss_scaler")
        self._init_engine(owner, float32_buffers(optimizer.parameters, "accu_grads"), window.WindowState(WINDOW_PREFIX),
                          check_clip_norm(owner, clip_norm), check_bool(owner, "average", average),
                          noise=noise_state(owner, WINDOW_PREFIX, noise_scale, average),
                          loss_scale=(kind, *scale_parameter(kind, loss_scaler)) if kind else None,
                          nonfinite=nonfinite)
        self.set_gradient_accumulation_steps(*steps)
        self._init_lr_scaling(self.optimizer, lr_scaling, reference_batch)  # last: it may rewire the optimizer
        self.loss_scaler = loss_scaler
        self.shapes = tuple(tuple(p.shape) for p in optimizer.parameters)
        self.last_overflow = Parameter(Tensor(False, mstype.bool_), name=f"{WINDOW_PREFIX}.last_overflow",
                                       requires_grad=False)
        self.unweighted = Parameter(Tensor(0, mstype.int32), name=f"{WINDOW_PREFIX}.unweighted", requires_grad=False)
        self._check_compile_cache()  # now: the user's jit step compiles construct without calling the cell
        if self.compile_cache_on:
            warn("For 'Accumulator', MindSpore's compile cache is on, but it reloads a cached jit function "
                 "wrongly: on MindSpore 2.10 a second run of a jit step holding Accumulator trained nothing "
                 "(the same step without ms_accum too), and the tutorial's own step trained to other "
                 "parameters. If you call it inside an ms.jit function, turn the cache off (unset "
                 "MS_COMPILER_CACHE_ENABLE), or train with the cells (TrainAccuStepsCell, the three "
                 "single-device cells), whose cached graphs trained alike.", UserWarning)

    @property
    def inner_grads(self):
        """The float32 gradient buffers (the tutorial's name)."""
        return self.accu_grads

    @property
    def accumulate_step(self):
        """The tutorial's name for :attr:`gradient_accumulation_steps`."""
        return self.gradient_accumulation_steps

    def __call__(self, grads, num_items=None):
        """Check `grads` against the optimizer's parameters before anything is added; hand them over as a mutable
        tuple and a number of items as a Tensor, so that one compiled graph serves every call (constants would be
        folded into a new graph each time), in GRAPH_MODE and in PYNATIVE_MODE (``compiled.py``)."""
        if not isinstance(grads, (tuple, list)):
            raise TypeError(f"For 'Accumulator', 'grads' must be a tuple of Tensors, one per optimizer parameter, "
                            f"but got {type(grads).__name__}.")
        grads = tuple(_dense_gradient(grad) for grad in grads)
        for index, grad in enumerate(grads):
            if not isinstance(grad, Tensor):
                raise TypeError(f"For 'Accumulator', 'grads' must be a tuple of Tensors, one per optimizer parameter, "
                                f"but gradient {index} is of type {type(grad).__name__}. Compute them with "
                                f"mindspore.value_and_grad, or wrap arrays in mindspore.Tensor.")
        _check_grads(grads, self.shapes, [tuple(g.shape) for g in grads], eager=True)
        grads = mutable(grads)
        if isinstance(num_items, np.generic) or (isinstance(num_items, np.ndarray) and num_items.ndim == 0):
            num_items = num_items.item()  # a NumPy scalar (np.int64(8), an array's element or 0-d array) is a number
        if num_items is not None and check_items_value("Accumulator", num_items, ITEMS_ARGUMENT):
            num_items = Tensor(num_items, mstype.float32)
        return super().__call__(grads, num_items)

    def construct(self, grads, num_items=None):
        # The shapes through HyperMap, and the loop that names the wrong gradient only when one is: a Python loop
        # over the gradients slowed the jit step's compilation (docs/performance_history.md, Start-up: where the
        # time goes).
        shapes = self.window_map(_shape_of, grads)
        if shapes != self.shapes:
            _check_grads(grads, self.shapes, shapes)
        items = as_weight("Accumulator", num_items)
        if num_items is None:  # decided when the call is compiled: no runtime branch
            items = ops.depend(items, ops.assign_add(self.unweighted, ops.ones_like(self.unweighted)))
        ratio = self._item_ratio(items)
        if num_items is None:
            # every micro-batch weighs 1, so the ratio is exactly 1: the gradients are added as they are, one pass
            # over each buffer, where the in-place weighted add takes two (benchmarks/lab/scaled_add.py)
            added = self._add_micro_batch(None, items, grads, seed_ratio=ratio)
        else:
            added = self._add_micro_batch(None, items, grads, weight=ratio)
        done = self._after_optimizer_reads(ops.depend(self.accu_micro_steps, added) >= self._steps_now())
        if done:
            done = ops.depend(done, self._finish_window())
        return done

    def flush(self):
        """
        Apply the window still open (fewer than N micro-batches), weighted by its own items. In data parallel the
        window is open if it is on any device: every device then takes part in its reduction, a device whose own
        share is empty with zero items (one waiting in the reduction alone hung until MindSpore's collective timed
        out).

        Returns:
            Tensor, bool scalar: whether there was a window to apply (on any device).
        """
        pending = self.accu_micro_steps > 0
        if self.is_distributed:
            pending = self._sum_over_devices(ops.cast(pending, mstype.float32)) > 0.0
        pending = self._after_optimizer_reads(pending)
        if pending:
            pending = ops.depend(pending, self._finish_window())
        return pending

    def _finish_window(self):
        """The window's update (or, on overflow, none), the loss scaler adjusted once, the buffers cleared."""
        ended = self._end_window(self.optimizer, read_before_skip=False)  # read before construct's or flush's branch
        result, overflow = ended[0], ended[1]  # unpacking the unused third made MindSpore warn of a lost node
        if not isinstance(overflow, bool):  # else nonfinite="apply" without a loss scale: nothing was checked
            result = ops.depend(result, ops.assign(self.last_overflow, overflow))
        return ops.depend(result, ops.assign(self.unweighted, ops.zeros_like(self.unweighted)))

    def _window_check(self):
        """One check of the window's items (each a finite number > 0, and given for every micro-batch or for none),
        in the engine's skip branch: in a user's jit step a check that raises is compiled into a slow
        ``PyExecute`` node, and two of them start up slower than one (docs/performance_history.md, Start-up: where
        the time goes)."""
        smallest = self.accu_min_items * 1.0  # Tensors, not Parameters, so that the message shows their values
        unweighted, micro_steps = self.unweighted + 0, self.accu_micro_steps + 0
        mixed = ops.logical_and(unweighted > 0, unweighted < micro_steps)
        return ops.logical_or(mixed, smallest <= 0.0), (smallest, unweighted, micro_steps)

    def _refuse_window(self, refused, shown):
        """Raise Accumulator's error if `refused` (`shown`: from :meth:`_window_check`)."""
        smallest, unweighted, micro_steps = shown
        if refused:
            raise ValueError(f"For 'Accumulator', 'num_items' must be a finite number > 0 for every micro-batch of "
                             f"a window, and given for every micro-batch or for none, but of this window's "
                             f"{micro_steps} micro-batches {unweighted} had none (an omitted num_items weighs 1 beside "
                             f"the others' item counts) and the smallest num_items was {smallest} (omitted ones "
                             f"counted as 1; -inf stands for a NaN or an infinite one). Leave out micro-batches with "
                             f"no items, and pass num_items on every call (for example the micro-batch's sample "
                             f"count, x.shape[0]). The window was not applied; to go on, save the network and build a "
                             f"new Accumulator.")


_shape_of = ops.MultitypeFuncGraph("shape_of")


@_shape_of.register("Tensor")
def _dense_shape(grad):
    """A dense gradient's shape, known when the graph is compiled."""
    return grad.shape


@_shape_of.register("RowTensor")
def _sparse_shape(grad):
    """A sparse gradient's dense shape (the parameter's). MindSpore 2.10 does not fold it into a constant, so the
    shape comparison is compiled into the graph and ``_check_grads`` must not convert it (``tuple()`` of it fails to
    compile: "Not support the type: Undetermined")."""
    return grad.dense_shape


def _dense_gradient(grad):
    """A sparse gradient computed outside a compiled step, as a dense Tensor: MindSpore hands it to Python as a
    RowTensor or, in GRAPH_MODE, as the tuple (row indices, rows, dense shape), which a compiled graph cannot take
    as an input. The rows are added into zeros of the parameter's shape (repeated indices add up), as a dense
    gradient would be; any other gradient is returned as it is. (Inside a jit step the rows stay sparse and are
    added into the buffer in place.)"""
    if isinstance(grad, RowTensor):
        grad = (grad.indices, grad.values, grad.dense_shape)
    if isinstance(grad, tuple) and len(grad) == 3 and isinstance(grad[0], Tensor) and isinstance(grad[1], Tensor) \
            and isinstance(grad[2], tuple):
        indices, values, shape = grad
        return ops.tensor_scatter_add(ops.zeros(shape, values.dtype), indices.reshape(-1, 1), values)
    return grad


def _check_grads(grads, expected, shapes, eager=False):
    """Raise unless there is one gradient per optimizer parameter, each of the parameter's shape. `eager`: called
    from Python, where a sparse gradient computed eagerly in PYNATIVE_MODE arrives as its rows without their indices,
    which the message then names."""
    if len(grads) != len(expected):
        raise ValueError(f"For 'Accumulator', 'grads' must hold one gradient per optimizer parameter ({len(expected)}"
                         f"), but got {len(grads)}. Differentiate with respect to optimizer.parameters.")
    for index in range(len(expected)):
        if shapes[index] is not None and shapes[index] != expected[index]:
            rows = ""
            if eager and len(shapes[index]) == len(expected[index]) > 1 and shapes[index][1:] == expected[index][1:]:
                rows = (" If this parameter is the table of a sparse lookup (nn.EmbeddingLookup(sparse=True)), these "
                        "are its gradient's rows without their indices, which MindSpore drops when the gradient is "
                        "computed eagerly: compute it inside a mindspore.jit step.")
            raise ValueError(f"For 'Accumulator', 'grads' must follow optimizer.parameters in order and shape, but "
                             f"gradient {index} has shape {shapes[index]} where the parameter has "
                             f"{expected[index]}. Differentiate with respect to optimizer.parameters.{rows}")
