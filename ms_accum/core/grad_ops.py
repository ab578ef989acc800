"""Per-parameter helpers applied over gradient buffers with ``ops.HyperMap``.

Each helper is a ``MultitypeFuncGraph`` registered per gradient type. The accumulating helpers also take the
``RowTensor`` gradients of sparse lookups (``nn.EmbeddingLookup(sparse=True)``: the touched rows' values and
their indices, not the table's shape) and add the rows into the dense buffer in place with ScatterAdd, so no
dense temporary of the table's size is built per micro-step. The others only ever see the dense buffers.

:func:`clear_in_turn` zeroes the buffers one parameter after another, so that the window's end holds one
parameter's zeros at a time, not a copy of them all.
"""
from mindspore import dtype as mstype
from mindspore import Tensor, context, ops
from mindspore.ops import constexpr

# The zero each buffer is filled with, cast to the buffer's type: a Tensor made once, where ops.zeros and ops.fill
# (deprecated in MindSpore 2.10) are functions MindSpore compiles at every use (docs/performance.md, Compiling
# ms_accum's graphs).
_ZERO = Tensor(0, mstype.float32)
_fill = ops.FillV2()

scale = ops.MultitypeFuncGraph("scale")


def _check_dense_shape(buffer, grad):
    """A dense gradient must have its buffer's shape; a mismatch is a sparse gradient that lost its indices."""
    if buffer.shape != grad.shape:
        raise ValueError(f"A gradient of shape {grad.shape} cannot be added to its buffer of shape {buffer.shape}: "
                         f"it is the values of a sparse gradient (for example nn.EmbeddingLookup(sparse=True)), "
                         f"whose row indices MindSpore drops when the step runs eagerly (PYNATIVE_MODE with "
                         f"MS_JIT=0, or a network that could not be compiled). Run sparse models compiled: unset "
                         f"MS_JIT=0, or use "
                         f"GRAPH_MODE (mindspore.set_context(mode=mindspore.GRAPH_MODE)).")


@scale.register("Tensor", "Tensor")
def _scale_dense(factor, grad):
    """grad * factor, in the gradient's dtype."""
    return grad * ops.cast(factor, ops.dtype(grad))


scale_in_place = ops.MultitypeFuncGraph("scale_in_place")


@scale_in_place.register("Tensor", "Tensor")
def _scale_buffer_in_place(factor, buffer):
    """buffer *= factor, in place (each parameter's product is a temporary only until it is written back)."""
    return ops.assign(buffer, buffer * ops.cast(factor, ops.dtype(buffer)))


def clear_in_turn(buffers, after):
    """
    buffers = 0 in place, one parameter after another (each one's zeros made once the previous buffer is
    written), so that one parameter's zeros exist at a time: zeroed through ``HyperMap``, every buffer's zeros
    were built first (docs/performance_history.md, Memory: what changed and what was tried). Zeros, not buffer -
    buffer: an inf or a NaN left by a skipped window must be cleared too. `after`: a Tensor computed when the graph
    runs, which the first buffer's zeros wait for; zeros that depend on nothing are folded into a constant of the
    buffer's shape, held by the compiled graph for good (the first parameter's, often the largest: an embedding
    table).

    Returns:
        Tensor, to depend on once every buffer is zero.
    """
    done = after
    for buffer in buffers:
        # the dependency through a scalar, never through a buffer: a dependency on a Parameter's value made
        # MindSpore keep loaded copies of the buffers (docs/performance_history.md, Memory: what changed and what
        # was tried)
        zero = ops.cast(ops.depend(_ZERO, done), ops.dtype(buffer))
        done = ops.assign(buffer, _fill(buffer.shape, zero))
    return done


_row_dots = ops.BatchMatMul(transpose_b=True)
_ROW = 4096  # elements a row of the dot products holds at most


@constexpr
def _rows_of(shape):
    """A (rows, 1, columns) view of a tensor of `shape` with at most :data:`_ROW` columns (its last dimension when
    it fits, else the largest divisor of its size that does), or None if its size has no divisor from 64 to
    :data:`_ROW`."""
    size = 1
    for dim in shape:
        size *= dim
    if size == 0:
        return None
    if size <= _ROW:
        return (1, 1, size)
    if len(shape) > 1 and 64 <= shape[-1] <= _ROW:
        return (size // shape[-1], 1, shape[-1])
    for columns in range(_ROW, 63, -1):
        if size % columns == 0:
            return (size // columns, 1, columns)
    return None


accumulate = ops.MultitypeFuncGraph("accumulate")
accumulate_weighted = ops.MultitypeFuncGraph("accumulate_weighted")
nonfinite = ops.MultitypeFuncGraph("nonfinite")


@accumulate.register("Tensor", "Tensor")
def _accumulate_dense(buffer, grad):
    """buffer += grad, in the buffer's dtype, in place."""
    _check_dense_shape(buffer, grad)
    return ops.assign_add(buffer, ops.cast(grad, ops.dtype(buffer)))


@accumulate.register("Tensor", "RowTensor")
def _accumulate_rows(buffer, grad):
    """buffer[indices] += values, in place, in the buffer's dtype."""
    return ops.scatter_add(buffer, grad.indices, ops.cast(grad.values, ops.dtype(buffer)))


_scaled_add = ops.ApplyMomentum()


@constexpr
def _fused_scaled_add():
    """Whether :func:`_accumulate_weighted_dense` adds through ApplyMomentum: on CPU and GPU, whose kernels update
    the accumulation and then the variable from it, element by element; the product elsewhere (Ascend's kernel was
    not read nor run here)."""
    return context.get_context("device_target") in ("CPU", "GPU")


@accumulate_weighted.register("Tensor", "Tensor", "Tensor")
def _accumulate_weighted_dense(weight, buffer, grad):
    """buffer += grad * weight, in the buffer's dtype (float32 buffers keep float16 grads exact), in place.

    ``buffer + grad * weight`` builds the product, a temporary of the parameter's size; in a user's compiled step,
    where every gradient of the micro-batch is alive at once, that is most of a copy of the parameters on a model
    whose largest parameter is most of it. ApplyMomentum with the buffer as both its variable and its
    accumulation adds without one: accumulation = accumulation / weight + grad, then variable -= accumulation *
    (1 - weight), so buffer = buffer + grad * weight (with weight 1 exactly buffer + grad)."""
    _check_dense_shape(buffer, grad)
    dtype = ops.dtype(buffer)
    weight = ops.cast(weight, dtype)
    grad = ops.cast(grad, dtype)
    if _fused_scaled_add():
        return _scaled_add(buffer, buffer, 1.0 - weight, grad, 1.0 / weight)
    return ops.assign_add(buffer, grad * weight)


@accumulate_weighted.register("Tensor", "Tensor", "RowTensor")
def _accumulate_weighted_rows(weight, buffer, grad):
    """buffer[indices] += values * weight, in place, in the buffer's dtype."""
    dtype = ops.dtype(buffer)
    return ops.scatter_add(buffer, grad.indices, ops.cast(grad.values, dtype) * ops.cast(weight, dtype))


def element_sum(values):
    """The sum of every element of `values`: over each row of a 2-D view first, then over the rows. MindSpore
    2.10's CPU ReduceSum over every axis of a multi-dimensional tensor is far slower than over one axis, and the
    gradient norm sums every parameter once per window (docs/performance_history.md, The distance to plain
    training, and its cause)."""
    if values.ndim > 1 and values.size > 0:
        values = ops.reduce_sum(values.reshape(values.shape[0], -1), 1)
    return ops.reduce_sum(values)


@nonfinite.register("Tensor")
def _nonfinite_dense(grad):
    """1.0 if any element of grad is inf or nan, else 0.0: a (rows, columns) view of grad times a column of zeros
    (one MatMul, no temporary of grad's size) is 0 in every row that is finite and nan in any other (0 * inf and
    0 * nan are nan), and large finite values cannot overflow it; IsFinite runs on CPU, GPU and Ascend."""
    grad = ops.cast(grad, mstype.float32)
    rows = _rows_of(grad.shape)
    if rows is None:
        sums = element_sum(grad - grad)
    else:
        sums = ops.reduce_sum(ops.matmul(grad.reshape(rows[0], rows[2]), ops.zeros((rows[2], 1), mstype.float32)))
    return ops.cast(ops.logical_not(ops.isfinite(sums)), mstype.float32)


squared_sum = ops.MultitypeFuncGraph("squared_sum")


@squared_sum.register("Tensor")
def _squared_sum_dense(grad):
    """sum(grad ** 2) in float32, without a temporary of grad's size: each row of a (rows, 1, columns) view dotted
    with itself (BatchMatMul), then the rows summed. ``grad * grad`` is a temporary as large as the parameter, which
    at a window's end sat beside the buffers: most of a copy of the parameters on a model whose largest parameter
    is most of it. Rows of a few thousand elements keep the float32 sum close to float64's, where one dot over
    millions drifts (docs/performance_history.md, At size). A size without a divisor from 64 to 4096 falls back to
    the temporary."""
    grad = ops.cast(grad, mstype.float32)
    rows = _rows_of(grad.shape)
    if rows is None:
        return element_sum(grad * grad)
    rows = grad.reshape(rows)
    return ops.reduce_sum(_row_dots(rows, rows))


def sum_over(hyper_map, func, tensors, sparse=False):
    """The sum over `tensors` of the scalar that `func` gives for each (see :func:`add_up`)."""
    return add_up(hyper_map(func, tensors), sparse)


def add_up(values, sparse=False):
    """The sum of a tuple of scalars, in one AddN: a chain of additions compiled slower at a window's end over many
    parameters (docs/performance_history.md, Start-up: where the time goes). With `sparse` (the scalars of RowTensor
    gradients, for which the function that gave them raises its own error) a chain: AddN refuses the values'
    undetermined type before that error is raised."""
    if len(values) == 1:
        return values[0]
    if not sparse:
        return ops.addn(values)
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def global_norm(hyper_map, grads):
    """The L2 norm of all gradients together (the figure gradient clipping uses)."""
    return ops.sqrt(sum_over(hyper_map, squared_sum, grads))
