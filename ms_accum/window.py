"""The accumulation window: its counters, and the rules every path applies to it.

One home for what belongs to the window, so that the single-device cells and the parallel cells cannot drift
apart:

- :class:`WindowState`, the counters of the open window (items, micro-batches, loss) and of the last window
  applied (items, gradient norm);
- :func:`add_micro_batch`: a micro-batch's gradient enters the buffers weighted by its items (``weighting.py``);
- :func:`finish_gradients`: the gradient the optimizer receives, the buffers divided by the window's items and
  reduced across devices once;
- :func:`reset_window`: buffers and counters back to zero.

The single-device cells share one ``grad_sum`` ParameterTuple, as in the tutorial; their WindowState hangs off
that object (:func:`window_state`), so every cell built on the same ``grad_sum`` sees the same counters.
"""
from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype

from . import grad_ops

_ATTR = "_ms_accum_window"
_NO_ITEMS = 3.0e38  # min_items of an empty window


def _scalar(name, value, dtype=mstype.float32):
    return Parameter(Tensor(value, dtype), name=name, requires_grad=False)


class WindowState:
    """
    Parameters describing the open accumulation window and the last one applied.

    Attributes:
        items (Parameter): float32, the items (samples unless the loss reports its own) added since the last reset.
        micro_steps (Parameter): int32, micro-batches added since the last reset.
        loss_sum (Parameter): float32, sum over those micro-batches of loss * items (unscaled).
        min_items (Parameter): float32, the smallest item count a micro-batch of the window reported.
        last_items (Parameter): float32, items of the last window applied (over all devices).
        last_grad_norm (Parameter): float32, global L2 norm of the last window's gradient.
        options (dict): Choices the cells sharing the window must agree on (``bind``).
    """

    def __init__(self, prefix):
        self.items = _scalar(f"{prefix}.items", 0.0)
        self.micro_steps = _scalar(f"{prefix}.micro_steps", 0, mstype.int32)
        self.loss_sum = _scalar(f"{prefix}.loss_sum", 0.0)
        self.min_items = _scalar(f"{prefix}.min_items", _NO_ITEMS)
        self.last_items = _scalar(f"{prefix}.last_items", 0.0)
        self.last_grad_norm = _scalar(f"{prefix}.last_grad_norm", 0.0)
        self.options = {}

    @property
    def counters(self):
        """The open window's counters, in the order add_micro_batch and reset_window take them."""
        return (self.items, self.micro_steps, self.loss_sum, self.min_items)

    def bind(self, owner, name, value, hint):
        """Record a choice, or raise if a cell on the same buffers chose otherwise."""
        if name not in self.options:
            self.options[name] = value
        elif self.options[name] is not value and self.options[name] != value:
            raise ValueError(f"For '{owner}', '{name}' must match the other cells built on this grad_sum "
                             f"({self.options[name]!r}), but got {value!r}. {hint}")


def buffer_prefix(grad_sum):
    """The name prefix the buffers share ('grad_sum' for the tutorial's clone)."""
    first = grad_sum[0].name
    return first.split(".", 1)[0] if "." in first else "grad_sum"


def window_state(grad_sum):
    """Return the WindowState shared by every cell built on `grad_sum`, creating it on first use."""
    state = getattr(grad_sum, _ATTR, None)
    if state is None:
        state = WindowState(buffer_prefix(grad_sum))
        setattr(grad_sum, _ATTR, state)
    return state


def add_micro_batch(hyper_map, buffers, grads, weight, loss, items, counters):
    """buffers += weight * grads (in the buffers' dtype); the counters take in the micro-batch's `items` and
    `loss`. Returns `loss` once every update is done."""
    item_count, micro_steps, loss_sum, min_items = counters
    added = hyper_map(ops.partial(grad_ops.accumulate_weighted, weight), buffers, grads)
    loss = ops.depend(loss, added)
    loss = ops.depend(loss, ops.assign_add(item_count, items))
    loss = ops.depend(loss, ops.assign_add(micro_steps, ops.scalar_to_tensor(1, mstype.int32)))
    loss = ops.depend(loss, ops.assign(min_items, ops.minimum(min_items, items)))
    return ops.depend(loss, ops.assign_add(loss_sum, ops.cast(loss, mstype.float32) * items))


def check_items(owner, min_items):
    """Raise if a micro-batch of the window reported no items (its loss, a mean over nothing, is meaningless)."""
    smallest = min_items * 1.0  # a Tensor, not the Parameter, so that the message shows its value
    if smallest <= 0.0:
        raise ValueError(f"For '{owner}', 'num_items' returned by the loss network must be > 0 for every "
                         f"micro-batch, but a micro-batch of this window returned {smallest}. Leave out "
                         f"micro-batches with no items, or return the item count of the data you averaged over.")


def mean_loss(counters):
    """The window's mean loss over its items on this device (0 for an empty window)."""
    item_count, _, loss_sum, _ = counters
    return loss_sum / ops.maximum(item_count, 1e-12)


def finish_gradients(hyper_map, buffers, divisor, reducer):
    """The gradient the optimizer receives: buffers / divisor, reduced across devices once; and its global norm."""
    grads = hyper_map(ops.partial(grad_ops.scale, 1.0 / divisor), buffers)
    grads = reducer(grads)
    return grads, grad_ops.global_norm(hyper_map, grads)


def reset_window(hyper_map, buffers, counters, result):
    """Zero the buffers and counters after `result` is computed; returns `result`."""
    item_count, micro_steps, loss_sum, min_items = counters
    result = ops.depend(result, hyper_map(grad_ops.clear, buffers))
    result = ops.depend(result, ops.assign(item_count, ops.zeros_like(item_count)))
    result = ops.depend(result, ops.assign(loss_sum, ops.zeros_like(loss_sum)))
    result = ops.depend(result, ops.assign(min_items, ops.fill(mstype.float32, (), _NO_ITEMS)))
    return ops.depend(result, ops.assign(micro_steps, ops.zeros_like(micro_steps)))
