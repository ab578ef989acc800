"""Loss scaling for the single-device cells: the scale, the cell that updates it, and the update itself.

The cells accept what :class:`mindspore.nn.TrainOneStepWithLossScaleCell` accepts: a scale Tensor (fixed), or
a loss-scale update cell (:class:`mindspore.nn.FixedLossScaleUpdateCell`,
:class:`mindspore.nn.DynamicLossScaleUpdateCell`). The scale lives in a Parameter named ``scale_sense``, as in
MindSpore's cell, so checkpoints carry it.
"""
from mindspore import Parameter, Tensor
from mindspore import dtype as mstype
from mindspore.nn import Cell


def check_scale_sense(owner, scale_sense):
    """Return `scale_sense` if it is a loss-scale update cell or a scale Tensor of shape () or (1,)."""
    if isinstance(scale_sense, Cell) and hasattr(scale_sense, "get_loss_scale"):
        return scale_sense
    if isinstance(scale_sense, Tensor):
        if scale_sense.shape not in ((), (1,)):
            raise ValueError(f"For '{owner}', 'scale_sense' must be a Tensor of shape () or (1,), but got shape "
                             f"{scale_sense.shape}.")
        return scale_sense
    raise TypeError(f"For '{owner}', 'scale_sense' must be a loss-scale update cell (nn.DynamicLossScaleUpdateCell, "
                    f"nn.FixedLossScaleUpdateCell) or a scale Tensor, but got {type(scale_sense).__name__}.")


def scale_parameter(owner, scale_sense):
    """(the update cell or None, the Parameter holding the current scale) for `scale_sense`."""
    if isinstance(check_scale_sense(owner, scale_sense), Cell):
        return scale_sense, Parameter(Tensor(scale_sense.get_loss_scale(), mstype.float32), name="scale_sense",
                                      requires_grad=False)
    return None, Parameter(Tensor(scale_sense.asnumpy().reshape(()), mstype.float32), name="scale_sense",
                           requires_grad=False)


def shared_scale(owner, state, scale_sense):
    """The (update cell, scale Parameter) of a window, created by the first cell built with `scale_sense` on these
    buffers; every cell on the same buffers must pass the same `scale_sense`."""
    state.bind(owner, "scale_sense", scale_sense, "Pass the same 'scale_sense' object to TrainForwardBackward and "
                                                  "TrainOptim.")
    if scale_sense is None:
        return None, None
    if state.loss_scale is None:
        state.loss_scale = scale_parameter(owner, scale_sense)
    return state.loss_scale


def update_scale(manager, scale, overflow):
    """Let the update cell adjust the scale for this window's `overflow` (once per window); return the overflow
    decision (the update cell's, which may differ from the raw flag only for a custom cell)."""
    if manager is None:
        return overflow
    return manager(scale, overflow)
