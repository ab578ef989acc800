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
every micro-batch of every device (two scalars reduced once per window), W and g are the window's global ones.

The cost per micro-batch is one squared norm of its gradient (one pass over it); per window a few scalars. The
device keeps exponentially smoothed numerator and denominator (:data:`NOISE_SMOOTHING`); their ratio is the
simple noise scale B_simple = tr(Sigma) / |G|^2 in items (the ratio of one window's estimates is biased and
noisy). Everything is in the units of the gradient the optimizer receives before clipping (as ``grad_norm``).
"""
import math

from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype

from . import grad_ops

NOISE_SMOOTHING = 0.9  # weight of the past in the smoothed estimates: about the last ten windows count


def _scalar(name, value):
    return Parameter(Tensor(value, mstype.float32), name=name, requires_grad=False)


class NoiseState:
    """
    Parameters of the noise-scale measurement: the open window's sum and the last window's estimates.

    Attributes:
        micro_sq (Parameter): sum over the open window's micro-batches of weight * |micro-batch gradient|^2, in
            the units the gradient was computed in (times the loss scale squared, with loss scaling).
        last_grad_sq (Parameter): the last window's unbiased estimate of |G|^2 (NaN: no estimate).
        last_noise_trace (Parameter): the last window's unbiased estimate of tr(Sigma) (NaN: no estimate).
        smooth_grad_sq, smooth_noise_trace (Parameter): exponentially smoothed estimates, without bias
            correction (it cancels in their ratio).
        windows (Parameter): windows that gave an estimate.
    """

    def __init__(self, prefix):
        self.micro_sq = _scalar(f"{prefix}.noise_micro_sq", 0.0)
        self.last_grad_sq = _scalar(f"{prefix}.noise_last_grad_sq", math.nan)
        self.last_noise_trace = _scalar(f"{prefix}.noise_last_trace", math.nan)
        self.smooth_grad_sq = _scalar(f"{prefix}.noise_smooth_grad_sq", 0.0)
        self.smooth_noise_trace = _scalar(f"{prefix}.noise_smooth_trace", 0.0)
        self.windows = _scalar(f"{prefix}.noise_windows", 0.0)

    @property
    def parameters(self):
        """All of its Parameters, in the order :meth:`NoiseMeasure._init_noise` takes them."""
        return (self.micro_sq, self.last_grad_sq, self.last_noise_trace, self.smooth_grad_sq,
                self.smooth_noise_trace, self.windows)


def add_micro_sq(hyper_map, micro_sq, grads, weight, first):
    """micro_sq += weight * |grads|^2 (float32), or micro_sq = weight * |grads|^2 if `first` (the window's first
    micro-batch: no reset is needed when a window is applied or dropped); returns the assignment to depend on."""
    squared = ops.cast(weight, mstype.float32) * grad_ops.sum_over(hyper_map, grad_ops.squared_sum, grads)
    return ops.assign(micro_sq, ops.select(first, squared, micro_sq + squared))


def check_noise_scale(owner, measure, average=True):
    """Return `measure` if it is a bool that the weighting allows (noise_scale needs average=True), else raise."""
    if not isinstance(measure, bool):
        raise TypeError(f"For '{owner}', 'noise_scale' must be a bool, but got {measure!r} of type "
                        f"{type(measure).__name__}.")
    if measure and not average:
        raise ValueError(f"For '{owner}', 'noise_scale' needs the window's weighted mean gradient (average=True), but "
                         f"got average=False: the raw sum of micro-batch gradients has no batch size to compare. "
                         f"Pass average=True, or noise_scale=False.")
    return measure


def record_window(records, micro_sq, grad_norm, items, micro_batches):
    """
    Write a NoiseState's `records` (last grad_sq, last noise_trace, smoothed grad_sq, smoothed noise_trace,
    windows) from the window's `micro_sq` (the NoiseState's sum, summed over devices and divided by the loss scale
    squared), its gradient's global norm `grad_norm` (before clipping), its `items` and `micro_batches` (both
    over all devices). A window with one micro-batch, or a non-finite one (an overflow), gives NaN and leaves the
    smoothed estimates alone. Returns a Tensor to depend on.
    """
    last_grad_sq, last_noise_trace, smooth_grad_sq, smooth_noise_trace, windows = records
    items = ops.maximum(ops.cast(items, mstype.float32), 1e-12)
    count = ops.cast(micro_batches, mstype.float32)
    window_sq = grad_norm * grad_norm
    trace = (micro_sq - items * window_sq) / ops.maximum(count - 1.0, 1.0)
    grad_sq = window_sq - trace / items
    valid = ops.logical_and(count > 1.5, ops.logical_and(ops.isfinite(trace), ops.isfinite(grad_sq)))
    nan = ops.fill(mstype.float32, (), math.nan)
    past = NOISE_SMOOTHING
    done = ops.assign(last_noise_trace, ops.select(valid, trace, nan))
    done = ops.depend(done, ops.assign(last_grad_sq, ops.select(valid, grad_sq, nan)))
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
        params = noise.parameters if noise is not None else (None,) * 6
        (self.noise_micro_sq, self.noise_last_grad_sq, self.noise_last_trace, self.noise_smooth_grad_sq,
         self.noise_smooth_trace, self.noise_windows) = params

    def _noise_records(self):
        return (self.noise_last_grad_sq, self.noise_last_trace, self.noise_smooth_grad_sq, self.noise_smooth_trace,
                self.noise_windows)

    @property
    def noise_records(self):
        """What telemetry reads after a window: (grad_sq, noise_trace, smoothed grad_sq, smoothed noise_trace), or
        None when the cell does not measure the noise scale."""
        return self._noise_records()[:4] if self.measure_noise else None


def noise_scale_of(smooth_grad_sq, smooth_noise_trace):
    """B_simple from the smoothed estimates (floats): NaN before the first estimate, or while the smoothed |G|^2 is
    not positive (the noise then swamps the signal: no finite batch size is indicated)."""
    if not smooth_grad_sq > 0.0 or not math.isfinite(smooth_noise_trace):
        return math.nan
    return smooth_noise_trace / smooth_grad_sq
