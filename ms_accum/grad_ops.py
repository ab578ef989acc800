"""Per-parameter helpers applied over gradient buffers with ``ops.HyperMap``.

Each helper is a ``MultitypeFuncGraph`` registered per gradient type, so a new gradient type (for example
sparse rows) is one more registration here and every cell picks it up.
"""
from mindspore import dtype as mstype
from mindspore import ops

accumulate = ops.MultitypeFuncGraph("accumulate")
scale = ops.MultitypeFuncGraph("scale")
clear = ops.MultitypeFuncGraph("clear")


@accumulate.register("Tensor", "Tensor")
def _accumulate_dense(buffer, grad):
    """buffer += grad, in the buffer's dtype."""
    return ops.assign_add(buffer, ops.cast(grad, ops.dtype(buffer)))


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
    dtype = ops.dtype(buffer)
    return ops.assign_add(buffer, ops.cast(grad, dtype) * ops.cast(weight, dtype))


@nonfinite.register("Tensor")
def _nonfinite_dense(grad):
    """1.0 if any element of grad is inf or nan, else 0.0 (IsFinite runs on CPU, GPU and Ascend)."""
    return ops.cast(ops.logical_not(ops.isfinite(grad).all()), mstype.float32)
