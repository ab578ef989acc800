"""The three single-device cells of the accumulation recipe: forward-backward, optimizer step, clear.

The cells share one ``grad_sum`` ParameterTuple and the window counters attached to it (see ``window.py``).
By default the step they apply equals one large-batch step on exactly the samples (or items) of the window:
each micro-batch's gradient is weighted by what it weighs (``weighting.py``) while it is added, and the sum is
divided by the window's total before the optimizer sees it. ``average=False`` reproduces the tutorial's raw sum
instead.
"""
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

from ..core import window
from ..core.compiled import through_a_branch
from ..core.checks import (check_bool, check_call_inputs, check_cell, check_clip_norm, check_grad_sum, check_optimizer,
                           check_optimizer_trains, check_sens, warn_eval_mode)
from ..core.engine import WindowEngine
from ..core.loss_scale import scale_kind, shared_scale
from ..core.noise_scale import EVERY, FIRST, check_noise_scale
from ..core.weighting import LossAndItems, forget_failed_forward, loss_sens, micro_batch_forward


class TrainForwardBackward(WindowEngine, nn.TrainOneStepCell):
    r"""
    Runs the loss network forward and backward on one micro-batch and adds the gradients into `grad_sum`.

    No parameter changes: the optimizer step is :class:`TrainOptim`'s job. With ``average=True`` (default) each
    micro-batch's gradient is weighted by what it weighs relative to the window's first micro-batch (through the
    backward's seed, so that no product of a parameter's size is held beside the gradients): `grad_sum` holds
    sum(items_i * grad_i) / items_1. The window's item count, micro-batch count and loss sum are updated, so that
    :class:`TrainOptim` can apply the weighted mean.

    What a micro-batch weighs: if the loss network returns one scalar, the mean loss over its micro-batch
    (MindSpore's default reduction), its samples, which is the leading dimension of its inputs (they must agree:
    inputs shaped (T, B, F) beside labels (B,) raise an error at the first call); if it returns
    ``(loss, num_items)``, with ``loss`` the mean over ``num_items`` items (tokens, say), its ``num_items``. The
    window then applies the gradient of the mean loss over all of its samples or items.

    As with :class:`mindspore.nn.TrainOneStepCell`, put the network in training mode before the first call
    (``set_train(True)``): MindSpore builds every Cell in inference mode, where BatchNorm uses its moving statistics
    and dropout drops nothing. The first call warns if every such layer of the network is in inference mode.

    Args:
        network (Cell): The loss network, returning a scalar loss or ``(loss, num_items)``.
        optimizer (Cell): The optimizer whose `parameters` receive gradients.
        grad_sum (ParameterTuple): Gradient buffers, one per optimizer parameter, for example
            ``optimizer.parameters.clone(prefix="grad_sum", init="zeros")``; not the parameters themselves.
        sens (numbers.Number): Gradient seed, as in :class:`mindspore.nn.TrainOneStepCell`: the gradients
            reaching the optimizer are multiplied by it. Default: ``1.0``.
        average (bool): ``True`` to apply the mean over the window's samples or items, ``False`` to apply the raw
            sum of micro-batch gradients (the tutorial's behaviour). Must match :class:`TrainOptim`.
            Default: ``True``.
        scale_sense (Union[Tensor, Cell], optional): Loss scaling, as in
            :class:`mindspore.nn.TrainOneStepWithLossScaleCell`: a scale Tensor, or a loss-scale update cell
            (:class:`mindspore.nn.DynamicLossScaleUpdateCell`, :class:`mindspore.nn.FixedLossScaleUpdateCell`).
            Backward runs on the loss times the current scale; :class:`TrainOptim` unscales, skips a window that
            overflowed and updates the scale once per window. Pass the same object to :class:`TrainOptim`; use
            float32 buffers (``grad_sum``) with float16 parameters. Default: ``None`` (no loss scaling).
        noise_scale (Union[bool, str]): Measure the gradient noise scale (``True``: every micro-batch;
            ``"first"``: the window's first only, one gradient pass per window): each measured micro-batch's
            gradient's squared norm, weighted
            by its items, is summed for :class:`TrainOptim`, which estimates |G|^2 and tr(Sigma) from the window
            (see ``docs/noise_scale.md``). Requires ``average=True``; pass the same value to :class:`TrainOptim`.
            Default: ``False``.

    Inputs:
        - **\*inputs** (Tuple(Tensor)) - One micro-batch, as the loss network takes it.

    Outputs:
        Tensor, the micro-batch's loss.

    Raises:
        RuntimeError: If the parallel mode reduces gradients across devices (DATA_PARALLEL) but
            ``mindspore.communication.init()`` was not called.
        TypeError: If `network` is not a Cell, `optimizer` is not an optimizer, `grad_sum` is not a
            ParameterTuple, `average` is not a bool, `noise_scale` is neither a bool nor a str, or `scale_sense` is
            none of the loss-scale forms.
        ValueError: If none of the optimizer's parameters is a parameter of `network` (some not: a warning), one has
            ``requires_grad=False``, `grad_sum` does not match the optimizer's parameters, holds a gradient in a
            narrower float type than its parameter's or holds the network's or optimizer's own Parameters, `sens`
            is zero or not finite, `average`, `scale_sense` or `noise_scale` differs from another cell built on the
            same `grad_sum` or its optimizer updates other Parameters than that cell's, `noise_scale` is a str
            other than ``"first"`` or is set with ``average=False``, or `scale_sense` is a Tensor of shape other
            than () or (1,) or starts from a scale that is not a finite number > 0; at the first
            call, if the loss is not a scalar or (without `num_items`) the inputs' leading dimensions disagree, or
            with MindSpore's compile cache on, if its stored graphs were compiled with other settings; when called,
            if :class:`TrainOptim` applied the buffers and :class:`TrainClear` has not cleared them since.
        TypeError: When called with a numpy array as an input (wrap it in a Tensor); at the first call, with more or
            fewer inputs than the loss network's construct takes (a network without its loss, called with the data
            and the label), or if the loss network returns a dict.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
        >>> forward_backward = ms_accum.TrainForwardBackward(nn.WithLossCell(net, nn.MSELoss()), optimizer,
        ...                                                  grad_sum)
    """

    def __init__(self, network, optimizer, grad_sum, sens=1.0, average=True, scale_sense=None, noise_scale=False):
        owner = "TrainForwardBackward"
        check_cell(owner, "network", network)
        check_optimizer_trains(owner, check_optimizer(owner, optimizer), network)
        super().__init__(LossAndItems(owner, network), optimizer, check_sens(owner, sens))
        self.grad_sum = check_grad_sum(owner, grad_sum, optimizer, network)
        self.average = check_bool(owner, "average", average)
        state = _bind_window(owner, grad_sum, average, optimizer)
        state.forward_built = True
        kind = scale_kind(owner, scale_sense)
        _, scale = shared_scale(owner, state, scale_sense, kind)
        self._init_engine(owner, self.grad_sum, state, average=self.average,
                          noise=_noise_state(owner, state, noise_scale, average),
                          loss_scale=(kind, None, scale) if kind else None, count_windows=False)
        self.window = state

    def _holds_network(self):
        return True

    def __call__(self, *args, **kwargs):
        self.window.check_cleared("TrainForwardBackward")
        check_call_inputs(self, args, kwargs)
        warn_eval_mode(self)
        try:
            return super().__call__(*args, **kwargs)
        except BaseException:
            forget_failed_forward(self.network)
            raise

    def construct(self, *inputs):
        loss, items = micro_batch_forward(self.network, inputs, self._eager)
        seed = self.accu_scale * self.sens if self.scale_kind is not None else self.sens
        ratio = self._item_ratio(items)
        if ratio is not None:
            seed = ratio * seed
        grads = self.grad(self.network, self.weights)(*inputs, loss_sens(loss, items, seed, self._eager))
        grads = self.grad_reducer(grads)
        return self._add_micro_batch(loss, items, grads, seed_ratio=ratio)


class TrainOptim(WindowEngine, nn.Cell):
    r"""
    One optimizer step from the gradients accumulated in `grad_sum`.

    With ``average=True`` the optimizer receives ``grad_sum / items``, the gradient of the mean loss over every
    sample (or item) of the window; with ``average=False`` it receives ``grad_sum`` unchanged. With `clip_norm`
    that gradient is then clipped by its global norm, once per window, as ``ops.clip_by_global_norm`` would clip
    the large batch's gradient. With loss scaling the buffers are unscaled first, and a window in which any
    micro-batch overflowed (an inf or nan in the buffers) is skipped whole: parameters and optimizer state stay
    untouched; the scale is updated once per window either way. The optimizer (and its global step, hence any
    learning-rate schedule) advances once per applied window. The window's items, the gradient's global norm
    before clipping and whether it was clipped are kept in the ``accu_last_items``, ``accu_last_grad_norm`` and
    ``accu_last_clipped`` parameters; with `noise_scale`, the window's unbiased estimates of |G|^2 and tr(Sigma) and
    their smoothed values in ``noise_records`` (NaN for a window of one micro-batch). The buffers are divided (and
    clipped) in place and handed to the optimizer as they are, so that no copy of them is held beside the
    parameters: after the call `grad_sum` holds the gradient the optimizer received (unscaled, under a loss
    scale). They are not cleared: call :class:`TrainClear` next.

    Args:
        optimizer (Cell): The optimizer shared with :class:`TrainForwardBackward`.
        grad_sum (ParameterTuple): The buffers shared with :class:`TrainForwardBackward`.
        average (bool): Must match the :class:`TrainForwardBackward` on the same buffers. Default: ``True``.
        clip_norm (float, optional): Clip the window's gradient to this global norm; ``None`` for no clipping.
            Default: ``None``.
        scale_sense (Union[Tensor, Cell], optional): The object passed to :class:`TrainForwardBackward`.
            Default: ``None``.
        noise_scale (Union[bool, str]): The value passed to :class:`TrainForwardBackward`. Default: ``False``.
        nonfinite (str): A window whose gradient holds a NaN or an inf (without a loss scale) is skipped,
            parameters and optimizer state untouched, and counted in ``accu_skipped_windows`` and
            ``accu_nonfinite_streak``: ``"skip"`` goes on, ``"raise"`` raises instead; ``"apply"`` checks nothing
            and applies it, as :class:`mindspore.nn.TrainOneStepCell` does. With a loss scale only ``"skip"`` is
            taken: its overflow skip decides. Default: ``"skip"``.
        lr_scaling (str): The learning-rate rule, as in :class:`TrainAccuStepsCell`, for windows of the sizes the
            caller makes them: ``"none"`` (the optimizer left as it is), ``"linear"``, ``"sqrt"`` or
            ``"adascale"`` (needs `noise_scale`). Default: ``"none"``.
        reference_batch (float, optional): G0 in samples or items, > 0; given with a rule only (refused without
            one). Default: ``None``: the first window's.

    Inputs:
        None.

    Outputs:
        Without loss scaling, Tensor, float32 scalar: the mean loss over the window's samples or items. With loss
        scaling, a tuple like :class:`mindspore.nn.TrainOneStepWithLossScaleCell`'s: that mean loss, the bool
        overflow flag (the window was skipped), and the loss scale for the next window. Called on an empty window
        (nothing added since :class:`TrainClear`: at the end of an epoch whose windows were all whole, say), it
        updates nothing (optimizer, step count, records, loss scale) and returns a loss of 0 (with loss scaling:
        0, False and the current scale); telling so reads the window's count from the device once per call.

    Raises:
        RuntimeError: If the parallel mode reduces gradients across devices (DATA_PARALLEL) but
            ``mindspore.communication.init()`` was not called.
        TypeError: If `optimizer` is not an optimizer, `grad_sum` is not a ParameterTuple, `average` is not a
            bool, or `noise_scale` is neither a bool nor a str.
        ValueError: If `grad_sum` does not match the optimizer's parameters, holds a gradient in a narrower float
            type than its parameter's or holds the optimizer's own Parameters, one of the optimizer's parameters
            has ``requires_grad=False``, `clip_norm` is not a finite number > 0, `average`,
            `scale_sense` or `noise_scale` differs from the :class:`TrainForwardBackward` on the same `grad_sum`
            or its optimizer updates other Parameters than that cell's, or `noise_scale` is a str other than
            ``"first"`` or is set with ``average=False``, or `nonfinite` is not ``"skip"`` with `scale_sense`;
            when called, if a micro-batch of the window reported ``num_items`` <= 0
            (the optimizer is not stepped), if the buffers were applied and :class:`TrainClear` has not cleared
            them since, or if the window is empty and no :class:`TrainForwardBackward` was built on `grad_sum`; at
            the first call, with MindSpore's compile cache on, if its stored graphs were compiled with
            other settings; if `lr_scaling` is not a rule, is a rule with ``average=False`` (the raw sum grows with N
            by itself), is ``"adascale"`` without `noise_scale` or for an optimizer it does not know,
            `reference_batch` is not a number > 0 or is given with ``"none"``, or the optimizer does not read its
            rate through ``Optimizer.get_lr``.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
        >>> grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
        >>> optim_step = ms_accum.TrainOptim(optimizer, grad_sum, clip_norm=1.0)
    """

    def __init__(self, optimizer, grad_sum, average=True, clip_norm=None, scale_sense=None, noise_scale=False,
                 nonfinite="skip", lr_scaling="none", reference_batch=None):
        super().__init__(auto_prefix=False)
        owner = "TrainOptim"
        self.optimizer = check_optimizer(owner, optimizer)
        self.grad_sum = check_grad_sum(owner, grad_sum, optimizer)
        self.average = check_bool(owner, "average", average)
        self.clip_norm = check_clip_norm(owner, clip_norm)
        state = _bind_window(owner, grad_sum, average, optimizer)
        kind = scale_kind(owner, scale_sense)
        updater, scale = shared_scale(owner, state, scale_sense, kind)
        self._init_engine(owner, self.grad_sum, state, clip_norm=self.clip_norm, average=self.average,
                          noise=_noise_state(owner, state, noise_scale, average),
                          loss_scale=(kind, updater, scale) if kind else None, count_windows=False,
                          nonfinite=nonfinite)
        self._init_lr_scaling(self.optimizer, lr_scaling, reference_batch)
        self.loss_scaled = kind is not None
        self.window = state

    def __call__(self, *args, **kwargs):
        """An empty window (nothing added since the buffers were cleared) is no update: nothing runs, read from
        the window's micro-batch count (a wait for the device once per window). Buffers applied and not cleared
        since are refused."""
        self.window.check_cleared("TrainOptim")
        if int(self.accu_micro_steps.asnumpy()) == 0:
            if not self.window.forward_built:
                raise ValueError(f"For 'TrainOptim', 'grad_sum' must be the buffers a TrainForwardBackward adds "
                                 f"the micro-batches' gradients into, but none was built on "
                                 f"'{self.window.prefix}': its windows stay empty and no update can come. Pass "
                                 f"TrainOptim the grad_sum given to TrainForwardBackward.")
            loss = Tensor(0.0, mstype.float32)
            if self.scale_kind is None:
                return loss
            return loss, Tensor(False, mstype.bool_), Tensor(self.accu_scale.asnumpy().reshape(()))
        outputs = super().__call__(*args, **kwargs)
        self.window.applied = True
        return outputs

    def construct(self):
        ended = self._end_window(self.optimizer, reset=False)
        if self.scale_kind is None:  # indexed, not unpacked: an unused unpacked output makes MindSpore warn
            return ops.depend(ended[0], ended[1])
        return ended


class TrainClear(WindowEngine, nn.Cell):
    r"""
    Zeroes the gradient buffers and the window counters in place.

    Unlike the tutorial's version it needs no second full-size copy of the parameters holding zeros.

    Args:
        grad_sum (ParameterTuple): The buffers shared with :class:`TrainForwardBackward`.
        zeros (ParameterTuple, optional): Accepted for compatibility with the tutorial and otherwise unused; if
            given it must match `grad_sum` in shapes and be separate from it. Default: ``None``.

    Inputs:
        None.

    Outputs:
        Tensor, int32 scalar: the number of micro-batches the cleared window held.

    Raises:
        RuntimeError: If the parallel mode reduces gradients across devices (DATA_PARALLEL) but
            ``mindspore.communication.init()`` was not called.
        TypeError: If `grad_sum` (or `zeros`, when given) is not a ParameterTuple.
        ValueError: If `zeros` does not match `grad_sum` in shapes or shares Parameters with it; when called, if
            no :class:`TrainForwardBackward` or :class:`TrainOptim` was built on `grad_sum` (they check that the
            buffers are not the network's own weights).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
        >>> grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
        >>> clear = ms_accum.TrainClear(grad_sum)
    """

    def __init__(self, grad_sum, zeros=None):
        super().__init__(auto_prefix=False)
        owner = "TrainClear"
        self.grad_sum = check_grad_sum(owner, grad_sum)
        if zeros is not None:
            check_grad_sum(owner, zeros, arg_name="zeros")
            if [p.shape for p in zeros] != [p.shape for p in grad_sum]:
                raise ValueError(f"For '{owner}', 'zeros' must match 'grad_sum' in shapes, but got "
                                 f"{[tuple(p.shape) for p in zeros]}; it is not needed, so pass zeros=None.")
            if any(z is g for z, g in zip(zeros, grad_sum)):
                raise ValueError(f"For '{owner}', 'zeros' must be separate from 'grad_sum', but it holds the same "
                                 f"Parameters; it is not needed, so pass zeros=None.")
        self.window = window.window_state(grad_sum)
        self._init_engine(owner, self.grad_sum, self.window, count_windows=False)

    def __call__(self, *args, **kwargs):
        if not self.window.verified:
            raise ValueError("For 'TrainClear', 'grad_sum' must be the buffers of a TrainForwardBackward or "
                             "TrainOptim, which check them against the optimizer's parameters, but none was built on "
                             "it. Build TrainForwardBackward(net, optimizer, grad_sum) first, with grad_sum = "
                             "optimizer.parameters.clone(prefix='grad_sum', init='zeros'): clearing the weights "
                             "themselves would zero the network.")
        cleared = super().__call__(*args, **kwargs)
        self.window.applied = False
        return cleared

    def construct(self):
        cleared = self._reset_window(self.accu_micro_steps + 0)
        return through_a_branch(cleared) if self._branched else cleared


def _bind_window(owner, grad_sum, average, optimizer):
    """The WindowState of the cells on `grad_sum`, after checking they agree on `average` and on the Parameters
    their optimizers update."""
    state = window.window_state(grad_sum)
    state.bind(owner, "average", average, "Pass the same 'average' to TrainForwardBackward and TrainOptim.")
    state.bind_weights(owner, optimizer)
    state.verified = True
    return state


def _noise_state(owner, state, measure, average):
    """The window's NoiseState if the cells measure the noise scale (they must agree), else None."""
    mode = check_noise_scale(owner, measure, average)
    shown = {None: False, EVERY: True, FIRST: FIRST}[mode]  # singletons: the cells' choices compare by identity
    state.bind(owner, "noise_scale", shown, "Pass the same 'noise_scale' to TrainForwardBackward and TrainOptim.")
    return state.noise_state(mode) if mode else None
