"""Loss scaling, in every form MindSpore offers, for every path: the scale, what updates it, and the update.

Each path accepts the same three forms, under the name its calling convention uses (``scale_sense`` for the cells
and the trainers, ``loss_scaler`` for :class:`Accumulator`):

- a scale Tensor of shape () or (1,): a fixed scale, as :class:`mindspore.nn.TrainOneStepWithLossScaleCell` takes;
- a loss-scale update cell (:class:`mindspore.nn.DynamicLossScaleUpdateCell`,
  :class:`mindspore.nn.FixedLossScaleUpdateCell`), called once per window with the window's overflow;
- a :class:`mindspore.amp.LossScaler` (:class:`mindspore.amp.DynamicLossScaler`,
  :class:`mindspore.amp.StaticLossScaler`), whose ``adjust`` is called once per window.

The current scale lives in a Parameter (named ``scale_sense`` as in MindSpore's cell, or the scaler's own
``scale_value``), so checkpoints carry it.
"""
import math

from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype
from mindspore.amp import LossScaler
from mindspore.nn import Cell

CELL = "cell"  # a loss-scale update cell
SCALER = "scaler"  # a mindspore.amp.LossScaler
FIXED = "fixed"  # a scale Tensor


def scale_kind(owner, scale, arg_name="scale_sense", optional=True):
    """Which form `scale` is (:data:`CELL`, :data:`SCALER`, :data:`FIXED`), or None for no loss scaling (`optional`:
    whether None is taken); raise if it is none of them, or if the scale it starts from is not a finite number > 0
    (a scale of 0, inf or NaN makes every window overflow, and an update cell never leaves inf)."""
    if scale is None and optional:
        return None
    if isinstance(scale, Cell) and hasattr(scale, "get_loss_scale"):
        kind, start = CELL, scale.get_loss_scale()
    elif isinstance(scale, LossScaler):
        kind, start = SCALER, scale.scale_value
    elif isinstance(scale, Tensor):
        if scale.shape not in ((), (1,)):
            raise ValueError(f"For '{owner}', '{arg_name}' must be a Tensor of shape () or (1,), but got shape "
                             f"{scale.shape}.")
        kind, start = FIXED, scale
    else:
        raise TypeError(f"For '{owner}', '{arg_name}' must be a loss-scale update cell (nn.DynamicLossScaleUpdateCell, "
                        f"nn.FixedLossScaleUpdateCell), a mindspore.amp.LossScaler (DynamicLossScaler, "
                        f"StaticLossScaler){', a scale Tensor or None' if optional else ' or a scale Tensor'}, but got "
                        f"{type(scale).__name__}.")
    start = float(start.asnumpy().reshape(())) if isinstance(start, Tensor) else float(start)
    if not math.isfinite(start) or start <= 0.0:
        raise ValueError(f"For '{owner}', the loss scale of '{arg_name}' must be a finite number > 0, but it starts "
                         f"at {start}. Start from a power of 2 such as 2**12 (a scale of 0, inf or NaN makes every "
                         f"window overflow).")
    return kind


def check_scale_sense(owner, scale_sense, arg_name="scale_sense"):
    """The form of `scale_sense` (:func:`scale_kind`), which must be one of the loss-scale forms (not None)."""
    if scale_sense is None:
        raise TypeError(f"For '{owner}', '{arg_name}' must be a loss-scale update cell, a mindspore.amp.LossScaler "
                        f"or a scale Tensor, but got None.")
    return scale_kind(owner, scale_sense, arg_name, optional=False)


def scale_parameter(kind, scale):
    """(its updater: the update cell, the amp scaler or None; the Parameter holding the current scale) for the
    loss-scale form `scale` (not None), of the form `kind` (:func:`scale_kind`)."""
    if kind == SCALER:
        return scale, scale.scale_value
    if kind == CELL:
        return scale, Parameter(Tensor(scale.get_loss_scale(), mstype.float32), name="scale_sense",
                                requires_grad=False)
    return None, Parameter(Tensor(scale.asnumpy().reshape(()), mstype.float32), name="scale_sense",
                           requires_grad=False)


def mindspore_scale_sense(kind, scale):
    """What :class:`mindspore.nn.TrainOneStepWithLossScaleCell` is given for the loss-scale form `scale` (not None)
    of the form `kind` (:func:`scale_kind`): an update cell as it is; a scale Tensor, or a LossScaler's current
    scale, as a float32 copy of its shape. MindSpore's cell keeps a Tensor's dtype, and a float64 one
    (``Tensor(np.array(1024.0))``) was taken, then failed at the first update: an in-place write of float32 into
    it."""
    if kind == CELL:
        return scale
    return Tensor((scale.scale_value if kind == SCALER else scale).asnumpy(), mstype.float32)


def shared_scale(owner, state, scale_sense, kind):
    """The (updater, scale Parameter) of a window, created by the first cell built with `scale_sense` (of the form
    `kind`, :func:`scale_kind`) on these buffers; every cell on the same buffers must pass the same
    `scale_sense`."""
    state.bind(owner, "scale_sense", scale_sense, "Pass the same 'scale_sense' object to TrainForwardBackward and "
                                                  "TrainOptim.")
    if scale_sense is None:
        return None, None
    if state.loss_scale is None:
        state.loss_scale = scale_parameter(kind, scale_sense)
    return state.loss_scale


def update_scale(kind, updater, scale, overflow):
    """Let the updater adjust the scale for this window's `overflow` (once per window); return the overflow decision
    (an update cell's, which may differ from the raw flag only for a custom cell). `kind` is the form's
    :func:`scale_kind`, decided when the cell was built."""
    if kind == CELL:
        return updater(scale, overflow)
    if kind == SCALER:
        return ops.depend(overflow, updater.adjust(ops.logical_not(overflow)))
    return overflow
