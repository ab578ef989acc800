"""The gradient noise scale of every accumulation window (McCandlish et al., "An Empirical Model of Large-Batch
Training", 2018, Appendix A), measured from what accumulation already holds.

A window of K micro-batches weighing w_1..w_K items (samples, or the items a loss reports), with W = sum(w_i),
holds each micro-batch's mean gradient g_i (at the same weights) and the window's g = sum(w_i g_i) / W. For items
drawn independently from the data, with true gradient G and per-item gradient covariance Sigma,

    E[w_i |g_i|^2] = w_i |G|^2 + tr(Sigma)      and      E[W |g|^2] = W |G|^2 + tr(Sigma),

so two unbiased estimates follow from the window's two squared norms, for any weights:

    noise_trace = (sum_i w_i |g_i|^2 - W |g|^2) / (K - 1)        (of tr(Sigma))
    grad_sq     = |g|^2 - noise_trace / W                         (of |G|^2)

A window with one micro-batch (K = 1, over all devices) has no estimate (NaN). In data parallel the sums run over
every measured micro-batch of every device (three scalars reduced once per window), W and g are the window's
global ones.

The cost per measured micro-batch is one squared norm of its gradient (one pass over it); per window a few
scalars. ``noise_scale=True`` measures every micro-batch; ``noise_scale="first"`` only the first of each window
(on each device), K times cheaper, with a noisier estimate: the R measured micro-batches (sum of weights W_s) and
the window give |G|^2 = (R C - A) / (R W - W_s) and tr(Sigma) = C - W |G|^2, where A = sum w_i |g_i|^2 over the
measured ones and C = W |g|^2 (with R = K, W_s = W these are the formulas above). The
device keeps exponentially smoothed numerator and denominator (:data:`NOISE_SMOOTHING`); their ratio is the
simple noise scale B_simple = tr(Sigma) / |G|^2 in items (the ratio of one window's estimates is biased and
noisy). Everything is in the units of the gradient the optimizer receives before clipping (as ``grad_norm``).
"""
import math

from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype

from . import grad_ops

NOISE_SMOOTHING = 0.9  # weight of the past in the smoothed estimates: about the last ten windows count
EVERY = "every"  # measure every micro-batch (noise_scale=True)
FIRST = "first"  # measure the first micro-batch of each window, on each device (noise_scale="first")
_NAN = Tensor(math.nan, mstype.float32)  # a record of a window without estimates (a Tensor made once, not ops.fill)


def _scalar(name, value):
    return Parameter(Tensor(value, mstype.float32), name=name, requires_grad=False)


class NoiseState:
    """
    Parameters of the noise-scale measurement: the open window's sums and the last window's estimates.

    Args:
        prefix (str): Name prefix of the Parameters.
        mode (str): :data:`EVERY` or :data:`FIRST`, which micro-batches are measured.

    Attributes:
        micro_sq (Parameter): sum over the measured micro-batches of the open window of weight * |micro-batch
            gradient|^2, in the units the gradient was computed in (times the loss scale squared, with loss
            scaling).
        measured_items, measured (Parameter): their weights' sum and their count.
        last_grad_sq (Parameter): the last window's unbiased estimate of |G|^2 (NaN: no estimate).
        last_noise_trace (Parameter): the last window's unbiased estimate of tr(Sigma) (NaN: no estimate).
        smooth_grad_sq, smooth_noise_trace (Parameter): exponentially smoothed estimates, without bias
            correction (it cancels in their ratio).
        windows (Parameter): windows that gave an estimate.
    """

    def __init__(self, prefix, mode=EVERY):
        self.mode = mode
        self.micro_sq = _scalar(f"{prefix}.noise_micro_sq", 0.0)
        self.measured_items = _scalar(f"{prefix}.noise_measured_items", 0.0)
        self.measured = _scalar(f"{prefix}.noise_measured", 0.0)
        self.last_grad_sq = _scalar(f"{prefix}.noise_last_grad_sq", math.nan)
        self.last_noise_trace = _scalar(f"{prefix}.noise_last_trace", math.nan)
        self.smooth_grad_sq = _scalar(f"{prefix}.noise_smooth_grad_sq", 0.0)
        self.smooth_noise_trace = _scalar(f"{prefix}.noise_smooth_trace", 0.0)
        self.windows = _scalar(f"{prefix}.noise_windows", 0.0)

    @property
    def parameters(self):
        """All of its Parameters, in the order :meth:`NoiseMeasure._init_noise` takes them."""
        return (self.micro_sq, self.measured_items, self.measured, self.last_grad_sq, self.last_noise_trace,
                self.smooth_grad_sq, self.smooth_noise_trace, self.windows)


micro_squared_sum = ops.MultitypeFuncGraph("micro_squared_sum")


@micro_squared_sum.register("Tensor")
def _micro_squared_dense(grad):
    return grad_ops.squared_sum(grad)


@micro_squared_sum.register("RowTensor")
def _micro_squared_rows(grad):
    """Refused: the squared norm of a sparse gradient needs its repeated rows merged first (a dynamic-shape Unique,
    which crashed MindSpore 2.10's CPU graph when tried)."""
    raise ValueError(f"For 'noise_scale', the micro-batch gradients must be dense, but got a sparse (RowTensor) "
                     f"gradient of {grad.values.shape[0]} rows (nn.EmbeddingLookup(sparse=True), say). Use a dense "
                     f"table (sparse=False), or noise_scale=False.")


def add_micro_sq(hyper_map, sums, grads, weights, first, measure):
    """
    Measure a micro-batch into `sums` (a NoiseState's micro_sq, measured_items, measured): with `weights` (w_sq, w),
    w_sq * |grads|^2 (w * |g|^2 for its mean gradient g), its weight w and a count, restarted at a window's first
    micro-batch (`first`, a Tensor; no reset is needed when a window is applied or dropped). `measure` (a constant
    in the graph): ``True`` measures the micro-batch, ``False`` does not (the host knows it is not a window's first
    and runs a graph without the pass), ``None`` measures it only if it is its window's first, decided at run time.
    Returns a Tensor to depend on.
    """
    micro_sq, measured_items, measured = sums
    sq_weight, weight = (ops.cast(w, mstype.float32) for w in weights)
    if measure is False:
        return weight
    if measure:
        squared = sq_weight * grad_ops.sum_over(hyper_map, micro_squared_sum, grads, sparse=True)
        done = ops.assign(micro_sq, ops.select(first, squared, micro_sq + squared))
        done = ops.depend(done, ops.assign(measured_items, ops.select(first, weight, measured_items + weight)))
        return ops.depend(done, ops.assign(measured, ops.select(first, ops.ones_like(measured), measured + 1.0)))
    done = weight
    if first:
        done = ops.depend(done, ops.assign(micro_sq, sq_weight * grad_ops.sum_over(hyper_map, micro_squared_sum,
                                                                                    grads, sparse=True)))
        done = ops.depend(done, ops.assign(measured_items, weight))
        done = ops.depend(done, ops.assign(measured, ops.ones_like(measured)))
    return done


def check_noise_scale(owner, measure, average=True):
    """The measurement mode `measure` asks for (None, :data:`EVERY` or :data:`FIRST`), if the weighting allows it
    (it needs average=True), else raise."""
    if measure is True or measure is False:
        mode = EVERY if measure else None
    elif isinstance(measure, str):
        if measure != FIRST:
            raise ValueError(f"For '{owner}', 'noise_scale' must be True, False or 'first', but got {measure!r}.")
        mode = FIRST
    else:
        raise TypeError(f"For '{owner}', 'noise_scale' must be True, False or 'first', but got {measure!r} of type "
                        f"{type(measure).__name__}.")
    if mode is not None and not average:
        raise ValueError(f"For '{owner}', 'noise_scale' needs the window's weighted mean gradient (average=True), but "
                         f"got average=False: the raw sum of micro-batch gradients has no batch size to compare. "
                         f"Pass average=True, or noise_scale=False.")
    return mode


def noise_state(owner, prefix, measure, average=True):
    """A new NoiseState measuring as `measure` asks (True, False or "first"), or None for False."""
    mode = check_noise_scale(owner, measure, average)
    return NoiseState(prefix, mode) if mode else None


def record_window(records, sums, grad_norm, items):
    """
    Write a NoiseState's `records` (last grad_sq, last noise_trace, smoothed grad_sq, smoothed noise_trace,
    windows) from the window's measured `sums` (A: the sum of weight * |g_i|^2 over the R measured micro-batches,
    divided by the loss scale squared; W_s: their weights; R), summed over devices, its gradient's global norm
    `grad_norm` (before clipping) and its `items` W over all devices. With C = W |g|^2, E[A] = W_s |G|^2 +
    R tr(Sigma) and E[C] = W |G|^2 + tr(Sigma) give the unbiased |G|^2 = (R C - A) / (R W - W_s) and tr(Sigma) =
    C - W |G|^2. A window whose measured micro-batches are the whole window and one (R W = W_s: one micro-batch),
    or a non-finite one (an overflow), gives NaN and leaves the smoothed estimates alone. Returns a Tensor to
    depend on.
    """
    last_grad_sq, last_noise_trace, smooth_grad_sq, smooth_noise_trace, windows = records
    total, measured_items, count = sums
    items = ops.maximum(ops.cast(items, mstype.float32), 1e-12)
    window = items * grad_norm * grad_norm
    spread = count * items - measured_items
    grad_sq = (count * window - total) / ops.maximum(spread, 1e-12)
    trace = window - items * grad_sq
    valid = ops.logical_and(spread > 1e-6 * count * items, ops.logical_and(ops.isfinite(trace),
                                                                         ops.isfinite(grad_sq)))
    past = NOISE_SMOOTHING
    done = ops.assign(last_noise_trace, ops.select(valid, trace, _NAN))
    done = ops.depend(done, ops.assign(last_grad_sq, ops.select(valid, grad_sq, _NAN)))
    done = ops.depend(done, ops.assign(smooth_noise_trace, ops.select(
        valid, past * smooth_noise_trace + (1.0 - past) * trace, smooth_noise_trace)))
    done = ops.depend(done, ops.assign(smooth_grad_sq, ops.select(
        valid, past * smooth_grad_sq + (1.0 - past) * grad_sq, smooth_grad_sq)))
    return ops.depend(done, ops.assign_add(windows, ops.cast(valid, mstype.float32)))


class NoiseMeasure:
    """
    Mixin for the cells that measure the noise scale: the NoiseState's Parameters as the cell's own attributes
    (``noise_micro_sq``, ``noise_last_grad_sq``, ...; None each when not measuring), so that they belong to its
    graph and its checkpoints.
    """

    def _init_noise(self, noise):
        """Attach `noise` (a NoiseState, or None not to measure)."""
        self.measure_noise = noise is not None
        self.noise_every = noise is not None and noise.mode == EVERY
        params = noise.parameters if noise is not None else (None,) * 8
        (self.noise_micro_sq, self.noise_measured_items, self.noise_measured, self.noise_last_grad_sq,
         self.noise_last_trace, self.noise_smooth_grad_sq, self.noise_smooth_trace, self.noise_windows) = params

    # With noise_scale="first": whether the next micro-batch is measured, when the host knows if it opens its
    # window (a front end that counts windows on the host sets it, with a graph phase of its own for each value);
    # None: decided in the graph at run time. Frozen into the compiled graph.
    _measure_now = None

    def _measures_micro_batch(self):
        """What add_micro_sq's `measure` is for the micro-batch being added: True for every micro-batch
        (noise_scale=True), else the host's choice when it has one and the step is compiled, else None. Reads
        ``_eager``, which :class:`compiled.CompiledCall` sets before each call."""
        if self.noise_every:
            return True
        return None if self._eager else self._measure_now

    def _noise_sums(self):
        """The open window's measured sums (None when not measuring): what add_micro_sq takes."""
        if not self.measure_noise:
            return None
        return (self.noise_micro_sq, self.noise_measured_items, self.noise_measured)

    def _record_noise(self, norm, items, unscale=1.0, sum_over_devices=None):
        """Record the window's estimates from its gradient's global `norm` (before clipping) and its `items` over
        all devices: the measured sums divided by the loss scale `unscale` squared, summed over devices by
        `sum_over_devices` (one reduction of three scalars; None on one device). Returns a Tensor to depend on."""
        sums = ops.stack((self.noise_micro_sq / (unscale * unscale), self.noise_measured_items + 0.0,
                          self.noise_measured + 0.0))
        if sum_over_devices is not None:
            sums = sum_over_devices(sums)
        return record_window(self._noise_records(), (sums[0], sums[1], sums[2]), norm, items)

    def _noise_records(self):
        return (self.noise_last_grad_sq, self.noise_last_trace, self.noise_smooth_grad_sq, self.noise_smooth_trace,
                self.noise_windows)

    @property
    def noise_records(self):
        """What telemetry reads after a window: (grad_sq, noise_trace, smoothed grad_sq, smoothed noise_trace), as
        scalar Parameters (read each with ``.asnumpy()``), or None when the cell does not measure the noise scale."""
        return self._noise_records()[:4] if self.measure_noise else None

    @property
    def b_simple(self):
        """float: the gradient noise scale B_simple = tr(Sigma) / |G|^2 from the smoothed estimates, in the items
        the window is weighted by (the loss's `num_items`; without it, samples in the training cells and the
        driver, micro-batches in :class:`Accumulator`), as WindowTelemetry's ``noise_scale`` column; NaN
        before the first estimate or while the smoothed |G|^2 is not positive; None when the cell does not measure
        the noise scale. Reading it waits for the device."""
        if not self.measure_noise:
            return None
        return noise_scale_of(float(self.noise_smooth_grad_sq.asnumpy()), float(self.noise_smooth_trace.asnumpy()))


def noise_scale_of(smooth_grad_sq, smooth_noise_trace):
    """B_simple from the smoothed estimates (floats): NaN before the first estimate, or while the smoothed |G|^2 is
    not positive (the noise then swamps the signal: no finite batch size is indicated); 0 while the smoothed
    tr(Sigma) is negative (its true value is >= 0: the noise is below what the windows resolve, and the adaptive
    policy reads it as 0 too)."""
    if not smooth_grad_sq > 0.0 or not math.isfinite(smooth_noise_trace):
        return math.nan
    return max(smooth_noise_trace, 0.0) / smooth_grad_sq
