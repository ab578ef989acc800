r"""Learning-rate scaling for a global batch that changes during a run: the factor f applied to the optimizer's
learning rate at each window, and how far the window moves the run's progress, counted in reference steps.

G is the window's items over all devices (samples, or the ``num_items`` its loss reports), G0 the reference batch
(the items of the run's first window, or given), B the smoothed gradient noise scale B_simple = tr(Sigma) / |G|^2 in
the same items (``noise_scale.py``). A window's factor f multiplies the learning rate its optimizer step reads; its
progress increment is added after the step, so that a schedule read from progress runs on data, not on updates
(``progress_lr.py``):

    rule               factor f        progress increment
    "none"             (nothing built: the optimizer is left as it is and reads its schedule by update)
    "linear"           G / G0          G / G0
    "sqrt"             sqrt(G / G0)    G / G0
    "adascale_sgd"     r               r
    "adascale_adam"    sqrt(r)         r
    "adascale"         one of the two above, chosen from the optimizer's type (resolve_scaling_rule)

With f = 1 and G = G0 in every window, progress is the update index and the optimizer steps as it would without
any of this, bit for bit. :func:`scaling_on_host` and :func:`scaling_on_device` still give ``"none"`` f = 1 and an
increment of G / G0, the schedule on data at the tuned rate, for a caller that builds a ``ProgressState`` itself;
the cells build none for it.

r is AdaScale's gain (Johnson et al., "AdaScale SGD", ICML 2020; AdaptDL's ``scaling_rules.py``), the factor by
which a step on G items makes more progress than one on G0 items:

    r = (tr(Sigma) / G0 + |G|^2) / (tr(Sigma) / G + |G|^2) = (G / G0) * (B + G0) / (B + G).

It lies between 1 and G / G0: B -> 0 (no noise, the larger batch buys nothing) gives r -> 1; B -> inf (all noise,
the larger batch averages it away) gives r -> G / G0, the linear rule. Adaptive optimizers (Adam, RMSProp) take
sqrt(r), as AdaptDL's ``AdamScale`` does (their update is normalised by the gradient's second moment, which makes
the square-root rule the one that keeps their dynamics: Malladi et al., "On the SDEs and Scaling Rules for Adaptive
Gradient Algorithms", NeurIPS 2022). Progress adds r in both: the window's worth in reference steps.

**No estimate** (B is NaN: before the first window with two micro-batches, or while the smoothed |G|^2 is not
positive, as ``noise_scale.noise_scale_of`` reads it): r = 1. The learning rate is not raised, and a window counts as
one reference step, until the noise has been measured: the conservative end of [1, G / G0]. The other end, G / G0,
would raise the rate on the strength of an estimate that says only that the signal was not resolved. While G = G0
(the first windows, whose G sets G0) every rule gives f = 1 and an increment of 1 anyway.

Each rule is computed twice, on the host in Python floats (:func:`scaling_on_host`) and inside a graph on scalar
Tensors (:func:`scaling_on_device`, for the window's end on the device, in GRAPH_MODE and inside ``ms.jit``); the
tests compare the two on a grid.
"""
import math
import numbers

from mindspore import nn, ops
from mindspore import dtype as mstype

from .checks import check_choice

SCALING_RULES = ("none", "linear", "sqrt", "adascale", "adascale_sgd", "adascale_adam")
ADASCALE_RULES = ("adascale_sgd", "adascale_adam")  # the concrete AdaScale rules, which read the noise scale
# The optimizers "adascale" recognises: plain and momentum SGD take r; the adaptive-moment optimizers sqrt(r).
# Others (LARS, Lamb, Adagrad, FTRL, Rprop, AdaFactor, a user's own) are refused: name the rule explicitly.
SGD_LIKE = (nn.SGD, nn.Momentum, nn.ASGD)
ADAM_LIKE = (nn.Adam, nn.AdamWeightDecay, nn.AdamOffload, nn.LazyAdam, nn.AdaMax, nn.RMSProp)


def resolve_scaling_rule(owner, rule, optimizer=None):
    """
    The concrete rule for `rule`: itself, or for ``"adascale"`` ``"adascale_sgd"`` (the optimizer is plain or
    momentum SGD: :data:`SGD_LIKE`) or ``"adascale_adam"`` (an adaptive-moment optimizer: :data:`ADAM_LIKE`).

    Args:
        owner (str): The API asking, for messages.
        rule (str): One of :data:`SCALING_RULES`.
        optimizer (mindspore.nn.Optimizer, optional): The optimizer whose learning rate is scaled; needed for
            ``"adascale"`` only. Default: ``None``.

    Returns:
        str, one of ``"none"``, ``"linear"``, ``"sqrt"``, ``"adascale_sgd"``, ``"adascale_adam"``.

    Raises:
        TypeError: If `rule` is not a str.
        ValueError: If `rule` is not one of :data:`SCALING_RULES`, or is ``"adascale"`` for an optimizer of neither
            kind (or none given).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum.core.lr_scaling import resolve_scaling_rule
        >>> net = nn.Dense(2, 1)
        >>> resolve_scaling_rule("example", "adascale", nn.Momentum(net.trainable_params(), 0.1, 0.9))
        'adascale_sgd'
        >>> resolve_scaling_rule("example", "adascale", nn.AdamWeightDecay(net.trainable_params(), 1e-3))
        'adascale_adam'
        >>> resolve_scaling_rule("example", "sqrt")
        'sqrt'
    """
    if not isinstance(rule, str):
        raise TypeError(f"For '{owner}', 'lr_scaling' must be a str, one of {list(SCALING_RULES)}, but got {rule!r} "
                        f"of type {type(rule).__name__}. Pass 'none' (the default) for no rule.")
    check_choice(owner, "lr_scaling", rule, SCALING_RULES)
    if rule != "adascale":
        return rule
    if isinstance(optimizer, SGD_LIKE):
        return "adascale_sgd"
    if isinstance(optimizer, ADAM_LIKE):
        return "adascale_adam"
    known = ", ".join(kind.__name__ for kind in SGD_LIKE + ADAM_LIKE)
    raise ValueError(f"For '{owner}', 'lr_scaling'='adascale' must know whether the optimizer is SGD-like (f = r) or "
                     f"adaptive like Adam (f = sqrt(r)), but got {type(optimizer).__name__}, which it does not "
                     f"recognise (it knows {known}). Pass lr_scaling='adascale_sgd' or 'adascale_adam'.")


def check_reference_batch(owner, value):
    """Return `value` as a float if it is a finite number > 0, or None (the first window's items set it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"For '{owner}', 'reference_batch' must be a finite number > 0, or None for the first "
                        f"window's items, but got {value!r} of type {type(value).__name__}.")
    if not 0 < value < math.inf:
        raise ValueError(f"For '{owner}', 'reference_batch' must be a finite number > 0, or None for the first "
                         f"window's items, but got {value!r}.")
    return float(value)


def _check_batches(owner, global_batch, reference_batch):
    for name, value in (("global_batch", global_batch), ("reference_batch", reference_batch)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
            raise ValueError(f"For '{owner}', '{name}' must be a finite number > 0, but got {value!r}.")


def adascale_gain(global_batch, reference_batch, noise_scale):
    r"""
    AdaScale's gain r = (G / G0) * (B + G0) / (B + G): how many reference steps one step on `global_batch` items is
    worth, for the gradient noise scale B = `noise_scale` in the same items.

    Args:
        global_batch (float): G, the window's items over all devices, > 0.
        reference_batch (float): G0, the reference batch in the same items, > 0.
        noise_scale (float): B >= 0; ``math.inf`` gives the limit G / G0; NaN (no estimate) gives 1.

    Returns:
        float, r, between 1 and G / G0.

    Raises:
        ValueError: If `global_batch` or `reference_batch` is not a finite number > 0.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum.core.lr_scaling import adascale_gain
        >>> adascale_gain(256.0, 64.0, 64.0)      # B = G0: r = 4 * 128 / 320
        1.6
        >>> adascale_gain(256.0, 64.0, 0.0), adascale_gain(256.0, 64.0, float("inf"))
        (1.0, 4.0)
        >>> adascale_gain(256.0, 64.0, float("nan"))
        1.0
    """
    _check_batches("adascale_gain", global_batch, reference_batch)
    if math.isnan(noise_scale):
        return 1.0
    if math.isinf(noise_scale):
        return global_batch / reference_batch
    noise_scale = max(noise_scale, 0.0)
    return global_batch * (noise_scale + reference_batch) / (reference_batch * (noise_scale + global_batch))


def scaling_on_host(rule, global_batch, reference_batch, noise_scale=math.nan):
    """
    A window's factor f and progress increment, on the host (see the module's table): f multiplies its learning
    rate; the increment, G / G0 (the items it saw over G0) for ``"none"``, ``"linear"`` and ``"sqrt"``, AdaScale's
    gain r for the AdaScale rules, is how far it moves the run's progress in reference steps once applied.

    Args:
        rule (str): A concrete rule (:func:`resolve_scaling_rule`): ``"none"``, ``"linear"``, ``"sqrt"``,
            ``"adascale_sgd"`` or ``"adascale_adam"``.
        global_batch (float): G, the window's items over all devices, > 0.
        reference_batch (float): G0, > 0.
        noise_scale (float): B, read by the AdaScale rules only (NaN: no estimate, r = 1). Default: NaN.

    Returns:
        (float, float): f and the increment.

    Raises:
        ValueError: If `rule` is not a concrete rule, or a batch is not a finite number > 0.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum.core.lr_scaling import scaling_on_host
        >>> [scaling_on_host(rule, 256.0, 64.0, 64.0) for rule in ("none", "linear", "sqrt", "adascale_sgd")]
        [(1.0, 4.0), (4.0, 4.0), (2.0, 4.0), (1.6, 1.6)]
        >>> factor, increment = scaling_on_host("adascale_adam", 256.0, 64.0, 64.0)   # sqrt(1.6), 1.6
        >>> round(factor, 6), increment
        (1.264911, 1.6)
    """
    check_choice("lr_scaling", "rule", rule, tuple(r for r in SCALING_RULES if r != "adascale"))
    _check_batches("scaling_on_host", global_batch, reference_batch)
    ratio = global_batch / reference_batch
    if rule not in ADASCALE_RULES:
        return {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule], ratio
    gain = adascale_gain(global_batch, reference_batch, noise_scale)
    return (gain if rule == "adascale_sgd" else math.sqrt(gain)), gain


def noise_scale_on_device(smooth_grad_sq, smooth_trace):
    """In a graph: (B_simple from the smoothed estimates, whether there is one), as ``noise_scale.noise_scale_of``
    reads them: none while the smoothed |G|^2 is not positive or tr(Sigma) not finite; a negative tr(Sigma) reads 0.
    B is 0 where there is no estimate (select on the flag)."""
    valid = ops.logical_and(smooth_grad_sq > 0.0, ops.isfinite(smooth_trace))
    grad_sq = ops.select(valid, smooth_grad_sq, ops.ones_like(smooth_grad_sq))
    trace = ops.select(valid, smooth_trace, ops.zeros_like(smooth_trace))
    return ops.maximum(trace, 0.0) / grad_sq, valid


def scaling_on_device(rule, global_batch, reference_batch, smooth_grad_sq=None, smooth_trace=None):
    """
    In a graph (GRAPH_MODE, a compiled cell or ``ms.jit``): (f, progress increment) for one window, float32 scalar
    Tensors (or elementwise over Tensors of one shape), the host's :func:`scaling_on_host` to float32 rounding.

    Args:
        rule (str): A concrete rule (:func:`resolve_scaling_rule`), a graph constant.
        global_batch (Tensor): G, float32 scalar, > 0.
        reference_batch (Tensor): G0, float32 scalar, > 0.
        smooth_grad_sq (Tensor): The smoothed |G|^2 (read by the AdaScale rules only; None otherwise).
        smooth_trace (Tensor): The smoothed tr(Sigma) (likewise).

    Returns:
        (Tensor, Tensor), float32 scalars: f and the increment.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> from mindspore import Tensor
        >>> from ms_accum.core.lr_scaling import scaling_on_device
        >>> factor, increment = scaling_on_device("adascale_sgd", Tensor(256.0, ms.float32), Tensor(64.0, ms.float32),
        ...                                       Tensor(1.0, ms.float32), Tensor(64.0, ms.float32))
        >>> round(float(factor), 5), round(float(increment), 5)
        (1.6, 1.6)
    """
    global_batch = ops.cast(global_batch, mstype.float32)
    reference_batch = ops.cast(reference_batch, mstype.float32)
    ratio = global_batch / reference_batch
    if rule not in ADASCALE_RULES:
        if rule == "none":
            return ops.ones_like(ratio), ratio
        if rule == "linear":
            return ratio, ratio
        return ops.sqrt(ratio), ratio
    noise, valid = noise_scale_on_device(smooth_grad_sq, smooth_trace)
    gain = global_batch * (noise + reference_batch) / (reference_batch * (noise + global_batch))
    gain = ops.select(valid, gain, ops.ones_like(gain))
    factor = gain if rule == "adascale_sgd" else ops.sqrt(gain)
    return factor, gain
