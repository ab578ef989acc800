"""TrainAccuStepsWithLossScaleCell: TrainAccuStepsCell with loss scaling and a window-wide overflow decision."""
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype

from ..compat import overflow_saturates
from ..core import window
from ..core.checks import check_bool, check_clip_norm
from ..core.engine import CellNaming, WindowEngine
from ..core.loss_scale import SCALER, check_scale_sense, mindspore_scale_sense
from ..core.noise_scale import noise_state
from ..core.schedule import steps_argument, steps_given
from ..core.weighting import LossAndItems, loss_sens, micro_batch_forward
from .parallel import AccumulationModes, check_cell_arguments


class TrainAccuStepsWithLossScaleCell(AccumulationModes, WindowEngine, nn.TrainOneStepWithLossScaleCell):
    r"""
    Gradient accumulation with loss scaling: one overflowing micro-batch discards the whole window.

    Gradients of the scaled loss are accumulated in float32 ``accu_grads``, and each micro-batch's overflow
    (any inf or nan in the buffers after its gradient is added) is or-ed into ``accu_overflow``. On the update
    call the flag is combined across devices, so every device takes the same decision; the loss scale (a
    :class:`mindspore.nn.DynamicLossScaleUpdateCell`, say) is updated once for the window; without overflow the
    optimizer receives the unscaled mean gradient of the window's samples or items, with overflow the step is skipped
    (parameters and optimizer state untouched). Buffers and flag are reset either way.

    The overflow check uses IsFinite, which runs on CPU, GPU and Ascend; on Ascend in saturation mode (910A,
    or ``MS_ASCEND_CHECK_OVERFLOW_MODE=SATURATION_MODE``), where overflows saturate instead of producing inf,
    MindSpore's float-status check is used for each micro-batch instead.

    Modes (which calls update) and weighting (samples, or ``num_items``) are those of
    :class:`TrainAccuStepsCell`.

    Args:
        network (Cell): The loss network, returning the mean loss over its micro-batch or
            ``(loss, num_items)``.
        optimizer (Cell): The optimizer.
        scale_sense (Union[Tensor, Cell, mindspore.amp.LossScaler]): The loss scale, or a cell updating it, as in
            :class:`mindspore.nn.TrainOneStepWithLossScaleCell`; or a :class:`mindspore.amp.LossScaler`, whose
            ``scale_value`` the cell then scales with and whose ``adjust`` it calls once per window.
        gradient_accumulation_steps (Union[int, dict, str, AccumulationSchedule, AdaptiveAccumulation]): N, as in
            :class:`TrainAccuStepsCell` (``accumulation_steps``, ``mini_steps``, ``accumulate_step`` accepted in
            its place). Default: ``1`` (warned of, as in :class:`TrainAccuStepsCell`).
        clip_norm (float, optional): Clip the window's unscaled gradient to this global norm, once per window, as
            in :class:`TrainAccuStepsCell`. Default: ``None`` (no clipping).
        noise_scale (Union[bool, str]): Measure the gradient noise scale, as in :class:`TrainAccuStepsCell`
            (``True``: every micro-batch; ``"first"``: the first of each window on each device); an overflowing
            window gives no estimate. Default: ``False``.
        average (bool): ``True`` applies the mean gradient over the window's samples or items; ``False`` the raw
            sum of its micro-batch gradients (the tutorial's behaviour; reduced across devices as MindSpore's reducer
            does). ``False`` excludes `noise_scale`. Default: ``True``.
        nonfinite (str): Only ``"skip"`` (the default), taken by every ms_accum cell: with a loss scale, a window
            holding an inf or a NaN is the overflow skip's to decide (skipped, the scale lowered). Accepted so that
            the cells take the same arguments; ``"raise"`` or ``"apply"`` is refused. Default: ``"skip"``.
        lr_scaling (str): The learning-rate rule, as in :class:`TrainAccuStepsCell`. A skipped (overflowing)
            window moves neither the progress nor the optimizer's step. Default: ``"none"``.
        reference_batch (float, optional): G0, as in :class:`TrainAccuStepsCell`. Default: ``None``.

    Inputs:
        - **\*inputs** (Tuple(Tensor)) - One micro-batch.

    Outputs:
        Tuple of 3 Tensors, like :class:`mindspore.nn.TrainOneStepWithLossScaleCell`:

        - **loss** (Tensor) - The micro-batch's unscaled loss when accumulating; on the update call, the mean
          loss over the window's samples or items on this device.
        - **overflow** (Tensor) - bool: an overflow so far in the window (on the update call: on any device).
        - **loss scale** (Tensor) - The loss scale used by this micro-batch; on the update call, the scale for
          the next window (after the loss-scale cell's update).

    Raises:
        RuntimeError: If the parallel mode reduces gradients across devices (DATA_PARALLEL) but
            ``mindspore.communication.init()`` was not called.
        TypeError: If `network` is not a Cell, `optimizer` is not an optimizer, N is given twice or is not an
            integer, or `scale_sense` is none of the loss-scale forms (an update cell, an amp LossScaler, a
            Tensor); when called, as listed for :class:`TrainAccuStepsCell`.
        ValueError: If none of the optimizer's parameters is a parameter of `network` (some not: a warning), one has
            ``requires_grad=False``, N is < 1, `clip_norm` is not a finite number > 0, or `scale_sense` is a Tensor
            of shape other than () or (1,) or starts from a scale that is not a finite number > 0, or `nonfinite` is
            not ``"skip"``; when called, as listed for :class:`TrainAccuStepsCell`.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=2**12, scale_factor=2, scale_window=1000)
        >>> cell = ms_accum.TrainAccuStepsWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), optimizer,
        ...                                                 scale_sense=manager,
        ...                                                 gradient_accumulation_steps=4)
    """

    def __init__(self, network, optimizer, scale_sense, gradient_accumulation_steps=None, clip_norm=None,
                 noise_scale=False, average=True, nonfinite="skip", lr_scaling="none", reference_batch=None,
                 *, accumulation_steps=None, mini_steps=None, accumulate_step=None, _naming=None):
        naming = _naming or CellNaming("TrainAccuStepsWithLossScaleCell")  # see TrainAccuStepsCell
        owner = naming.owner
        aliases = dict(accumulation_steps=accumulation_steps, mini_steps=mini_steps, accumulate_step=accumulate_step)
        steps = steps_argument(owner, gradient_accumulation_steps, aliases, 1)
        check_cell_arguments(owner, network, optimizer)
        kind = check_scale_sense(owner, scale_sense)
        # MindSpore's cell takes an update cell or a Tensor; an amp LossScaler's own Parameter then replaces the scale
        super().__init__(LossAndItems(owner, network), optimizer, mindspore_scale_sense(kind, scale_sense))
        scale = scale_sense.scale_value if kind == SCALER else self.scale_sense
        updater = scale_sense if kind == SCALER else self.loss_scaling_manager
        self._init_engine(owner, naming._replace(float32_buffers=True).buffers(self.weights),
                          window.WindowState(naming.window_prefix), check_clip_norm(owner, clip_norm),
                          check_bool(owner, "average", average),
                          noise=noise_state(owner, naming.window_prefix, noise_scale, average),
                          loss_scale=(kind, updater, scale), nonfinite=nonfinite, rebuild=naming.rebuild_hint,
                          window_end_in_python=True)
        self.set_gradient_accumulation_steps(*steps)
        self._init_lr_scaling(self.optimizer, lr_scaling, reference_batch)  # last: it may rewire the optimizer
        self._init_modes(steps_given(gradient_accumulation_steps, aliases))
        self.accu_overflow = Parameter(Tensor(0.0, mstype.float32), name=f"{naming.window_prefix}.overflow",
                                       requires_grad=False)
        self.saturation_mode = overflow_saturates(self)

    def _clear_window(self, result):
        """The window's overflow flag is cleared with its buffers."""
        result = ops.depend(result, ops.assign(self.accu_overflow, ops.zeros_like(self.accu_overflow)))
        return window.reset_window(self.accu_grads, self._window_counters(), result)

    def _local_overflow(self):
        """The window's overflow flag on this device, or-ed over its micro-batches (see construct)."""
        return self.accu_overflow + 0.0

    def _micro_batch_overflow(self, status, grads):
        """1.0 if the window overflowed so far on this device, else 0.0 (no communication).

        An inf or nan in any micro-batch's gradient stays in the float32 buffers until they are reset, so the
        buffers are checked after each addition; this also covers sparse gradients and a sum that overflows.
        Ascend in saturation mode produces no inf: there MindSpore's float-status check runs on the gradients.
        """
        if self.saturation_mode:
            return ops.cast(self.get_overflow_status(status, grads), mstype.float32)
        return ops.cast(window.buffers_overflow(self.window_map, self.accu_grads), mstype.float32)

    def construct(self, *inputs):
        if not self._accumulate_now:  # the window's end (no inputs): see end_window
            return self._end_window(self.optimizer)
        loss, items = micro_batch_forward(self.network, inputs, self._eager)
        scaling_sens = self.accu_scale
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        ratio = self._item_ratio(items)
        seed = scaling_sens if ratio is None else ratio * scaling_sens
        grads = self.grad(self.network, self.weights)(*inputs, loss_sens(loss, items, seed, self._eager))
        loss = self._add_micro_batch(loss, items, grads, seed_ratio=ratio)
        flag = self._micro_batch_overflow(status, grads)
        loss = ops.depend(loss, ops.assign(self.accu_overflow, ops.maximum(self.accu_overflow, flag)))
        return loss, self.accu_overflow > 0.0, scaling_sens
