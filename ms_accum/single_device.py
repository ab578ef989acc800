"""The three single-device cells of the accumulation recipe: forward-backward, optimizer step, clear.

The cells share one ``grad_sum`` ParameterTuple and the window counters attached to it (see ``window.py``).
By default the step they apply equals one large-batch step on exactly the samples of the window: each
micro-batch's gradient is weighted by its sample count while it is added, and the sum is divided by the total
count before the optimizer sees it. ``average=False`` reproduces the tutorial's raw sum instead.
"""
from mindspore import jit, nn, ops
from mindspore import dtype as mstype

from . import grad_ops
from ._checks import check_bool, check_grad_sum, check_sens
from .window import window_state


class TrainForwardBackward(nn.TrainOneStepCell):
    r"""
    Runs the loss network forward and backward on one micro-batch and adds the gradients into `grad_sum`.

    No parameter changes: the optimizer step is :class:`TrainOptim`'s job. With ``average=True`` (default) each
    micro-batch's gradient is multiplied by its sample count (the first input's leading dimension) as it is
    added, and the window's sample count, micro-batch count and loss sum are updated, so that
    :class:`TrainOptim` can apply the sample-weighted mean. This assumes the loss network returns the mean loss
    over its micro-batch (MindSpore's default reduction).

    Args:
        network (Cell): The loss network, returning one scalar loss.
        optimizer (Cell): The optimizer whose `parameters` receive gradients.
        grad_sum (ParameterTuple): Gradient buffers, one per optimizer parameter, for example
            ``optimizer.parameters.clone(prefix="grad_sum", init="zeros")``.
        sens (numbers.Number): Gradient seed, as in :class:`mindspore.nn.TrainOneStepCell`: the gradients
            reaching the optimizer are multiplied by it. Default: ``1.0``.
        average (bool): ``True`` to apply the mean over the window's samples, ``False`` to apply the raw sum of
            micro-batch gradients (the tutorial's behaviour). Must match :class:`TrainOptim`. Default: ``True``.

    Inputs:
        - **\*inputs** (Tuple(Tensor)) - One micro-batch; the first input's leading dimension is its size.

    Outputs:
        Tensor, the micro-batch's loss.

    Raises:
        TypeError: If `grad_sum` is not a ParameterTuple or `average` is not a bool.
        ValueError: If `grad_sum` does not match the optimizer's parameters, `sens` is zero or not finite, or
            `average` differs from another cell built on the same `grad_sum`.

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

    def __init__(self, network, optimizer, grad_sum, sens=1.0, average=True):
        owner = "TrainForwardBackward"
        super().__init__(network, optimizer, check_sens(owner, sens))
        self.grad_sum = check_grad_sum(owner, grad_sum, optimizer)
        self.average = check_bool(owner, "average", average)
        state = window_state(grad_sum)
        state.bind_average(owner, average)
        self.sample_count, self.micro_steps, self.loss_sum = state.parameters
        self.hyper_map = ops.HyperMap()

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grad_ops.check_scalar_loss("TrainForwardBackward", loss)
        batch = ops.shape(inputs[0])[0]
        seed = self.sens * batch if self.average else self.sens
        grads = self.grad(self.network, self.weights)(*inputs, ops.fill(loss.dtype, loss.shape, seed))
        grads = self.grad_reducer(grads)
        added = self.hyper_map(grad_ops.accumulate, self.grad_sum, grads)
        loss = ops.depend(loss, added)
        batch_f = ops.scalar_to_tensor(batch, mstype.float32)
        loss = ops.depend(loss, ops.assign_add(self.sample_count, batch_f))
        loss = ops.depend(loss, ops.assign_add(self.micro_steps, ops.scalar_to_tensor(1, mstype.int32)))
        return ops.depend(loss, ops.assign_add(self.loss_sum, ops.cast(loss, mstype.float32) * batch_f))


class TrainOptim(nn.Cell):
    r"""
    One optimizer step from the gradients accumulated in `grad_sum`.

    With ``average=True`` the optimizer receives ``grad_sum / sample_count``, the gradient of the mean loss over
    every sample of the window; with ``average=False`` it receives ``grad_sum`` unchanged. The optimizer (and
    its global step, hence any learning-rate schedule) advances once per call. The window's sample count and the
    applied gradient's global norm are kept in the ``last_samples`` and ``last_grad_norm`` parameters. The
    buffers are not cleared: call :class:`TrainClear` next.

    Args:
        optimizer (Cell): The optimizer shared with :class:`TrainForwardBackward`.
        grad_sum (ParameterTuple): The buffers shared with :class:`TrainForwardBackward`.
        average (bool): Must match the :class:`TrainForwardBackward` on the same buffers. Default: ``True``.

    Inputs:
        None.

    Outputs:
        Tensor, float32 scalar: the mean loss over the window's samples (0 for an empty window). Calling it on
        an empty window applies a zero gradient.

    Raises:
        TypeError: If `grad_sum` is not a ParameterTuple or `average` is not a bool.
        ValueError: If `grad_sum` does not match the optimizer's parameters or `average` differs from another
            cell built on the same `grad_sum`.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
        >>> grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
        >>> optim_step = ms_accum.TrainOptim(optimizer, grad_sum)
    """

    def __init__(self, optimizer, grad_sum, average=True):
        super().__init__(auto_prefix=False)
        owner = "TrainOptim"
        self.optimizer = optimizer
        self.grad_sum = check_grad_sum(owner, grad_sum, optimizer)
        self.average = check_bool(owner, "average", average)
        state = window_state(grad_sum)
        state.bind_average(owner, average)
        self.sample_count, _, self.loss_sum = state.parameters
        self.last_samples, self.last_grad_norm = state.last_samples, state.last_grad_norm
        self.hyper_map = ops.HyperMap()

    @jit  # one compiled graph in PYNATIVE_MODE too: about 50 small ops, launched one by one otherwise
    def construct(self):
        count = ops.maximum(self.sample_count, 1.0)
        if self.average:
            grads = self.hyper_map(ops.partial(grad_ops.scale, 1.0 / count), self.grad_sum)
        else:
            grads = self.grad_sum
        mean_loss = self.loss_sum / count
        mean_loss = ops.depend(mean_loss, ops.assign(self.last_samples, self.sample_count + 0.0))
        mean_loss = ops.depend(mean_loss, ops.assign(self.last_grad_norm,
                                                     grad_ops.global_norm(self.hyper_map, grads)))
        return ops.depend(mean_loss, self.optimizer(grads))


class TrainClear(nn.Cell):
    r"""
    Zeroes the gradient buffers and the window counters in place.

    Unlike the tutorial's version it needs no second full-size copy of the parameters holding zeros.

    Args:
        grad_sum (ParameterTuple): The buffers shared with :class:`TrainForwardBackward`.
        zeros (ParameterTuple, optional): Accepted for compatibility with the tutorial and otherwise unused; if
            given it must match `grad_sum` in shapes. Default: ``None``.

    Inputs:
        None.

    Outputs:
        Tensor, int32 scalar: the number of micro-batches the cleared window held.

    Raises:
        TypeError: If `grad_sum` (or `zeros`, when given) is not a ParameterTuple.
        ValueError: If `zeros` does not match `grad_sum` in shapes.

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
            check_grad_sum(owner, zeros)
            if [p.shape for p in zeros] != [p.shape for p in grad_sum]:
                raise ValueError(f"For '{owner}', 'zeros' must match 'grad_sum' in shapes, but got "
                                 f"{[tuple(p.shape) for p in zeros]}; it is not needed, so pass zeros=None.")
        self.sample_count, self.micro_steps, self.loss_sum = window_state(grad_sum).parameters
        self.hyper_map = ops.HyperMap()

    @jit  # one compiled graph in PYNATIVE_MODE too (an assign per buffer otherwise)
    def construct(self):
        held = self.micro_steps + 0
        cleared = self.hyper_map(grad_ops.clear, self.grad_sum)
        held = ops.depend(held, cleared)
        held = ops.depend(held, ops.assign(self.sample_count, ops.zeros_like(self.sample_count)))
        held = ops.depend(held, ops.assign(self.loss_sum, ops.zeros_like(self.loss_sum)))
        return ops.depend(held, ops.assign(self.micro_steps, ops.zeros_like(self.micro_steps)))
