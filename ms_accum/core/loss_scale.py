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
from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype
from mindspore.amp import LossScaler
from mindspore.nn import Cell

CELL = "cell"  # a loss-scale update cell
SCALER = "scaler"  # a mindspore.amp.LossScaler
FIXED = "fixed"  # a scale Tensor


def scale_kind(owner, scale, arg_name="scale_sense"):
    """Which form `scale` is (:data:`CELL`, :data:`SCALER`, :data:`FIXED`), or None for no loss scaling; raise if
    it is none of them."""
    if scale is None:
        return None
    if isinstance(scale, Cell) and hasattr(scale, "get_loss_scale"):
        return CELL
    if isinstance(scale, LossScaler):
        return SCALER
    if isinstance(scale, Tensor):
        if scale.shape not in ((), (1,)):
            raise ValueError(f"For '{owner}', '{arg_name}' must be a Tensor of shape () or (1,), but got shape "
                             f"{scale.shape}.")
        return FIXED
    raise TypeError(f"For '{owner}', '{arg_name}' must be a loss-scale update cell (nn.DynamicLossScaleUpdateCell, "
                    f"nn.FixedLossScaleUpdateCell), a mindspore.amp.LossScaler (DynamicLossScaler, "
                    f"StaticLossScaler), a scale Tensor or None, but got {type(scale).__name__}.")


def check_scale_sense(owner, scale_sense, arg_name="scale_sense"):
    """Return `scale_sense` if it is one of the loss-scale forms (not None), else raise."""
    if scale_sense is None:
        raise TypeError(f"For '{owner}', '{arg_name}' must be a loss-scale update cell, a mindspore.amp.LossScaler "
                        f"or a scale Tensor, but got None.")
    scale_kind(owner, scale_sense, arg_name)
    return scale_sense


def scale_parameter(owner, scale, arg_name="scale_sense"):
    """(its updater: the update cell, the amp scaler or None; the Parameter holding the current scale) for the
    loss-scale form `scale` (not None)."""
    kind = scale_kind(owner, check_scale_sense(owner, scale, arg_name), arg_name)
    if kind == SCALER:
        return scale, scale.scale_value
    if kind == CELL:
        return scale, Parameter(Tensor(scale.get_loss_scale(), mstype.float32), name="scale_sense",
                                requires_grad=False)
    return None, Parameter(Tensor(scale.asnumpy().reshape(()), mstype.float32), name="scale_sense",
                           requires_grad=False)


def shared_scale(owner, state, scale_sense):
    """The (updater, scale Parameter) of a window, created by the first cell built with `scale_sense` on these
    buffers; every cell on the same buffers must pass the same `scale_sense`."""
    state.bind(owner, "scale_sense", scale_sense, "Pass the same 'scale_sense' object to TrainForwardBackward and "
                                                  "TrainOptim.")
    if scale_sense is None:
        return None, None
    if state.loss_scale is None:
        state.loss_scale = scale_parameter(owner, scale_sense)
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
