"""Per-parameter helpers applied over gradient buffers with ``ops.HyperMap``.

Each helper is a ``MultitypeFuncGraph`` registered per gradient type. The accumulating helpers also take the
``RowTensor`` gradients of sparse lookups (``nn.EmbeddingLookup(sparse=True)``: the touched rows' values and
their indices, not the table's shape) and add the rows into the dense buffer in place with ScatterAdd, so no
dense temporary of the table's size is built per micro-step. The others only ever see the dense buffers.
"""
from mindspore import dtype as mstype
from mindspore import ops

scale = ops.MultitypeFuncGraph("scale")
clear = ops.MultitypeFuncGraph("clear")


def _check_dense_shape(buffer, grad):
    """A dense gradient must have its buffer's shape; a mismatch is a sparse gradient that lost its indices."""
    if buffer.shape != grad.shape:
        raise ValueError(f"A gradient of shape {grad.shape} cannot be added to its buffer of shape {buffer.shape}: "
                         f"it is the values of a sparse gradient (for example nn.EmbeddingLookup(sparse=True)), "
                         f"whose row indices MindSpore 2.10 drops in PYNATIVE_MODE. Run sparse models in "
                         f"GRAPH_MODE (mindspore.set_context(mode=mindspore.GRAPH_MODE)).")


@scale.register("Tensor", "Tensor")
def _scale_dense(factor, grad):
    """grad * factor, in the gradient's dtype."""
    return grad * ops.cast(factor, ops.dtype(grad))


@clear.register("Tensor")
def _clear_dense(buffer):
    """buffer = 0 in place, without keeping a second full-size copy of zeros."""
    return ops.assign(buffer, ops.zeros_like(buffer))


accumulate_weighted = ops.MultitypeFuncGraph("accumulate_weighted")
nonfinite = ops.MultitypeFuncGraph("nonfinite")


@accumulate_weighted.register("Tensor", "Tensor", "Tensor")
def _accumulate_weighted_dense(weight, buffer, grad):
    """buffer += grad * weight, computed in the buffer's dtype (float32 buffers keep float16 grads exact)."""
    _check_dense_shape(buffer, grad)
    dtype = ops.dtype(buffer)
    return ops.assign_add(buffer, ops.cast(grad, dtype) * ops.cast(weight, dtype))


@accumulate_weighted.register("Tensor", "Tensor", "RowTensor")
def _accumulate_weighted_rows(weight, buffer, grad):
    """buffer[indices] += values * weight, in place, in the buffer's dtype."""
    dtype = ops.dtype(buffer)
    return ops.scatter_add(buffer, grad.indices, ops.cast(grad.values, dtype) * ops.cast(weight, dtype))


@nonfinite.register("Tensor")
def _nonfinite_dense(grad):
    """1.0 if any element of grad is inf or nan, else 0.0 (IsFinite runs on CPU, GPU and Ascend)."""
    return ops.cast(ops.logical_not(ops.isfinite(grad).all()), mstype.float32)


squared_sum = ops.MultitypeFuncGraph("squared_sum")


@squared_sum.register("Tensor")
def _squared_sum_dense(grad):
    """sum(grad ** 2) in float32."""
    grad = ops.cast(grad, mstype.float32)
    return ops.reduce_sum(grad * grad)


def sum_over(hyper_map, func, tensors):
    """The sum over `tensors` of the scalar that `func` gives for each."""
    values = hyper_map(func, tensors)
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def global_norm(hyper_map, grads):
    """The L2 norm of all gradients together (the figure gradient clipping uses)."""
    return ops.sqrt(sum_over(hyper_map, squared_sum, grads))
