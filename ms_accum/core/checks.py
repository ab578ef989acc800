"""Argument checks shared by every ms_accum entry point (a training run's own are in trainers/run_checks.py).

Each check raises with one message shape: "For 'Owner', 'arg' must be <expected>, but got <received>."
"""
import inspect
import math
import numbers

from mindspore import Parameter, ParameterTuple
from mindspore import dtype as mstype
from mindspore.nn import Cell

from ..compat import BatchNormBase
from .user_warning import warn

GRAD_SUM_RECIPE = "optimizer.parameters.clone(prefix='grad_sum', init='zeros')"
FLOAT_BYTES = {mstype.float16: 2, mstype.bfloat16: 2, mstype.float32: 4, mstype.float64: 8}


def check_positive_int(owner, arg_name, value):
    """Return `value` as an int if it is an integral number >= 1 (numpy integers too; bools and floats are
    refused), else raise TypeError or ValueError."""
    return check_int_at_least(owner, arg_name, value, 1)


def number_text_hint(value):
    """' Convert a number read from a command line: int('8').' when `value` is the text of an int, ' Pass the int
    8 ...' when it is a whole float (the result of '/'), else ''."""
    if isinstance(value, str) and value.strip().isdigit():
        return f" Convert a number read from a command line: int({value!r})."
    if isinstance(value, float) and value.is_integer() and value >= 1:
        return f" Pass the int {int(value)} (a float, such as the result of '/', is not taken: divide with '//')."
    return ""


def check_int_at_least(owner, arg_name, value, least, also=None):
    """Return `value` as an int if it is an integral number >= `least` (numpy integers too; bools and floats are
    refused), or the int of `also`, a pair (value, what it means) taken besides, such as Model's sink_size of -1;
    else raise TypeError or ValueError."""
    expected = f"an int >= {least}" if also is None else f"{also[0]} ({also[1]}) or an int >= {least}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"For '{owner}', '{arg_name}' must be {expected}, but got {value!r} "
                        f"of type {type(value).__name__}.{number_text_hint(value)}")
    if value < least and (also is None or value != also[0]):
        raise ValueError(f"For '{owner}', '{arg_name}' must be {expected}, but got {value}.")
    return int(value)


def check_cell(owner, arg_name, value):
    """Return `value` if it is a mindspore.nn.Cell (an instance: a Cell class is refused with the fix)."""
    if isinstance(value, type) and issubclass(value, Cell):
        raise TypeError(f"For '{owner}', '{arg_name}' must be a mindspore.nn.Cell, but got the class "
                        f"{value.__name__} itself. Pass an instance: {value.__name__}(...).")
    if not isinstance(value, Cell):
        raise TypeError(f"For '{owner}', '{arg_name}' must be a mindspore.nn.Cell, but got "
                        f"{type(value).__name__}.")
    return value


def check_optimizer(owner, optimizer):
    """Return `optimizer` if it is a Cell holding its `parameters` as a ParameterTuple (any mindspore.nn optimizer),
    none of them frozen (``requires_grad=False``): a compiled gradient, ms_accum's in PYNATIVE_MODE too, is taken
    for every parameter the optimizer holds, so a frozen one would train (eager PYNATIVE training leaves it)."""
    if not isinstance(optimizer, Cell) or not isinstance(getattr(optimizer, "parameters", None), ParameterTuple):
        raise TypeError(f"For '{owner}', 'optimizer' must be a mindspore.nn optimizer (a Cell with 'parameters'), "
                        f"for example nn.Momentum(net.trainable_params(), 0.01, 0.9), but got "
                        f"{type(optimizer).__name__}.")
    frozen = [p.name for p in optimizer.parameters if not p.requires_grad]
    if frozen:
        raise ValueError(f"For '{owner}', the optimizer's parameters must be trainable, but {len(frozen)} of them "
                         f"{'has' if len(frozen) == 1 else 'have'} requires_grad=False ({frozen[:3]}"
                         f"{' ...' if len(frozen) > 3 else ''}): a compiled graph computes and applies their gradient "
                         f"all the same, so they would train. Build the optimizer on the trainable ones, for example "
                         f"nn.Momentum(net.trainable_params(), 0.01, 0.9) (loss_net.trainable_params() when the loss "
                         f"has Parameters of its own).")
    return optimizer


def check_optimizer_trains(owner, optimizer, network, arg_name="network"):
    """Raise if none of the optimizer's parameters is a parameter of `network`: every gradient would be zero and
    nothing would train (an optimizer built on another network, say); warn if some are not."""
    own = {id(p) for p in network.get_parameters()}
    names = [p.name for p in optimizer.parameters]
    if not any(id(p) in own for p in optimizer.parameters):
        raise ValueError(f"For '{owner}', the optimizer's parameters must be parameters of '{arg_name}', but none of "
                         f"its {len(names)} ({names[:3]}{' ...' if len(names) > 3 else ''}) is: every gradient "
                         f"would be zero and nothing would train. Build the optimizer on the network you train, "
                         f"for example nn.Momentum(net.trainable_params(), 0.01, 0.9).")
    foreign = [p.name for p in optimizer.parameters if id(p) not in own]
    if foreign:
        warn(f"For '{owner}', {len(foreign)} of the optimizer's {len(names)} parameters are not parameters "
             f"of '{arg_name}' ({foreign[:3]}{' ...' if len(foreign) > 3 else ''}): their gradient is always "
             f"zero, so they move by weight decay and momentum alone. Build the optimizer on the network "
             f"you train, for example nn.Momentum(net.trainable_params(), 0.01, 0.9).")
    return optimizer


def check_choice(owner, arg_name, value, choices):
    """Return `value` if it is one of `choices`, else raise ValueError."""
    if value not in choices:
        raise ValueError(f"For '{owner}', '{arg_name}' must be one of {list(choices)}, but got {value!r}.")
    return value


def check_bool(owner, arg_name, value):
    """Return `value` if it is a bool, else raise TypeError."""
    if not isinstance(value, bool):
        raise TypeError(f"For '{owner}', '{arg_name}' must be a bool, but got {value!r} "
                        f"of type {type(value).__name__}.")
    return value


def check_sens(owner, value):
    """Return `value` as a float if it is a non-zero finite real number (numpy's too), else raise TypeError (not a
    number) or ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"For '{owner}', 'sens' must be a non-zero finite number, but got {value!r} of type "
                        f"{type(value).__name__}.")
    if not math.isfinite(value) or value == 0:
        raise ValueError(f"For '{owner}', 'sens' must be a non-zero finite number, but got {value!r}.")
    return float(value)


def check_finite_positive(owner, arg_name, value, alternative=""):
    """Return `value` as a float if it is a finite real number > 0, else raise TypeError or ValueError; the message
    offers `alternative` too (", or None for ...")."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"For '{owner}', '{arg_name}' must be a finite number > 0{alternative}, but got {value!r} "
                        f"of type {type(value).__name__}.")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"For '{owner}', '{arg_name}' must be a finite number > 0{alternative}, but got {value!r}.")
    return float(value)


def check_clip_norm(owner, clip_norm):
    """Return `clip_norm` as a float if it is a finite number > 0, or None (no clipping)."""
    if clip_norm is None:
        return None
    return check_finite_positive(owner, "clip_norm", clip_norm, ", or None for no clipping")


def check_grad_sum(owner, grad_sum, optimizer=None, network=None, arg_name="grad_sum"):
    """
    Return `grad_sum` if it is a ParameterTuple shaped like the optimizer's parameters and sharing no Parameter
    with the optimizer or the network (buffers that alias the weights would be zeroed by every clear).
    """
    if not isinstance(grad_sum, ParameterTuple) or not all(isinstance(p, Parameter) for p in grad_sum):
        raise TypeError(f"For '{owner}', '{arg_name}' must be a ParameterTuple, such as {GRAD_SUM_RECIPE}, "
                        f"but got {type(grad_sum).__name__}.")
    if not grad_sum:
        raise ValueError(f"For '{owner}', '{arg_name}' must hold at least one Parameter, but got an empty tuple.")
    owned = []
    if optimizer is not None:
        owned += list(optimizer.get_parameters())
        got = [tuple(p.shape) for p in grad_sum]
        expected = [tuple(p.shape) for p in optimizer.parameters]
        if got != expected:
            raise ValueError(f"For '{owner}', '{arg_name}' must match the optimizer's parameters one for one "
                             f"(shapes {expected}), but got shapes {got}. Build it with {GRAD_SUM_RECIPE}.")
        _check_buffer_dtypes(owner, arg_name, grad_sum, optimizer.parameters)
    if network is not None:
        owned += list(network.get_parameters())
    check_not_aliased(owner, arg_name, grad_sum, owned)
    return grad_sum


def _check_buffer_dtypes(owner, arg_name, buffers, params):
    """Raise if a buffer holds its float parameter's gradients in a narrower or another float type than the
    parameter's (float16 for a float32 parameter, bfloat16 for a float16 one): each micro-batch's gradient would be
    rounded to it as it is added, and a loss-scaled gradient would overflow where the parameter's type holds it."""
    for buffer, param in zip(buffers, params):
        want = FLOAT_BYTES.get(param.dtype)
        if want is None or buffer.dtype == param.dtype or FLOAT_BYTES.get(buffer.dtype, 0) > want:
            continue
        raise ValueError(f"For '{owner}', '{arg_name}' must hold each gradient in its parameter's type or a wider "
                         f"float, but its buffer '{buffer.name}' is {buffer.dtype} for the {param.dtype} parameter "
                         f"'{param.name}': every micro-batch's gradient would be rounded to {buffer.dtype} as it is "
                         f"added. Build it with {GRAD_SUM_RECIPE} (float32 buffers for float16 parameters are "
                         f"taken too).")


def check_not_aliased(owner, arg_name, buffers, owned):
    """Raise if a buffer is one of the `owned` Parameters (the network's weights or the optimizer's state)."""
    owned_ids = {id(p) for p in owned}
    shared = [p.name for p in buffers if id(p) in owned_ids]
    if shared:
        raise ValueError(f"For '{owner}', '{arg_name}' must be separate buffers, but it holds the network's or "
                         f"optimizer's own Parameters {shared[:3]}{' ...' if len(shared) > 3 else ''}: clearing "
                         f"it would zero the weights. Build it with {GRAD_SUM_RECIPE}.")


def check_ckpt_path(owner, arg_name, path):
    """Raise unless `path` is a str naming a MindSpore checkpoint file (ending with '.ckpt')."""
    if not isinstance(path, str) or not path.endswith(".ckpt"):
        raise ValueError(f"For '{owner}', '{arg_name}' must be a str ending with '.ckpt', but got {path!r}.")


def normalises_by_batch(cell):
    """Whether `cell` is a BatchNorm layer (any of MindSpore's ``_BatchNorm``, SyncBatchNorm included) that
    normalises by the batch's statistics in training mode: not one built with ``use_batch_statistics=False``,
    which normalises by its moving statistics in either mode and leaves them as they are."""
    return isinstance(cell, BatchNormBase) and getattr(cell, "use_batch_statistics", None) is not False


def drops(cell):
    """Whether `cell` is a dropout layer (a layer without sub-cells whose class name says Dropout or DropPath:
    MindSpore's Dropout layers, the Dropout inside MindCV's DropPath) that drops something in training mode: its
    probability (``p``, ``prob`` or ``drop_prob``) above 0, or not known."""
    name = type(cell).__name__
    if "Dropout" not in name and "DropPath" not in name or any(True for _ in cell.cells()):
        return False
    for attr in ("p", "prob", "drop_prob"):
        value = getattr(cell, attr, None)
        if isinstance(value, numbers.Number) and not isinstance(value, bool):
            return value > 0
    return True


def _mode_dependent(cell):
    """Whether `cell` computes otherwise in training mode: a BatchNorm layer that normalises by batch statistics
    (its moving statistics updated) or a dropout that drops something."""
    return normalises_by_batch(cell) or drops(cell)


def construct_inputs(network):
    """(the inputs `network`'s construct needs, the most it takes, their names joined) for positional inputs; None
    where it takes ``*inputs`` or Python cannot read its signature (nothing to check then)."""
    try:
        parameters = list(inspect.signature(network.construct).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return sum(p.default is p.empty for p in positional), len(positional), ", ".join(p.name for p in positional)


def inputs_text(required, most):
    """'2', or '1 to 2' where some inputs have defaults: how many inputs a construct takes, as messages say it."""
    return f"{required}" if required == most else f"{required} to {most}"


def check_call_inputs(cell, args, kwargs):
    """At the first call of `cell` with positional inputs only (a training cell holding the user's loss network in
    its LossAndItems, named by its ``owner_name``), raise if the loss network's construct cannot take as many: a
    network without its loss, called with the data and the label, failed in MindSpore naming neither the cell nor
    the fix (a new user's trial). A construct taking ``*inputs`` is not checked; later calls return at once."""
    if getattr(cell, "_inputs_checked", False) or not args or kwargs:
        return
    network = cell.network.network
    taken = construct_inputs(network)
    if taken is not None and not taken[0] <= len(args) <= taken[1]:
        raise TypeError(f"For '{cell.owner_name}', a call's inputs are passed to the loss network, "
                        f"{type(network).__name__}.construct({taken[2]}), which takes {inputs_text(*taken[:2])} "
                        f"input{'' if taken[1] == 1 else 's'}, but the call gave {len(args)}. Call the cell with the "
                        f"inputs the loss network takes; a network without its loss takes the data alone: to train "
                        f"it on (data, label), pass nn.WithLossCell(net, loss_fn).")
    cell._inputs_checked = True  # pylint: disable=protected-access


def warn_steps_unset(cell, owner=None):
    """Once a cell, warn if N was never given to a parallel cell (``TrainAccuStepsCell`` and its loss-scale variant
    default to 1): it then updates at every call, accumulating nothing, which a cell built to accumulate and called
    without it did in silence. Called at its first call in the automatic mode and when Model_ACCU plans a run
    without N. Returns whether it warned."""
    if not getattr(cell, "_steps_unset", False):
        return False
    cell._steps_unset = False  # pylint: disable=protected-access
    sens = getattr(cell, "sens", 1.0)
    hint = ""
    if isinstance(sens, float) and sens >= 2 and sens.is_integer():  # TrainAccuStepsCell(net, opt, 4): a trial
        hint = (f" Its 'sens' is {sens:g}, which multiplies every gradient: the third positional argument is 'sens', "
                f"as in nn.TrainOneStepCell; for N = {sens:g}, pass gradient_accumulation_steps={sens:g}.")
    warn(f"For '{owner or cell.owner_name}', N ('gradient_accumulation_steps') was not given to "
         f"{cell.owner_name} or to any call, so it is 1: every call updates the parameters and no gradient is "
         f"accumulated. Pass gradient_accumulation_steps=N to the cell, to Model_ACCU or to its train(); pass 1 to "
         f"update at every call without this warning.{hint}", UserWarning)
    return True


def warn_eval_mode(cell):
    """At the first call of `cell` (a training cell holding the user's network in its LossAndItems, named by its
    ``owner_name``), warn if every layer of the network that computes otherwise in training mode (BatchNorm,
    dropout) is in inference mode, as MindSpore builds every Cell: the training cells called from a user's loop,
    like :class:`mindspore.nn.TrainOneStepCell`, do not switch it (``Model.train`` and the trainers do). A network in
    training mode itself (its BatchNorm frozen on purpose), one whose such layers are partly in training mode, or
    one with no such layer is left alone. Later calls return at once. Returns whether it warned."""
    if getattr(cell, "_mode_checked", False):
        return False
    cell._mode_checked = True  # pylint: disable=protected-access
    owner, network = cell.owner_name, cell.network.network
    layers = [(name, layer) for name, layer in network.cells_and_names() if _mode_dependent(layer)]
    if not layers or network.training or any(layer.training for _, layer in layers):
        return False
    shown = ", ".join(f"'{name}' ({type(layer).__name__})" for name, layer in layers[:3])
    more = f" and {len(layers) - 3} more" if len(layers) > 3 else ""
    noun, verb = ("layers", "are") if len(layers) > 1 else ("layer", "is")
    warn(f"For '{owner}', the network must be in training mode to train, but its {noun} {shown}{more} "
         f"{verb} in inference mode (MindSpore builds every Cell so): BatchNorm normalises with its moving "
         f"statistics and leaves them as they are, dropout drops nothing. Call set_train(True) on the cell "
         f"(or the network) before training, as mindspore.train.Model does.", UserWarning)
    return True
