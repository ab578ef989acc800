"""TrainAccuStepsCell: accumulation for parallel training, one gradient reduction per window.

A call runs in one of two modes: accumulate (forward, backward, add into ``accu_grads``; no communication, no
optimizer) or update (add the last micro-batch, reduce once across devices, one optimizer step, reset). In
GRAPH_MODE the mode is frozen into the compiled graph, so each mode has its own graph phase; whichever way the
mode is chosen (the ``accumulation`` attribute, :meth:`set_accumulation`, or left to the cell, which updates
every ``accumulation_steps``-th call), the matching phase is selected right before the call.
"""
from mindspore import ParameterTuple, nn, ops
from mindspore import Parameter
from mindspore import dtype as mstype
from mindspore.common.initializer import initializer
from mindspore.communication.management import GlobalComm
from mindspore.context import ParallelMode

from . import window
from ._checks import check_bool, check_cell, check_optimizer, check_positive_int, check_sens
from .weighting import LossAndItems, forget_failed_forward, loss_sens

ACCUMULATE_PHASE = "train_accumulate"
UPDATE_PHASE = "train_update"
WINDOW_PREFIX = "accu_window"


def float32_buffers(weights, prefix):
    """Zero float32 buffers shaped like `weights`, named '<prefix>.<weight name>'."""
    return ParameterTuple(Parameter(initializer("zeros", p.shape, mstype.float32), name=f"{prefix}.{p.name}",
                                    requires_grad=False) for p in weights)


def check_cell_arguments(owner, network, optimizer):
    """The checks both parallel cells make before MindSpore's own constructor sees the arguments."""
    check_cell(owner, "network", network)
    check_optimizer(owner, optimizer)


class AccumulationWindow:
    """
    Mixin for the parallel cells: the window's buffers and counters, the mode switch, and the once-per-window
    reduction.

    It relies on the attributes that :class:`mindspore.nn.TrainOneStepCell` sets (`weights`, `grad_reducer`,
    `reducer_flag`, `parallel_mode`).
    """

    def _init_window(self, owner, accumulation_steps, accu_grads):
        self.owner_name = owner
        self.accumulation_steps = check_positive_int(owner, "accumulation_steps", accumulation_steps)
        self._mode = None            # None: automatic; True/False: chosen by the user or Model_ACCU
        self._accumulate_now = False  # what the next call does; read by construct (frozen per graph phase)
        self._auto_held = None       # micro-batches in the open window as the automatic mode counts them
        self.accu_grads = accu_grads
        state = window.WindowState(WINDOW_PREFIX)
        self.accu_items, self.accu_micro_steps, self.accu_loss, self.accu_min_items = state.counters
        self.accu_last_items, self.accu_last_grad_norm = state.last_items, state.last_grad_norm
        self.window_map = ops.HyperMap()
        self.is_distributed = self.parallel_mode != ParallelMode.STAND_ALONE
        self.device_degree = float(self.degree) if self.reducer_flag else 1.0
        self.window_allreduce = ops.AllReduce(group=GlobalComm.WORLD_COMM_GROUP) if self.is_distributed else None

    # ------------------------------------------------------------------ the mode of the next calls
    @property
    def accumulation(self):
        """
        The mode of the next calls: ``True`` accumulates only, ``False`` accumulates and updates, ``None``
        (default) lets the cell decide: it accumulates ``accumulation_steps - 1`` calls and updates on the next.
        Setting it selects the matching compiled graph in GRAPH_MODE.
        """
        return self._mode

    @accumulation.setter
    def accumulation(self, value):
        if value is not None:
            check_bool(self.owner_name, "accumulation", value)
        self._mode = value
        self._auto_held = None
        self._select(self._decide())

    def set_accumulation(self, accumulation):
        """
        Choose the mode of the next calls, and the graph phase that goes with it.

        Args:
            accumulation (bool): ``True`` to accumulate only, ``False`` to accumulate and update, ``None`` to let
                the cell update every `accumulation_steps`-th call.

        Returns:
            The cell itself.

        Raises:
            TypeError: If `accumulation` is not a bool or None.
        """
        self.accumulation = accumulation
        return self

    def set_train(self, mode=True):
        """As :meth:`mindspore.nn.Cell.set_train`, keeping the graph phase of the chosen mode."""
        super().set_train(mode)
        if mode:
            self._select(self._accumulate_now)
        return self

    def _decide(self):
        """Whether the next call accumulates only."""
        if self._mode is not None:
            return self._mode
        if self._auto_held is None:  # unknown after an explicit mode or a resume: ask the device once
            self._auto_held = int(self.accu_micro_steps.asnumpy())
        return self._auto_held + 1 < self.accumulation_steps

    def _select(self, accumulate):
        self._accumulate_now = accumulate
        self.phase = ACCUMULATE_PHASE if accumulate else UPDATE_PHASE

    def __call__(self, *args, **kwargs):
        accumulate = self._decide()
        self._select(accumulate)
        try:
            out = super().__call__(*args, **kwargs)
        except BaseException:
            self._auto_held = None
            forget_failed_forward(self.network)
            raise
        if self._mode is None:
            self._auto_held = self._auto_held + 1 if accumulate else 0
        return out

    # ------------------------------------------------------------------ the window, in the graph
    def _window_counters(self):
        return (self.accu_items, self.accu_micro_steps, self.accu_loss, self.accu_min_items)

    def _add_micro_batch(self, loss, items, grads):
        """accu_grads += items * grads (float32 for the loss-scale cell); counters take in the micro-batch."""
        return window.add_micro_batch(self.window_map, self.accu_grads, grads, items, loss, items,
                                      self._window_counters())

    def _window_sum_over_devices(self, value):
        """Sum of a float32 tensor over all devices (the value itself on one device)."""
        if self.is_distributed:
            return self.window_allreduce(value)
        return value

    def _window_gradients(self, unscale=1.0):
        """The gradient the optimizer receives: the buffers over the window's items on all devices (and over the
        loss scale), reduced once. Records the window's items and gradient norm (accu_last_*) for telemetry.

        Returns (grads, the window's mean loss on this device once the records are written).
        """
        window.check_items(self.owner_name, self.accu_min_items)
        total = self.accu_items + 0.0
        if self.reducer_flag:
            total = self._window_sum_over_devices(total)
        per_device = ops.maximum(total / self.device_degree, 1e-12)  # the reducer averages over devices
        grads, norm = window.finish_gradients(self.window_map, self.accu_grads, per_device * unscale,
                                              self.grad_reducer)
        loss = ops.depend(window.mean_loss(self._window_counters()), ops.assign(self.accu_last_items, total))
        return grads, ops.depend(loss, ops.assign(self.accu_last_grad_norm, norm))

    def _reset_window(self, result):
        """Zero the buffers and counters after `result` is computed; returns `result`."""
        return window.reset_window(self.window_map, self.accu_grads, self._window_counters(), result)


class TrainAccuStepsCell(AccumulationWindow, nn.TrainOneStepCell):
    r"""
    A :class:`mindspore.nn.TrainOneStepCell` that accumulates gradients over `accumulation_steps` micro-batches
    and communicates once per window.

    An accumulating call runs forward and backward and adds the micro-batch's gradient, weighted by its samples
    or items, into ``accu_grads`` (no gradient reduction, no optimizer). An updating call also adds its
    micro-batch, then divides by the window's items on all devices, reduces once across devices
    (``DistributedGradReducer`` in DATA_PARALLEL), takes one optimizer step and resets the buffers. The step
    equals one large-batch step on all samples (or items) of the window, on all devices.

    Which calls update: by default every `accumulation_steps`-th call (a plain loop ``for x, y in data: cell(x,
    y)`` is right); or the mode set with ``cell.accumulation = flag`` or :meth:`set_accumulation` (``None``
    returns to the default). In GRAPH_MODE each mode has its own compiled graph, selected before every call.
    :class:`Model_ACCU` sets the mode itself.

    What a micro-batch weighs is decided as in :class:`TrainForwardBackward`: its samples (the inputs' common
    leading dimension), or ``num_items`` when the loss network returns ``(loss, num_items)``.

    Args:
        network (Cell): The loss network, returning the mean loss over its micro-batch or
            ``(loss, num_items)``.
        optimizer (Cell): The optimizer.
        sens (numbers.Number): Gradient seed, as in :class:`mindspore.nn.TrainOneStepCell`. Default: ``1.0``.
        accumulation_steps (int): Micro-batches per update, >= 1. Default: ``1``.

    Inputs:
        - **\*inputs** (Tuple(Tensor)) - One micro-batch.

    Outputs:
        Tensor: the micro-batch's loss when accumulating; on the update call, the mean loss over the window's
        samples or items on this device.

    Raises:
        TypeError: If `network` is not a Cell, `optimizer` is not an optimizer, or `accumulation_steps` is not an
            integer.
        ValueError: If `accumulation_steps` is < 1, or `sens` is zero or not finite; when called, as listed for
            :class:`TrainForwardBackward` and :class:`TrainOptim`.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import Tensor, nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), optimizer,
        ...                                    accumulation_steps=2)
        >>> x, y = Tensor(np.ones((8, 4), np.float32)), Tensor(np.zeros((8, 2), np.float32))
        >>> loss = cell(x, y)          # accumulates
        >>> mean_loss = cell(x, y)     # updates: the mean loss over both micro-batches
    """

    def __init__(self, network, optimizer, sens=1.0, accumulation_steps=1):
        owner = "TrainAccuStepsCell"
        check_cell_arguments(owner, network, optimizer)
        super().__init__(LossAndItems(owner, network), optimizer, check_sens(owner, sens))
        self._init_window(owner, accumulation_steps, self.weights.clone(prefix="accu_grads", init="zeros"))

    def construct(self, *inputs):
        loss, items = self.network(*inputs)
        grads = self.grad(self.network, self.weights)(*inputs, loss_sens(loss, items, self.sens))
        loss = self._add_micro_batch(loss, items, grads)
        if self._accumulate_now:
            return loss
        grads, mean_loss = self._window_gradients()
        mean_loss = ops.depend(mean_loss, self.optimizer(grads))
        return self._reset_window(mean_loss)
