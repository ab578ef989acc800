"""check_equivalence: one accumulated window against one large-batch step, on any model.

The command-line front end is ``python -m ms_accum.check`` (check.py).
"""
from dataclasses import dataclass, field

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

from ._checks import check_positive_int
from .accu_steps import TrainAccuStepsCell
from .single_device import TrainClear, TrainForwardBackward, TrainOptim

CELLS = ("three_cells", "accu_steps")


@dataclass
class EquivalenceReport:
    """Per-parameter differences between the accumulated and the large-batch update."""

    rtol: float
    rows: list = field(default_factory=list)  # (name, max abs difference, relative difference)

    @property
    def max_relative(self):
        """The largest relative difference over all parameters."""
        return max((rel for _, _, rel in self.rows), default=0.0)

    @property
    def passed(self):
        """Whether every parameter is within `rtol`."""
        return self.max_relative <= self.rtol

    def __str__(self):
        width = max([len(name) for name, _, _ in self.rows] + [9])
        lines = [f"{'parameter':<{width}}  {'max |diff|':>12}  {'relative':>10}"]
        lines += [f"{name:<{width}}  {diff:>12.3e}  {rel:>10.3e}" for name, diff, rel in self.rows]
        verdict = "PASS" if self.passed else "FAIL"
        lines.append(f"{verdict}: largest relative difference {self.max_relative:.3e} "
                     f"({'<=' if self.passed else '>'} rtol {self.rtol:g})")
        return "\n".join(lines)


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


def check_equivalence(make_network, loss_fn, make_optimizer, inputs, accumulation_steps, seed=0, rtol=1e-5,
                      cell="three_cells"):
    r"""
    Compare one accumulated window with one large-batch step, from identical initial parameters.

    Both copies run in training mode, as in training: BatchNorm normalises with batch statistics, so a network
    with BatchNorm fails the check (by design: accumulation cannot reproduce large-batch statistics). Dropout
    draws different masks on the two paths; switch it off for the check.

    Args:
        make_network (Callable[[], Cell]): Builds the network; called twice, each time after
            ``mindspore.set_seed(seed)``, so both copies start equal.
        loss_fn (Cell, optional): The loss; ``None`` if the network returns the loss itself (or
            ``(loss, num_items)``: the mean over the items and their count, weighed as in training).
        make_optimizer (Callable[[list], Cell]): Builds an optimizer over the given parameters.
        inputs (tuple): The large batch: numpy arrays or Tensors sharing their first (batch) dimension, in the
            order the loss network takes them (network inputs, then the label).
        accumulation_steps (int): Micro-batches to split the batch into (``numpy.array_split``: sizes may differ
            by one).
        seed (int): Seed for both network copies. Default: ``0``.
        rtol (float): Largest relative difference (max |diff| / max |large-batch value|) that passes.
            Default: ``1e-5``.
        cell (str): ``"three_cells"`` (TrainForwardBackward/TrainOptim/TrainClear) or ``"accu_steps"``
            (TrainAccuStepsCell). Default: ``"three_cells"``.

    Returns:
        EquivalenceReport, whose ``passed`` gives the verdict and ``str()`` a table.

    Raises:
        TypeError: If `accumulation_steps` is not an int.
        ValueError: If `accumulation_steps` is < 1 or larger than the batch, or `cell` is unknown.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import nn
        >>> import ms_accum
        >>> x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)
        >>> report = ms_accum.check_equivalence(lambda: nn.Dense(4, 2), nn.MSELoss(),
        ...                                     lambda p: nn.SGD(p, 0.1), (x, y), 4)
        >>> report.passed
        True
    """
    owner = "check_equivalence"
    check_positive_int(owner, "accumulation_steps", accumulation_steps)
    if cell not in CELLS:
        raise ValueError(f"For '{owner}', 'cell' must be one of {list(CELLS)}, but got {cell!r}.")
    arrays = [x.asnumpy() if isinstance(x, Tensor) else np.asarray(x) for x in inputs]
    if accumulation_steps > len(arrays[0]):
        raise ValueError(f"For '{owner}', 'accumulation_steps' must be <= the batch size {len(arrays[0])}, but got "
                         f"{accumulation_steps}.")

    def loss_network():
        ms.set_seed(seed)
        net = make_network()
        net.set_train(True)
        return net, (net if loss_fn is None else nn.WithLossCell(net, loss_fn))

    reference, reference_loss = loss_network()
    nn.TrainOneStepCell(_LossOnly(reference_loss), make_optimizer(reference.trainable_params()))(*map(Tensor, arrays))
    accumulated, accumulated_loss = loss_network()
    optimizer = make_optimizer(accumulated.trainable_params())
    micro = list(zip(*(np.array_split(a, accumulation_steps) for a in arrays)))
    if cell == "three_cells":
        grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
        forward_backward = TrainForwardBackward(accumulated_loss, optimizer, grad_sum)
        for batch in micro:
            forward_backward(*map(Tensor, batch))
        TrainOptim(optimizer, grad_sum)()
        TrainClear(grad_sum)()
    else:
        steps_cell = TrainAccuStepsCell(accumulated_loss, optimizer, accumulation_steps=accumulation_steps)
        for index, batch in enumerate(micro):
            steps_cell.set_accumulation(index < len(micro) - 1)(*map(Tensor, batch))
    report = EquivalenceReport(rtol)
    after = {p.name: p.asnumpy() for p in accumulated.get_parameters()}
    for param in reference.get_parameters():
        want = param.asnumpy().astype(np.float64)
        diff = float(np.abs(after[param.name].astype(np.float64) - want).max()) if want.size else 0.0
        scale = float(np.abs(want).max()) if want.size else 0.0
        report.rows.append((param.name, diff, diff / scale if scale > 0 else diff))
    return report
