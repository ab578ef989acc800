"""What a micro-batch weighs in its window: its samples, or the items its loss reports.

Every ms_accum path weighs micro-batches here, so the rule cannot drift between them:

- a loss network that returns one scalar, the mean loss over its micro-batch, weighs its samples: the leading
  dimension of its inputs, which must agree (an input shaped (T, B, F) beside labels (B,) is refused: there is no
  way to tell which axis is the batch);
- a loss network that returns ``(loss, num_items)``, where ``loss`` is the mean over ``num_items`` items (tokens,
  samples, any unit), weighs ``num_items``.

The window then applies the gradient of the mean over all of its samples (or items): sum(weight * grad) /
sum(weight), which is the large-batch gradient when the large batch's loss is the mean over the same samples or
items.
"""
from mindspore import Tensor, context, nn, ops
from mindspore import dtype as mstype

from ..compat import forget_pynative_recording, keep_cell_config_visible
from .user_warning import warn


def _leading_dims(inputs):
    """The leading dimension of every input of rank >= 1 (scalars and non-tensors carry no batch)."""
    dims = ()
    for x in inputs:
        if isinstance(x, Tensor) and len(x.shape) >= 1:
            dims = dims + (x.shape[0],)
    return dims


def sample_count(owner, inputs):
    """The micro-batch's samples: the inputs' common leading dimension (a compile-time constant in GRAPH_MODE)."""
    dims = _leading_dims(inputs)
    if not dims:
        raise ValueError(f"For '{owner}', a micro-batch's sample count is its inputs' leading dimension, but no "
                         f"input has one. Return '(loss, num_items)' from the loss network to weigh it.")
    for dim in dims:
        if dim != dims[0]:
            raise ValueError(f"For '{owner}', the inputs' leading dimensions must agree to count samples, but got "
                             f"shapes {[list(x.shape) for x in inputs if isinstance(x, Tensor)]}. ms_accum weighs a "
                             f"micro-batch by its inputs' leading dimension unless the loss network returns "
                             f"'(loss, num_items)'; for sequence-first or otherwise laid-out inputs, return the "
                             f"mean loss and the number of samples or tokens it averages over.")
    return dims[0]


def check_scalar_loss(owner, loss):
    """Raise if the loss network returned a non-scalar loss (graph-compatible: shapes are constants)."""
    if not isinstance(loss, Tensor) or loss.shape not in ((), (1,)):
        shape = loss.shape if isinstance(loss, Tensor) else type(loss).__name__
        raise ValueError(f"For '{owner}', the loss network must return one scalar loss, the mean over its "
                         f"micro-batch (for example reduction='mean'), or '(loss, num_items)', but it returned "
                         f"shape {shape}.")


def check_items_value(owner, num_items, source="the second output of the loss network"):
    """Raise unless `num_items` (`source`: where it came from, for the message) is a scalar Tensor or a number;
    returns whether it is a number. Checked in Python, or while a graph is compiled."""
    if isinstance(num_items, (int, float)) and not isinstance(num_items, bool):
        return True
    expected = f"For '{owner}', 'num_items', {source}, must be a scalar Tensor or a number (the micro-batch's item " \
               f"count), but got"
    if not isinstance(num_items, Tensor):
        raise TypeError(f"{expected} {type(num_items).__name__}.")
    if num_items.shape not in ((), (1,)):
        raise ValueError(f"{expected} shape {num_items.shape}.")
    if num_items.dtype == mstype.bool_:  # a mask's element: it weighed 1, in silence (a new user's trial)
        raise TypeError(f"{expected} a bool Tensor. Pass the count itself, for example a mask's sum "
                        f"(mask.sum()).")
    return False


def _as_items(owner, num_items, source="the second output of the loss network"):
    """`num_items` (a scalar Tensor or a number) as a float32 scalar Tensor."""
    if check_items_value(owner, num_items, source):
        return ops.scalar_to_tensor(num_items, mstype.float32)
    return ops.reshape(ops.cast(num_items, mstype.float32), ())


ITEMS_ARGUMENT = "the call's second argument"
_ONE = Tensor(1, mstype.float32)  # a Tensor made once: ops.ones is a function MindSpore compiles at every use


def as_weight(owner, num_items):
    """What a micro-batch handed to the functional accumulator weighs: its `num_items`, or 1 when None."""
    if num_items is None:
        return _ONE
    return _as_items(owner, num_items, ITEMS_ARGUMENT)


class LossAndItems(nn.Cell):
    r"""
    Wraps a loss network so that it returns ``(loss, items)``: its loss and what the micro-batch weighs.

    ``items`` is a float32 scalar: the ``num_items`` the network returned as its second output, or else the
    micro-batch's sample count (the inputs' common leading dimension). It carries no gradient. Parameter names
    are the wrapped network's.

    Args:
        owner (str): The cell named in error messages.
        network (Cell): The loss network: it returns the mean loss over its micro-batch, or ``(loss, num_items)``.

    Inputs:
        - **\*inputs** (Tuple(Tensor)) - One micro-batch.

    Outputs:
        Tuple of 2 Tensors, the scalar loss and the float32 scalar item count; the loss alone while
        ``loss_only`` is set (:func:`micro_batch_forward` in PYNATIVE_MODE), the items then waiting in ``items``.

    Raises:
        ValueError: At the first call, if the loss is not a scalar, `num_items` is not a scalar, or (without
            `num_items`) the inputs' leading dimensions disagree.
    """

    def __init__(self, owner, network):
        super().__init__(auto_prefix=False)
        self.owner = owner
        self.network = network
        keep_cell_config_visible(self, network)  # the network's amp level and jit config, visible to wrappers
        self.loss_only = False  # set by micro_batch_forward for one PYNATIVE call: return the loss alone
        self.items = None  # in that call, the micro-batch's items (a number or a Tensor) wait here

    def construct(self, *inputs):
        out = self.network(*inputs)
        if isinstance(out, dict):  # else MindSpore's OnesLike failed on it in GRAPH_MODE (a new user's trial)
            raise TypeError(f"For '{self.owner}', the loss network must return a loss or '(loss, num_items)', but it "
                            f"returned a dict. Return its entries as a tuple, for example "
                            f"'return out[\"loss\"], out[\"num_items\"]'.")
        if isinstance(out, (tuple, list)):
            if len(out) != 2:
                raise ValueError(f"For '{self.owner}', the loss network must return a loss or '(loss, num_items)', "
                                 f"but it returned {len(out)} outputs.")
            loss, items = out[0], out[1]
        else:
            loss, items = out, sample_count(self.owner, inputs)
        check_scalar_loss(self.owner, loss)
        if self.loss_only:
            self.items = items
            return loss
        return loss, ops.stop_gradient(_as_items(self.owner, items))


def warn_summed_loss(owner, network):
    """Warn if `network`, the user's loss network, is a :class:`mindspore.nn.WithLossCell` whose loss function
    reduces by ``'sum'``: its loss is taken as the mean over its micro-batch and the window's mean is weighted by
    samples, so an update would be 1/N of the large batch's summed gradient with N equal micro-batches (and no
    multiple of it with unequal ones). Called by the engine when it averages. Returns whether it warned."""
    loss_fn = getattr(network, "_loss_fn", None) if isinstance(network, nn.WithLossCell) else None
    if not isinstance(loss_fn, nn.LossBase) or not getattr(loss_fn, "reduce", False) or \
            getattr(loss_fn, "average", True):
        return False
    warn(f"For '{owner}', the loss network's loss function, {type(loss_fn).__name__}, reduces by 'sum', but a loss "
         f"network's loss is taken as the mean over its micro-batch: averaged over the window, an update would be "
         f"1/N of the large batch's summed gradient (with N equal micro-batches). Use reduction='mean' to train on "
         f"the large batch's mean, or average=False (the micro-batches' gradients summed) to train on its sum.")
    return True


def micro_batch_forward(network, inputs, eager):
    """
    (loss, items) of one micro-batch through `network`, a LossAndItems, recorded for its backward.

    `eager` (PYNATIVE_MODE, from the calling cell) records the loss alone as the network's output, as
    :class:`mindspore.nn.TrainOneStepCell` does: a second output, its zero seed and the item count's operators,
    launched one by one, slowed a small micro-step there (docs/performance_history.md, The distance to plain
    training, and its cause). Pass the same `eager` to :func:`loss_sens`.
    """
    if eager:
        return _forward_loss_only(network, inputs)
    return network(*inputs)


def _forward_loss_only(network, inputs):
    """micro_batch_forward in PYNATIVE_MODE (plain Python, never compiled)."""
    network.loss_only = True
    try:
        loss = network(*inputs)
    finally:
        network.loss_only = False
    items, network.items = network.items, None
    if isinstance(items, (int, float)) and not isinstance(items, bool):  # the sample count, say
        return loss, Tensor(items, mstype.float32)
    return loss, _as_items(network.owner, items)


def loss_sens(loss, items, sens, eager=False):
    """The gradient seed of a LossAndItems output recorded by :func:`micro_batch_forward` with the same `eager`:
    `sens` (a number or a scalar Tensor, such as a loss scale) for the loss, nothing for the item count."""
    if isinstance(sens, Tensor):
        seed = ops.ones_like(loss) * ops.cast(ops.reshape(sens, ()), ops.dtype(loss))
    else:
        seed = ops.ones_like(loss) * sens  # in the loss's dtype; ops.fill (deprecated in 2.10) compiles slower
    if eager:
        return seed
    return seed, ops.zeros_like(items)


def forget_failed_forward(loss_and_items):
    """
    After a PYNATIVE call failed inside the recorded forward of `loss_and_items` (an error raised there), reset
    the gradient recording that MindSpore 2.10 leaves open; otherwise every later micro-batch's backward reruns
    its forward (BatchNorm would update its moving statistics twice); 2.7 does the same.
    """
    if context.get_context("mode") == context.PYNATIVE_MODE:
        forget_pynative_recording(loss_and_items)
