"""check_equivalence: one accumulated window against one large-batch step, on any model.

What accumulation is responsible for is the gradient the optimizer receives, so that is compared first: the
window's applied gradient against the large-batch gradient, relative to each parameter's gradient scale. The
parameters after the step are compared second, relative to the size of the large-batch update, over the elements
whose gradient is known to better than the tolerance: an adaptive optimizer (Adam) normalises each element's
step, so an element whose gradient is rounding noise moves by about its learning rate, in a direction rounding
decides, in either computation; those elements are counted and reported, not failed.

The command-line front end is ``python -m ms_accum.check`` (check.py).
"""
import math
from dataclasses import dataclass, field

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

from ..core.checks import check_bool, check_cell, check_finite_positive, check_positive_int, drops, normalises_by_batch
from ..core.schedule import steps_argument
from ..cells.parallel import TrainAccuStepsCell
from ..cells.single_device import TrainClear, TrainForwardBackward, TrainOptim

CELLS = ("three_cells", "accu_steps")
NOISE = 1e-5  # a gradient element below NOISE * the parameter's largest gradient element is always noise


def _figure(relative):
    """A relative difference as the report prints it: '-' where nothing was compared (NaN)."""
    return "-" if math.isnan(relative) else format(relative, ".3e")


@dataclass
class ParameterCheck:
    """One parameter's figures: the applied gradient's and the updated parameter's largest relative differences,
    and the elements left out of the parameter comparison as rounding noise."""

    name: str
    grad_relative: float
    param_relative: float
    noise_elements: int
    elements: int


@dataclass
class EquivalenceReport:
    """
    Per-parameter differences between the accumulated and the large-batch step, and the verdict; what
    :func:`check_equivalence` returns. ``str(report)`` is a table, one row per parameter.

    Args:
        rtol (float): The relative tolerance the verdict uses.
        rows (list): One record per trainable parameter (name, relative differences of the applied gradient and
            of the updated parameter, noise-level elements). Default: empty.
        micro_batch_sizes (list[int]): The window's micro-batches, in samples. Default: empty.
        batch_norm_layers (list[str]): The network's BatchNorm layers that normalise by batch statistics in
            training mode (not those with ``use_batch_statistics=False``), which a failing verdict names as the
            likely cause. Default: empty.
        dropout_layers (list[str]): The network's dropout layers that drop something (probability > 0), which a
            failing verdict names as a likely cause and a passing one as luck of these micro-batches. Default:
            empty.
        low_precision_layers (list[str]): The network's cells computing in float16 or bfloat16 (``to_float``,
            ``mindspore.amp.auto_mixed_precision``; ``''`` among them: the network as a whole), which a failing verdict
            names as a likely cause, with the tolerance their rounding needs. Default: empty.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import nn
        >>> import ms_accum
        >>> x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)
        >>> report = ms_accum.check_equivalence(lambda: nn.Dense(4, 2), nn.MSELoss(),
        ...                                     lambda p: nn.SGD(p, 0.1), (x, y), 2)
        >>> report.passed, report.failing, report.max_relative < report.rtol
        (True, [], True)
    """

    rtol: float
    rows: list = field(default_factory=list)  # ParameterCheck, one per trainable parameter
    micro_batch_sizes: list = field(default_factory=list)
    batch_norm_layers: list = field(default_factory=list)
    dropout_layers: list = field(default_factory=list)
    low_precision_layers: list = field(default_factory=list)

    @property
    def max_grad_relative(self):
        """The largest relative difference of the applied gradient over all parameters."""
        return max((row.grad_relative for row in self.rows), default=0.0)

    @property
    def max_param_relative(self):
        """The largest relative difference of the updated parameters (noise elements left out); NaN when every
        element was left out, so that no update was compared."""
        compared = [row.param_relative for row in self.rows if row.noise_elements < row.elements]
        return max(compared) if compared else math.nan

    @property
    def max_relative(self):
        """The larger of the two (the applied gradient's when no update was compared)."""
        param = self.max_param_relative
        return self.max_grad_relative if math.isnan(param) else max(self.max_grad_relative, param)

    @property
    def failing(self):
        """The parameters that fail, each with what failed ("gradient", "parameter")."""
        return [(row.name, "gradient" if row.grad_relative > self.rtol else "parameter") for row in self.rows
                if max(row.grad_relative, row.param_relative) > self.rtol]

    @property
    def passed(self):
        """Whether every parameter's applied gradient and update are within `rtol`."""
        return not self.failing

    def __str__(self):
        width = max([len(row.name) for row in self.rows] + [9])
        lines = [f"micro-batches of {', '.join(map(str, self.micro_batch_sizes))} samples against one batch of "
                 f"{sum(self.micro_batch_sizes)}"] if self.micro_batch_sizes else []
        lines += [f"{'parameter':<{width}}  {'gradient':>10}  {'parameter':>10}  elements left out of",
                 f"{'':<{width}}  {'rel. diff':>10}  {'rel. diff':>10}  the parameter's figure"]
        lines += [f"{row.name:<{width}}  {row.grad_relative:>10.3e}  "
                  f"{'-' if row.noise_elements == row.elements else format(row.param_relative, '.3e'):>10}  "
                  f"{row.noise_elements} of {row.elements}" for row in self.rows]
        lines.append("(left out: elements whose large-batch gradient is rounding noise, or is too small for the "
                     "applied gradient's difference to stay within rtol)")
        if self.passed:
            lines.append(f"PASS: largest relative difference {self.max_relative:.3e} <= rtol {self.rtol:g} "
                         f"(applied gradient {self.max_grad_relative:.3e}, updated parameters "
                         f"{_figure(self.max_param_relative)})")
        else:
            worst = sorted(self.failing, key=lambda f: f[1])
            named = ", ".join(f"{name} ({what})" for name, what in worst[:5])
            lines.append(f"FAIL: largest relative difference {self.max_relative:.3e} > rtol {self.rtol:g}; decided "
                         f"by the {'applied gradient' if self.max_grad_relative > self.rtol else 'updated parameters'}"
                         f" of {named}{' ...' if len(worst) > 5 else ''}")
        if self.batch_norm_layers and not self.passed:
            lines.append(f"The network has {_layers(self.batch_norm_layers, 'BatchNorm layer')}: in training mode "
                         f"each normalises a micro-batch with that micro-batch's own statistics, so no accumulation "
                         f"can equal the large batch there (docs/models.md). Check a copy without BatchNorm, or with "
                         f"use_batch_statistics=False, to test the accumulation.")
        if self.low_precision_layers and not self.passed:
            where = "as a whole" if "" in self.low_precision_layers else \
                f"in {_layers(self.low_precision_layers, 'cell')}"
            lines.append(f"The network computes in half precision {where}: its gradients are rounded to about 3 "
                         f"decimal digits, differently in the large batch and in each micro-batch, so differences "
                         f"below about 1e-3 are rounding (2.5e-4 to 8.4e-4 measured against the same network's large "
                         f"batch, docs/clipping_and_mixed_precision.md). Pass rtol=2e-3, or check a float32 copy to "
                         f"test the accumulation to 1e-5.")
        if self.dropout_layers:  # beside a pass too: the masks agreed by luck
            held = "; they did with these micro-batches, which says little of others" if self.passed else ""
            lines.append(f"{'Note: the' if self.passed else 'The'} network has "
                         f"{_layers(self.dropout_layers, 'dropout layer')}: in training mode each draws its random "
                         f"masks anew, in the large batch and in every micro-batch, so the two steps need not "
                         f"agree{held} (docs/models.md). Check a copy with dropout off (p=0) to test the "
                         f"accumulation.")
        return "\n".join(lines)


def low_precision_cells(network):
    """The names of `network`'s cells that compute in float16 or bfloat16 ('' for the network itself): those
    ``to_float`` or ``mindspore.amp.auto_mixed_precision`` set so, or, for an amp level that rewrites the network
    and marks no cell (O1, ``auto``), the network itself."""
    names = [name for name, cell in network.cells_and_names()
             if getattr(getattr(cell, "mixed_precision_type", None), "name", None) in ("FP16", "BF16")]
    if not names and getattr(network, "_amp_level", "O0") in ("O1", "O2", "O3", "auto"):
        names = [""]
    return names


def _layers(names, kind):
    """"2 BatchNorm layers ('bn1', 'bn2')": a count of `kind` and the first five `names`, quoted."""
    shown = ", ".join(f"'{name}'" for name in names[:5]) + (", ..." if len(names) > 5 else "")
    return f"{len(names)} {kind}{'' if len(names) == 1 else 's'} ({shown})"


class _LossOnly(nn.Cell):
    """The large-batch loss of a loss network that may return (loss, num_items): its mean over the large batch's
    items is the first output."""

    def __init__(self, network):
        super().__init__(auto_prefix=False)
        self.network = network

    def construct(self, *inputs):
        out = self.network(*inputs)
        if isinstance(out, (tuple, list)):
            return out[0]
        return out


def _relative(got, want, scale, allowance=0.0):
    """max (|got - want| - allowance, at least 0) / scale (0 for empty arrays; the difference itself when the scale
    is 0)."""
    if not want.size:
        return 0.0
    diff = float(np.maximum(np.abs(got - want) - allowance, 0.0).max())
    return diff / scale if scale > 0 else diff


def check_equivalence(make_network, loss_fn, make_optimizer, inputs, gradient_accumulation_steps=None, seed=0,
                      rtol=1e-5, cell="three_cells", average=True,
                      *, accumulation_steps=None, mini_steps=None, accumulate_step=None):
    r"""
    Compare one accumulated window with one large-batch step, from identical initial parameters.

    Two figures per trainable parameter decide the verdict, both against `rtol`:

    - the applied gradient: the gradient the window hands to the optimizer against the large-batch gradient,
      max |difference| / max |large-batch gradient|;
    - the updated parameter: max |difference| / max |large-batch update|, less one float32 spacing of the
      parameter (the two steps round independently), over the elements whose large-batch gradient is known to
      better than `rtol`: larger than the applied gradient's largest difference divided by `rtol` (and than 1e-5
      of the parameter's largest gradient element). Adaptive optimizers (Adam, AdamWeightDecay) normalise each
      element's step, so an element whose gradient is rounding noise moves by about the learning rate, in a
      direction rounding decides, in either computation; those elements are counted in the report and do not
      fail it.

    Gradient elements below 1e-5 of the model's largest gradient element are float32 rounding noise (the bias of
    a layer that BatchNorm follows has an exact gradient of 0, say); both figures leave them out and the report
    counts them.

    Both copies run in training mode, as in training: BatchNorm normalises with batch statistics, so a network
    with BatchNorm fails the check (by design: accumulation cannot reproduce large-batch statistics). Dropout's
    masks need not match on the two paths (nothing promises they do); switch it off for the check. The report
    names either kind of layer: as the likely cause of a failure, and dropout beside a pass too.

    Args:
        make_network (Callable[[], Cell]): Builds the network; called after ``mindspore.set_seed(seed)`` for each
            copy, so all copies start equal.
        loss_fn (Cell, optional): The loss; ``None`` if the network returns the loss itself (or
            ``(loss, num_items)``: the mean over the items and their count, weighed as in training).
        make_optimizer (Callable[[list], Cell]): Builds an optimizer over the given parameters.
        inputs (tuple): The large batch: numpy arrays or Tensors sharing their first (batch) dimension, in the
            order the loss network takes them (network inputs, then the label).
        gradient_accumulation_steps (int): N, the micro-batches to split the batch into (``numpy.array_split``:
            sizes may differ by one); ``accumulation_steps``, ``mini_steps`` and ``accumulate_step`` are accepted
            in its place (keyword only).
        seed (int): Seed for the network copies. Default: ``0``.
        rtol (float): Largest relative difference that passes, for both figures. Default: ``1e-5``.
        cell (str): ``"three_cells"`` (TrainForwardBackward/TrainOptim/TrainClear) or ``"accu_steps"``
            (TrainAccuStepsCell). Default: ``"three_cells"``.
        average (bool): Passed to the three cells; ``False`` applies the raw sum of micro-batch gradients (the
            tutorial's recipe), which the check fails. Default: ``True``.

    Returns:
        EquivalenceReport, whose ``passed`` gives the verdict and ``str()`` a table.

    Raises:
        TypeError: If N is missing, given twice or not an int, `rtol` is not a number or `average` is not a bool.
        TypeError: If `make_network` or `make_optimizer` is not a function (a network or an optimizer built
            already, say), or `make_network` returns something other than a Cell.
        TypeError: If `inputs` is not a non-empty tuple or list.
        ValueError: If N is < 1 or larger than the batch, `inputs` differ in their first dimension (or one has
            none), `rtol` is not a finite number > 0,
            `cell` is unknown, `average` is ``False`` with ``cell="accu_steps"``, or `make_network` returns a
            network sharing parameters with one it returned before.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import nn
        >>> import ms_accum
        >>> x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)
        >>> report = ms_accum.check_equivalence(lambda: nn.Dense(4, 2), nn.MSELoss(),
        ...                                     lambda p: nn.Adam(p, 0.01), (x, y), 4)
        >>> report.passed
        True
    """
    owner = "check_equivalence"
    for arg_name, value, example in (("make_network", make_network, "lambda: MyNet()"),
                                     ("make_optimizer", make_optimizer, "lambda params: nn.Adam(params, 1e-3)")):
        if isinstance(value, nn.Cell) or not callable(value):
            raise TypeError(f"For '{owner}', '{arg_name}' must be a function that builds a new one for each copy "
                            f"compared (all start from the same weights), but got {type(value).__name__}"
                            f"{' (built already)' if isinstance(value, nn.Cell) else ''}. Pass {arg_name}={example}.")
    accumulation_steps, steps_name = steps_argument(owner, gradient_accumulation_steps, dict(
        accumulation_steps=accumulation_steps, mini_steps=mini_steps, accumulate_step=accumulate_step))
    check_positive_int(owner, steps_name, accumulation_steps)
    check_finite_positive(owner, "rtol", rtol)
    check_bool(owner, "average", average)
    if cell not in CELLS:
        raise ValueError(f"For '{owner}', 'cell' must be one of {list(CELLS)}, but got {cell!r}.")
    if not average and cell != "three_cells":
        raise ValueError(f"For '{owner}', 'average=False' is an option of cell='three_cells', but got cell={cell!r}.")
    arrays = _batch_arrays(owner, inputs)
    if accumulation_steps > len(arrays[0]):
        raise ValueError(f"For '{owner}', '{steps_name}' must be <= the batch size {len(arrays[0])}, but got "
                         f"{accumulation_steps}: every micro-batch needs a sample. Lower it, or pass a batch of at "
                         f"least {accumulation_steps} samples.")
    micro = [tuple(map(Tensor, batch)) for batch in zip(*(np.array_split(a, accumulation_steps) for a in arrays))]

    built = set()  # ids of every copy's parameters: each copy must train its own

    def copy():
        ms.set_seed(seed)
        net = make_network()
        check_cell(owner, "make_network()", net)
        params = {id(p) for p in net.trainable_params()}
        if params & built:
            raise ValueError(f"For '{owner}', 'make_network' must build a new network at each call (one per copy "
                             f"compared), but it returned a network whose parameters an earlier call's holds (the "
                             f"same network, say): the copies would train one set of weights, and the check would "
                             f"fail for that alone. Build the network inside it: make_network=lambda: MyNet().")
        built.update(params)
        net.set_train(True)
        loss_net = net if loss_fn is None else nn.WithLossCell(net, loss_fn)
        return net, loss_net, make_optimizer(net.trainable_params())

    reference, reference_loss, reference_opt = copy()
    before = {p.name: p.asnumpy().astype(np.float64) for p in reference_opt.parameters}
    grad_fn = ms.value_and_grad(_LossOnly(reference_loss), None, reference_opt.parameters)
    _, reference_grads = grad_fn(*map(Tensor, arrays))
    reference_grads = [g.asnumpy().astype(np.float64) for g in reference_grads]
    reference_opt(tuple(Tensor(g.astype(np.float32)) for g in reference_grads))
    applied, accumulated = _accumulate(copy, micro, cell, average)
    after = {p.name: p.asnumpy().astype(np.float64) for p in accumulated}
    report = EquivalenceReport(rtol, micro_batch_sizes=[len(batch[0]) for batch in micro],
                               batch_norm_layers=[name for name, layer in reference.cells_and_names()
                                                  if normalises_by_batch(layer)],
                               dropout_layers=[name for name, layer in reference.cells_and_names() if drops(layer)],
                               low_precision_layers=low_precision_cells(reference))
    # below NOISE times the model's largest gradient element, a gradient element is float32 rounding noise (the
    # bias of a layer that BatchNorm follows, say: its exact gradient is 0)
    model_floor = NOISE * max((float(np.abs(g).max()) for g in reference_grads if g.size), default=0.0)
    for param, grad_ref, grad_got in zip(reference_opt.parameters, reference_grads, applied):
        known = np.abs(grad_ref) > model_floor
        grad_scale = float(np.abs(grad_ref[known]).max()) if known.any() else 0.0
        grad_relative = _relative(grad_got[known], grad_ref[known], grad_scale)
        floor = max(NOISE * grad_scale, grad_relative * grad_scale / rtol, model_floor)
        signal = np.abs(grad_ref) > floor
        want = param.asnumpy().astype(np.float64)[signal]
        update_scale = float(np.abs(want - before[param.name][signal]).max()) if want.size else 0.0
        # the two steps round their results to float32 independently: one float32 spacing of each parameter apart
        # is rounding, which dominates when the update is small beside the parameter (a small learning rate)
        spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        report.rows.append(ParameterCheck(param.name, grad_relative,
                                          _relative(after[param.name][signal], want, update_scale, spacing),
                                          int(grad_ref.size - signal.sum()), int(grad_ref.size)))
    return report


def _batch_arrays(owner, inputs):
    """`inputs` as numpy arrays, once checked to be a tuple or list of arrays or Tensors with one batch size."""
    if not isinstance(inputs, (tuple, list)) or not inputs:
        raise TypeError(f"For '{owner}', 'inputs' must be a tuple of the loss network's inputs (numpy arrays or "
                        f"Tensors sharing their first, batch dimension), but got {type(inputs).__name__}"
                        f"{' (empty)' if isinstance(inputs, (tuple, list)) else ''}. Pass inputs=(x, y).")
    arrays = [x.asnumpy() if isinstance(x, Tensor) else np.asarray(x) for x in inputs]
    sizes = [len(a) if a.ndim else None for a in arrays]
    if None in sizes or len(set(sizes)) > 1:
        shapes = ", ".join(str(a.shape) for a in arrays)
        raise ValueError(f"For '{owner}', 'inputs' must share their first (batch) dimension, but they have shapes "
                         f"{shapes}. Pass one large batch: every input and the label with one row per sample.")
    return arrays


def _relative_items(cell):
    """What the window's buffers are divided by for its mean gradient: its items relative to those of its first
    micro-batch, to which the buffers hold the gradients (``WindowEngine._item_ratio``)."""
    return float(cell.accu_items.asnumpy()) / float(cell.accu_items_unit.asnumpy())


def _accumulate(copy, micro, cell, average):
    """(the window's applied gradient, one float64 array per parameter; the accumulated copy's parameters after
    its update)."""
    if cell == "three_cells":
        _, loss_net, optimizer = copy()
        grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
        forward_backward = TrainForwardBackward(loss_net, optimizer, grad_sum, average=average)
        for batch in micro:
            forward_backward(*batch)
        divisor = _relative_items(forward_backward) if average else 1.0
        applied = [g.asnumpy().astype(np.float64) / divisor for g in grad_sum]
        TrainOptim(optimizer, grad_sum, average=average)()
        TrainClear(grad_sum)()
        return applied, optimizer.parameters
    _, loss_net, optimizer = copy()  # a copy that only accumulates, to read the window's gradient
    probe = TrainAccuStepsCell(loss_net, optimizer, gradient_accumulation_steps=len(micro)).set_accumulation(True)
    for batch in micro:
        probe(*batch)
    items = _relative_items(probe)
    applied = [g.asnumpy().astype(np.float64) / items for g in probe.accu_grads]
    _, loss_net, optimizer = copy()
    steps_cell = TrainAccuStepsCell(loss_net, optimizer, gradient_accumulation_steps=len(micro))
    for batch in micro:
        steps_cell(*batch)
    return applied, optimizer.parameters
