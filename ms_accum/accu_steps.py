"""TrainAccuStepsCell: accumulation for parallel training, one gradient reduction per window.

The cell runs in one of two modes chosen by its Python attribute ``accumulation``: accumulate (forward,
backward, add into ``accu_grads``; no communication, no optimizer) or update (add the last micro-batch, reduce
once across devices, one optimizer step, reset). In GRAPH_MODE the attribute is frozen into the compiled graph,
so each mode needs its own graph phase: ``set_accumulation`` sets both, and Model_ACCU alternates them.
"""
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.common.initializer import initializer
from mindspore.communication.management import GlobalComm
from mindspore.context import ParallelMode

from . import grad_ops
from ._checks import check_bool, check_positive_int, check_sens

ACCUMULATE_PHASE = "train_accumulate"
UPDATE_PHASE = "train_update"


def float32_buffers(weights, prefix):
    """Zero float32 buffers shaped like `weights`, named '<prefix>.<weight name>'."""
    return ParameterTuple(Parameter(initializer("zeros", p.shape, mstype.float32), name=f"{prefix}.{p.name}",
                                    requires_grad=False) for p in weights)


class AccumulationWindow:
    """
    Mixin for the parallel cells: the window's buffers, counters and the once-per-window reduction.

    It relies on the attributes that :class:`mindspore.nn.TrainOneStepCell` sets (`weights`, `grad_reducer`,
    `reducer_flag`, `parallel_mode`).
    """

    def _init_window(self, owner, accumulation_steps, accu_grads):
        self.owner_name = owner
        self.accumulation_steps = check_positive_int(owner, "accumulation_steps", accumulation_steps)
        self.accumulation = False
        self.accu_grads = accu_grads
        self.accu_samples = Parameter(Tensor(0.0, mstype.float32), name="accu_samples", requires_grad=False)
        self.accu_loss = Parameter(Tensor(0.0, mstype.float32), name="accu_loss", requires_grad=False)
        self.accu_micro_steps = Parameter(Tensor(0, mstype.int32), name="accu_micro_steps", requires_grad=False)
        self.accu_last_samples = Parameter(Tensor(0.0, mstype.float32), name="accu_last_samples",
                                           requires_grad=False)
        self.accu_last_grad_norm = Parameter(Tensor(0.0, mstype.float32), name="accu_last_grad_norm",
                                             requires_grad=False)
        self.window_map = ops.HyperMap()
        self.is_distributed = self.parallel_mode != ParallelMode.STAND_ALONE
        self.device_degree = float(self.degree) if self.reducer_flag else 1.0
        self.window_allreduce = ops.AllReduce(group=GlobalComm.WORLD_COMM_GROUP) if self.is_distributed else None

    def set_accumulation(self, accumulation):
        """
        Choose the mode of the next calls and the graph phase that goes with it.

        Args:
            accumulation (bool): ``True`` to accumulate only, ``False`` to accumulate and update.

        Returns:
            The cell itself.

        Raises:
            TypeError: If `accumulation` is not a bool.
        """
        self.accumulation = check_bool(self.owner_name, "accumulation", accumulation)
        self.phase = ACCUMULATE_PHASE if accumulation else UPDATE_PHASE
        return self

    def _add_micro_batch(self, loss, grads, batch):
        """accu_grads += batch * grads; counters += this micro-batch. Returns loss after the updates."""
        grad_ops.check_scalar_loss(self.owner_name, loss)
        batch_f = ops.scalar_to_tensor(batch, mstype.float32)
        added = self.window_map(ops.partial(grad_ops.accumulate_weighted, batch_f), self.accu_grads, grads)
        loss = ops.depend(loss, added)
        loss = ops.depend(loss, ops.assign_add(self.accu_samples, batch_f))
        loss = ops.depend(loss, ops.assign_add(self.accu_micro_steps, ops.scalar_to_tensor(1, mstype.int32)))
        return ops.depend(loss, ops.assign_add(self.accu_loss, ops.cast(loss, mstype.float32) * batch_f))

    def _window_sum_over_devices(self, value):
        """Sum of a float32 tensor over all devices (the value itself on one device)."""
        if self.is_distributed:
            return self.window_allreduce(value)
        return value

    def _window_samples(self):
        """(samples per device averaged over the data-parallel devices, samples on all of them) in the window."""
        total = self.accu_samples + 0.0
        if self.reducer_flag:
            total = self._window_sum_over_devices(total)
        return ops.maximum(total / self.device_degree, 1.0), total

    def _window_gradients(self, divisor, total_samples):
        """accu_grads / divisor, reduced once across devices: the gradient the optimizer receives.

        Also records the window's samples and the gradient's global norm (accu_last_*) for telemetry.
        """
        grads = self.window_map(ops.partial(grad_ops.scale, 1.0 / divisor), self.accu_grads)
        grads = self.grad_reducer(grads)
        norm = ops.depend(grad_ops.global_norm(self.window_map, grads), ops.assign(self.accu_last_samples,
                                                                                  total_samples))
        return grads, ops.assign(self.accu_last_grad_norm, norm)

    def _reset_window(self, result):
        """Zero the buffers and counters after `result` is computed; returns `result`."""
        result = ops.depend(result, self.window_map(grad_ops.clear, self.accu_grads))
        result = ops.depend(result, ops.assign(self.accu_samples, ops.zeros_like(self.accu_samples)))
        result = ops.depend(result, ops.assign(self.accu_loss, ops.zeros_like(self.accu_loss)))
        return ops.depend(result, ops.assign(self.accu_micro_steps, ops.zeros_like(self.accu_micro_steps)))


class TrainAccuStepsCell(AccumulationWindow, nn.TrainOneStepCell):
    r"""
    A :class:`mindspore.nn.TrainOneStepCell` that accumulates gradients over `accumulation_steps` micro-batches
    and communicates once per window.

    With ``accumulation`` true a call runs forward and backward and adds ``batch * grads`` into ``accu_grads``
    (no gradient reduction, no optimizer). With it false the call also adds its micro-batch, then divides by the
    window's samples, reduces once across devices (``DistributedGradReducer`` in DATA_PARALLEL), takes one
    optimizer step and resets the buffers. The step equals one large-batch step on all samples of the window
    (on all devices). In GRAPH_MODE switch modes with :meth:`set_accumulation`, which also switches the graph
    phase; :class:`Model_ACCU` does this for you.

    Args:
        network (Cell): The loss network; its first input's leading dimension is the micro-batch size and it
            returns the mean loss over the micro-batch.
        optimizer (Cell): The optimizer.
        sens (numbers.Number): Gradient seed, as in :class:`mindspore.nn.TrainOneStepCell`. Default: ``1.0``.
        accumulation_steps (int): Micro-batches per update, >= 1. Default: ``1``.

    Inputs:
        - **\*inputs** (Tuple(Tensor)) - One micro-batch.

    Outputs:
        Tensor: the micro-batch's loss when accumulating; on the update call, the mean loss over the window's
        samples on this device.

    Raises:
        TypeError: If `accumulation_steps` is not an int.
        ValueError: If `accumulation_steps` is < 1, or `sens` is zero or not finite.

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
        >>> loss = cell.set_accumulation(True)(x, y)
        >>> mean_loss = cell.set_accumulation(False)(x, y)
    """

    def __init__(self, network, optimizer, sens=1.0, accumulation_steps=1):
        owner = "TrainAccuStepsCell"
        super().__init__(network, optimizer, check_sens(owner, sens))
        self._init_window(owner, accumulation_steps, self.weights.clone(prefix="accu_grads", init="zeros"))

    def construct(self, *inputs):
        loss = self.network(*inputs)
        seed = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, seed)
        loss = self._add_micro_batch(loss, grads, ops.shape(inputs[0])[0])
        if self.accumulation:
            return loss
        per_device, total = self._window_samples()
        grads, recorded = self._window_gradients(per_device, total)
        mean_loss = ops.depend(self.accu_loss / ops.maximum(self.accu_samples, 1.0), recorded)
        mean_loss = ops.depend(mean_loss, self.optimizer(grads))
        return self._reset_window(mean_loss)
