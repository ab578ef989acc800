"""BatchNorm under accumulation: moving statistics see micro-batches, not the large batch.

Each micro-batch normalises with its own statistics and updates the moving mean and variance once, so a window of
N micro-batches decays the old moving statistics by momentum**N where one large batch decays them by momentum.
Batch statistics of a micro-batch are also noisier than those of the large batch; no accumulation can change that
without a second pass. `adjust_batchnorm_momentum` restores the decay per window.
"""
from mindspore import ops

from ..core.checks import check_positive_int
from ..compat import BatchNormBase, SyncBatchNormOp

_ORIGINAL = "_ms_accum_original_momentum"


def adjust_batchnorm_momentum(network, accumulation_steps):
    r"""
    Set every BatchNorm layer's momentum m to m ** (1 / accumulation_steps).

    After a window of N micro-batches the old moving statistics then carry the weight m, as after one
    large-batch step, instead of m ** N. With micro-batches of equal batch mean the moving mean equals the
    large batch's exactly. In general the window adds sum_k (1 - m') m' ** (N - 1 - k) mean_k (m' = m ** (1 / N),
    k = 0 .. N - 1): weights summing to 1 - m, as the large batch's, but the later micro-batches weigh more
    (the last m' ** -(N - 1) times the first: 1.08 for m = 0.9, N = 4), where the large batch weighs them
    alike. Call it before the first training step: the momentum is frozen into the compiled graph in both modes
    (ms_accum's cells compile their steps in PYNATIVE_MODE too), so a later call changes nothing in cells that
    have run, though it returns the new momenta. The momentum each layer had before the first call is
    remembered: calling it again sets m ** (1 / N) from that momentum (it never compounds), and N = 1 restores
    it.

    Args:
        network (Cell): The network; its ``nn.BatchNorm1d/2d/3d`` and ``nn.SyncBatchNorm`` layers (any
            ``_BatchNorm``) are changed in place; a synchronised layer stays synchronised.
        accumulation_steps (int): Micro-batches per update, >= 1.

    Returns:
        list[tuple[str, float, float]], for each BatchNorm layer: its name, its original momentum and the new
        momentum (in the convention of ``nn.BatchNorm2d(momentum=...)``: the weight of the old moving statistics).

    Raises:
        TypeError: If `accumulation_steps` is not an int, or a BatchNorm layer trains with a primitive other than
            ``ops.BatchNorm`` or SyncBatchNorm (nothing is changed in that layer).
        ValueError: If `accumulation_steps` is < 1.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.SequentialCell([nn.Dense(4, 4), nn.BatchNorm1d(4, momentum=0.9)])
        >>> ms_accum.adjust_batchnorm_momentum(net, 4)
        [('1', 0.9, 0.9740037464252967)]
    """
    accumulation_steps = check_positive_int("adjust_batchnorm_momentum", "accumulation_steps", accumulation_steps)
    changed = []
    for name, cell in network.cells_and_names():
        if not isinstance(cell, BatchNormBase):
            continue
        if not hasattr(cell, _ORIGINAL):
            setattr(cell, _ORIGINAL, 1.0 - cell.momentum)  # the cell stores 1 - momentum, the new statistics' weight
        old = getattr(cell, _ORIGINAL)
        new = old ** (1.0 / accumulation_steps)
        cell.bn_train = _training_op(name, cell, 1.0 - new)
        cell.momentum = 1.0 - new
        changed.append((name, old, new))
    return changed


def _training_op(name, cell, momentum):
    """The layer's training BatchNorm primitive rebuilt with `momentum`, of the same kind: a synchronised one
    (nn.SyncBatchNorm across devices) keeps its group, so its statistics stay shared."""
    current = cell.bn_train
    if isinstance(current, SyncBatchNormOp):
        return SyncBatchNormOp(epsilon=cell.eps, momentum=momentum, group=current.group,
                               device_num=current.device_num)
    if isinstance(current, ops.BatchNorm):
        return ops.BatchNorm(is_training=True, epsilon=cell.eps, momentum=momentum, data_format=cell.format)
    raise TypeError(f"For 'adjust_batchnorm_momentum', BatchNorm layer '{name}' ({type(cell).__name__}) trains with "
                    f"{type(current).__name__}, which ms_accum cannot rebuild with a new momentum; expected "
                    f"ops.BatchNorm or SyncBatchNorm. Set that layer's momentum to m ** (1 / N) yourself.")
