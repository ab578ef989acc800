"""The counters that the cells sharing one ``grad_sum`` keep together.

The tutorial hands one ``grad_sum`` ParameterTuple to three cells. To average over samples the cells also have
to agree on how many samples the open window holds; that state hangs off the ``grad_sum`` object itself, so the
tutorial's construction keeps working and every cell built on the same ``grad_sum`` sees the same counters.
"""
from mindspore import Parameter, Tensor
from mindspore import dtype as mstype

_ATTR = "_ms_accum_window"


class WindowState:
    """Parameters describing the open accumulation window.

    Attributes:
        sample_count (Parameter): float32 scalar, samples added since the last clear.
        micro_steps (Parameter): int32 scalar, micro-batches added since the last clear.
        loss_sum (Parameter): float32 scalar, sum over those samples of the (unscaled) per-sample loss.
        last_samples (Parameter): float32 scalar, samples of the last window applied by TrainOptim.
        last_grad_norm (Parameter): float32 scalar, global L2 norm of the gradient TrainOptim last applied.
        average (bool or None): whether the window's gradient is averaged over samples (``True``) or applied as
            the raw sum of micro-batch gradients (``False``); fixed by the first cell built on the buffers.
    """

    def __init__(self, prefix):
        self.sample_count = Parameter(Tensor(0.0, mstype.float32), name=f"{prefix}.sample_count",
                                      requires_grad=False)
        self.micro_steps = Parameter(Tensor(0, mstype.int32), name=f"{prefix}.micro_steps", requires_grad=False)
        self.loss_sum = Parameter(Tensor(0.0, mstype.float32), name=f"{prefix}.loss_sum", requires_grad=False)
        self.last_samples = Parameter(Tensor(0.0, mstype.float32), name=f"{prefix}.last_samples",
                                      requires_grad=False)
        self.last_grad_norm = Parameter(Tensor(0.0, mstype.float32), name=f"{prefix}.last_grad_norm",
                                        requires_grad=False)
        self.average = None

    @property
    def parameters(self):
        """The three counters, in a fixed order."""
        return (self.sample_count, self.micro_steps, self.loss_sum)

    def bind_average(self, owner, average):
        """Record the averaging mode, or raise if a cell on the same buffers chose the other one."""
        if self.average is None:
            self.average = average
        elif self.average != average:
            raise ValueError(f"For '{owner}', 'average' must match the other cells built on this grad_sum "
                             f"({self.average}), but got {average}. Pass the same 'average' to "
                             f"TrainForwardBackward and TrainOptim.")


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
