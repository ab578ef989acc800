"""The accumulation window: its counters, and the rules every path applies to it.

One home for what belongs to the window, so that the single-device cells and the parallel cells cannot drift
apart:

- :class:`WindowState`, the counters of the open window (items, micro-batches, loss) and of the last window
  applied (items, gradient norm);
- :func:`add_micro_batch`: a micro-batch's gradient enters the buffers weighted by its items (``weighting.py``);
- :func:`finish_gradients`: the gradient the optimizer receives, the buffers divided by the window's items (and
  the loss scale), reduced across devices once, then clipped by its global norm;
- :func:`buffers_overflow`: an overflow anywhere in the window skips its whole update;
- :func:`reset_window`: buffers and counters back to zero.

The single-device cells share one ``grad_sum`` ParameterTuple, as in the tutorial; their WindowState hangs off
that object (:func:`window_state`), so every cell built on the same ``grad_sum`` sees the same counters.
"""
import math

from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype

from . import grad_ops
from . import noise_scale
from . import runtime_checks

_ATTR = "_ms_accum_window"
_NO_ITEMS = 3.0e38  # min_items of an empty window
# Constants of the window's graphs, Tensors made once: ops.fill, ops.scalar_to_tensor and ops.zeros_like are
# functions MindSpore compiles at every use (docs/performance.md, Compiling ms_accum's graphs).
_ZERO = Tensor(0.0, mstype.float32)
_NO_MICRO_BATCHES = Tensor(0, mstype.int32)
_ONE_MICRO_BATCH = Tensor(1, mstype.int32)
_EMPTY_MIN_ITEMS = Tensor(_NO_ITEMS, mstype.float32)
_REFUSED_ITEMS = Tensor(-math.inf, mstype.float32)  # an item count that is NaN or infinite, refused at the window's end
SKIP_HISTORY_BITS = 24  # windows a skip history holds: integers below 2**24 are exact in float32
_HISTORY_MODULUS = float(2 ** SKIP_HISTORY_BITS)


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
        items_unit (Parameter): float32, the items one unit of the buffers stands for: they hold the sum over the
            window's micro-batches of items * gradient, divided by it (set at the window's first micro-batch by
            ``WindowEngine._item_ratio``; 1.0 where the front end weighs by the items themselves).
        last_items (Parameter): float32, items of the last window applied (over all devices).
        last_grad_norm (Parameter): float32, global L2 norm of the last window's gradient, before clipping.
        last_clipped (Parameter): float32, 1.0 if the last window's gradient was clipped, else 0.0.
        skipped (Parameter): float32, windows skipped so far (a loss-scale overflow, or a non-finite gradient).
        nonfinite_streak (Parameter): float32, windows skipped in a row up to the last one (0 after a window
            applied).
        skip_history (Parameter): float32, the last :data:`SKIP_HISTORY_BITS` windows as bits, the last window's
            in the lowest (1: skipped), so a trainer reads it once every few windows.
        options (dict): Choices the cells sharing the window must agree on (``bind``).
    """

    def __init__(self, prefix):
        self.items = _scalar(f"{prefix}.items", 0.0)
        self.micro_steps = _scalar(f"{prefix}.micro_steps", 0, mstype.int32)
        self.loss_sum = _scalar(f"{prefix}.loss_sum", 0.0)
        self.min_items = _scalar(f"{prefix}.min_items", _NO_ITEMS)
        self.items_unit = _scalar(f"{prefix}.items_unit", 1.0)
        self.last_items = _scalar(f"{prefix}.last_items", 0.0)
        self.last_grad_norm = _scalar(f"{prefix}.last_grad_norm", 0.0)
        self.last_clipped = _scalar(f"{prefix}.last_clipped", 0.0)
        self.skipped = _scalar(f"{prefix}.skipped_windows", 0.0)
        self.nonfinite_streak = _scalar(f"{prefix}.nonfinite_streak", 0.0)
        self.skip_history = _scalar(f"{prefix}.skip_history", 0.0)
        self.options = {}
        self.prefix = prefix
        self.noise = None  # a NoiseState once a cell measures the noise scale (see noise_state)
        self.verified = False  # a cell with the optimizer checked the buffers are separate from its parameters
        self.loss_scale = None  # (update cell or None, the scale Parameter), shared by the cells on the buffers
        self.applied = False  # TrainOptim applied the buffers and TrainClear has not cleared them since (host-side)
        self.weights = None  # the Parameters the buffers hold the gradients of: the first optimizer's (host-side)
        self.forward_built = False  # a TrainForwardBackward adds into the buffers (host-side)

    @property
    def last(self):
        """The records of the last window applied: items, gradient norm, whether it was clipped."""
        return (self.last_items, self.last_grad_norm, self.last_clipped)

    @property
    def skips(self):
        """The skipped windows' records, in the order :func:`count_skip` takes them."""
        return (self.skipped, self.nonfinite_streak, self.skip_history)

    @property
    def counters(self):
        """The open window's counters, in the order add_micro_batch and reset_window take them."""
        return (self.items, self.micro_steps, self.loss_sum, self.min_items)

    def noise_state(self, mode):
        """The NoiseState (measuring in `mode`) of the cells sharing this window, created on first use."""
        if self.noise is None:
            self.noise = noise_scale.NoiseState(self.prefix, mode)
        return self.noise

    def bind(self, owner, name, value, hint):
        """Record a choice, or raise if a cell on the same buffers chose otherwise."""
        if name not in self.options:
            self.options[name] = value
        elif self.options[name] is not value:  # bools and None are singletons; objects must be the same
            bound = self.options[name]
            got = _describe(value)
            if type(value) is type(bound) and value is not None and not isinstance(value, (bool, str)):
                got = f"another {type(value).__name__} object, not the same one"
            raise ValueError(f"For '{owner}', '{name}' must match the other cells built on this grad_sum "
                             f"({_describe(bound)}), but got {got}. {hint}")

    def bind_weights(self, owner, optimizer):
        """Record the Parameters the buffers hold the gradients of, `optimizer`'s, or raise if another cell on the
        same buffers was built with an optimizer of other Parameters: the buffers' gradients would be applied to
        Parameters they are not the gradients of (optimizers over the same Parameters are taken)."""
        weights = tuple(optimizer.parameters)
        if self.weights is None:
            self.weights = weights
        elif len(weights) != len(self.weights) or any(a is not b for a, b in zip(weights, self.weights)):
            raise ValueError(f"For '{owner}', 'optimizer' must update the Parameters whose gradients the buffers "
                             f"'{self.prefix}' hold, those of the other cells built on this grad_sum "
                             f"({_names(self.weights)}), but it updates other Parameters ({_names(weights)}). Build "
                             f"TrainForwardBackward and TrainOptim on one grad_sum = "
                             f"optimizer.parameters.clone(prefix='grad_sum', init='zeros') with optimizers over the "
                             f"same Parameters.")

    def check_cleared(self, owner):
        """Raise if :class:`TrainOptim` applied the buffers and :class:`TrainClear` has not cleared them since:
        adding to them, or applying them again, would apply the old window's gradients a second time. Set by the
        cells' Python calls, so it costs the device nothing."""
        if self.applied:
            raise ValueError(f"For '{owner}', the buffers '{self.prefix}' must be cleared after the window "
                             f"TrainOptim applied, but TrainClear was not called since: they still hold that "
                             f"window's gradients, which would be applied again. Call TrainClear(grad_sum)() right "
                             f"after every TrainOptim call.")


def _names(parameters, shown=3):
    """The first `shown` of `parameters`' names, and how many there are."""
    names = ", ".join(repr(p.name) for p in parameters[:shown])
    return f"{len(parameters)} Parameter{'s' if len(parameters) != 1 else ''}: {names}" \
        f"{', ...' if len(parameters) > shown else ''}"


def _describe(value):
    return repr(value) if value is None or isinstance(value, (bool, str)) else f"a {type(value).__name__} object"


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


def add_micro_batch(hyper_map, buffers, grads, weight, loss, items, counters, noise_sums=None, measure=True,
                    noise_weights=None):
    """buffers += weight * grads (in the buffers' dtype; `weight` None: the gradients as they are); the counters
    take in the micro-batch's `items` and `loss` (None: no loss to record); with the noise scale measured,
    `noise_sums` (a NoiseState's micro_sq, measured_items, measured) take in the micro-batch when it is measured
    (`measure`: True, False, or None for the window's first only: ``noise_scale.add_micro_sq``), weighted by
    `noise_weights` (what its squared gradient norm and its measured items are multiplied by). Returns `loss` (or
    `items`) once every update is done."""
    item_count, micro_steps, loss_sum, min_items = counters
    if weight is None:
        added = hyper_map(grad_ops.accumulate, buffers, grads)
    else:
        added = hyper_map(ops.partial(grad_ops.accumulate_weighted, weight), buffers, grads)
    out = ops.depend(items if loss is None else loss, added)
    if noise_sums is not None:
        out = ops.depend(out, noise_scale.add_micro_sq(hyper_map, noise_sums, grads, noise_weights, micro_steps == 0,
                                                       measure))
    out = ops.depend(out, ops.assign_add(item_count, items))
    out = ops.depend(out, ops.assign_add(micro_steps, _ONE_MICRO_BATCH))
    # a NaN or infinite count is taken as -inf, so that the window's end refuses it as it refuses one <= 0 (checked
    # here, the window's end unchanged: reading the sum there too brought back a copy of the first parameter)
    counted = ops.select(ops.isfinite(items), items, _REFUSED_ITEMS)
    out = ops.depend(out, ops.assign(min_items, ops.minimum(min_items, counted)))
    if loss is None:
        return out
    return ops.depend(out, ops.assign_add(loss_sum, ops.cast(loss, mstype.float32) * items))


def check_items(owner, refused, smallest, source="returned by the loss network", rebuild="new cells"):
    """
    Raise if `refused`: a micro-batch of the window reported no items or a count that is not finite (`smallest`, a
    Tensor: the smallest count, -inf for a NaN or an infinite one: :func:`add_micro_batch`), so its loss, a mean
    over nothing, or its weight is meaningless. Called where the optimizer step is not taken (the engine's skip
    branch, or a branch of its own), so the window is not applied; from the skip branch, the buffers are already
    divided and the window's records written. The error ends training with these cells: in GRAPH_MODE (and for
    jit-compiled cells) MindSpore refuses to run a graph again after a runtime error in it.
    """
    if refused:
        raise ValueError(f"For '{owner}', 'num_items' {source} must be a finite number > 0 for every micro-batch, "
                         f"but a micro-batch of this window had {smallest} (-inf stands for a NaN or an infinite "
                         f"count). Leave out micro-batches with no items, or give the item count of the data the loss "
                         f"averaged over. The window was not applied; to go on, save the network and build {rebuild}.")


def mean_loss(counters):
    """The window's mean loss over its items on this device (0 for an empty window)."""
    item_count, _, loss_sum, _ = counters
    return loss_sum / ops.maximum(item_count, 1e-12)


def finish_gradients(hyper_map, buffers, divisor, reducer, clip_norm, last, items, in_place=True,
                     across_devices=False):
    """
    The gradient the optimizer receives: buffers / divisor (the buffers themselves when `divisor` is None: the raw
    sum), reduced across devices once, then scaled down so that its global norm is at most `clip_norm` (a float,
    or None for no clipping) as ``ops.clip_by_global_norm`` does. Records the window in `last` (a WindowState's
    ``last``): its `items`, the gradient's global norm before clipping, and whether it was clipped.

    With `in_place` the buffers are scaled in place and handed on as they are, for a window reset right after. On
    one device (`across_devices` False) every buffer is read once for the norm (``grad_ops.squared_sum``, no
    temporary of its size), then multiplied in place once by the division and the clipping together: the window's
    end then holds nothing of a buffer's size beside the buffers, as the tutorial's optimizer step on its buffers
    (a divided copy, or a read after the write, which MindSpore copies, each held one more copy of the
    parameters: docs/performance_history.md, At size). The norm is taken from the undivided sums, so a window
    whose squared sums overflow float32 (buffer elements near 1.8e19) counts as not finite.

    Returns (grads, a Tensor to depend on once the records are written).
    """
    last_items, last_grad_norm, last_clipped = last
    if in_place and not across_devices:
        inverse = 1.0 if divisor is None else 1.0 / divisor
        norm = grad_ops.global_norm(hyper_map, buffers) * inverse
        factor = None if divisor is None else inverse
        clipped = _ZERO
        if clip_norm is not None:
            clip = clip_norm / ops.maximum(norm, clip_norm)
            factor = clip if factor is None else factor * clip
            clipped = ops.cast(norm > clip_norm, mstype.float32)
        grads = buffers  # the raw sum, unclipped: nothing to multiply
        if factor is not None:
            # handed on through a depend on the division: ordered only through the records instead (the branch
            # waits for them), the optimizer's read of the buffers after their in-place write cost a copy of the
            # first buffer (an embedding table's: benchmarks/memory.py --model text, 332 MiB against 283), for
            # 0.15 s less compiling of the tuple into the branch (docs/performance_history.md, Memory: the
            # division's order)
            grads = ops.depend(buffers, hyper_map(ops.partial(grad_ops.scale_in_place, factor), buffers))
        # no reducer on one device: its Identity, called from a step run from Python (Accumulator.flush in
        # GRAPH_MODE), compiled a graph of its own, which MindSpore refused to run on the buffers (Parameters)
    else:
        if divisor is None:  # nothing to divide (MindSpore 2.7.0 fails at run time on an in-place multiply by 1)
            grads = reducer(buffers)
        elif in_place:
            grads = reducer(ops.depend(buffers, hyper_map(ops.partial(grad_ops.scale_in_place, 1.0 / divisor),
                                                          buffers)))
        else:
            grads = reducer(hyper_map(ops.partial(grad_ops.scale, 1.0 / divisor), buffers))
        norm = grad_ops.global_norm(hyper_map, grads)
        clipped = _ZERO
        if clip_norm is not None:
            grads = hyper_map(ops.partial(grad_ops.scale, clip_norm / ops.maximum(norm, clip_norm)), grads)
            clipped = ops.cast(norm > clip_norm, mstype.float32)
    recorded = ops.depend(ops.assign(last_items, items), ops.assign(last_grad_norm, norm))
    return grads, ops.depend(recorded, ops.assign(last_clipped, clipped))


def buffers_overflow(hyper_map, buffers):
    """Whether any buffer holds an inf or nan: one overflowing micro-batch anywhere in the window stays there (inf
    and nan survive every later addition), so one check per window catches it (IsFinite: CPU, GPU, Ascend)."""
    return grad_ops.sum_over(hyper_map, grad_ops.nonfinite, buffers) > 0.0


def count_skip(records, overflow, result):
    """Count the window in `records` (a WindowState's ``skips``: skipped windows, the streak of windows skipped in a
    row, the history bits) if `overflow`, else end the streak; returns `result` once all are written. A constant
    False (nothing was checked) counts nothing."""
    if isinstance(overflow, bool):
        return result
    skipped, streak, history = records
    flag = ops.cast(overflow, mstype.float32)
    result = ops.depend(result, ops.assign_add(skipped, flag))
    result = ops.depend(result, ops.assign(history, ops.fmod(history * 2.0 + flag, _HISTORY_MODULUS)))
    return ops.depend(result, ops.assign(streak, (streak + 1.0) * flag))


def assert_finite(overflow, norm):
    """Under MindSpore's compile cache, nonfinite="raise" stops the graph with its ``Assert`` (see
    ``runtime_checks.py``) unless the window's gradient is finite; returns `overflow`, which the update depends
    on."""
    return ops.depend(overflow, runtime_checks.assert_in_graph(ops.logical_not(overflow), [norm]))


def nonfinite_message(owner, skipped=False):
    """The error of a window whose gradient is not finite under nonfinite="raise"; `skipped`: raised once the
    window was skipped and cleared (the cell can go on), not from inside its graph."""
    applied = "The window was not applied: it was skipped and its buffers cleared, so the cell can go on." \
        if skipped else "The window was not applied."
    return (f"For '{owner}', the window's gradient must be finite, but it holds a NaN or an inf (nonfinite='raise'). "
            f"{applied} Find the micro-batch whose loss or gradient is not finite, or pass nonfinite='skip' to skip "
            f"such windows.")


def check_finite(owner, overflow):
    """Raise if `overflow`: the window's gradient is not finite, under nonfinite="raise" (from the skip's runtime
    branch, before the update; a raise there must still test a run-time value, or MindSpore raises it while
    compiling). As for :func:`check_items`, the error ends training with these cells."""
    if overflow:
        raise ValueError(nonfinite_message(owner))


class NonFiniteWindowSkipped(ValueError):
    """
    Raised by a cell built with ``nonfinite="raise"`` whose window's end runs in a graph of its own (the parallel
    cells), once that graph has skipped a window whose gradient was not finite: parameters and optimizer state
    unchanged, buffers cleared, the skip counted in the cell's skip records. The cell can go on.

    Attributes:
        outputs: What the window's end returned (its mean loss, or the loss-scale cell's tuple).
    """

    def __init__(self, message, outputs):
        super().__init__(message)
        self.outputs = outputs


def reset_window(buffers, counters, result):
    """Zero the buffers and counters after `result` is computed; returns `result`."""
    item_count, micro_steps, loss_sum, min_items = counters
    result = ops.depend(result, grad_ops.clear_in_turn(buffers, result))
    result = ops.depend(result, ops.assign(item_count, _ZERO))
    result = ops.depend(result, ops.assign(loss_sum, _ZERO))
    result = ops.depend(result, ops.assign(min_items, _EMPTY_MIN_ITEMS))
    return ops.depend(result, ops.assign(micro_steps, _NO_MICRO_BATCHES))
