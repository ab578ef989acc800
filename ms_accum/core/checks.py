"""Argument checks shared by every ms_accum entry point.

Each check raises with one message shape: "For 'Owner', 'arg' must be <expected>, but got <received>."
"""
import inspect
import math
import numbers
import warnings

from mindspore import Parameter, ParameterTuple, Tensor
from mindspore.dataset import Dataset
from mindspore.nn import Cell, CellList

from ..compat import BatchNormBase

GRAD_SUM_RECIPE = "optimizer.parameters.clone(prefix='grad_sum', init='zeros')"


def check_positive_int(owner, arg_name, value):
    """Return `value` as an int if it is an integral number >= 1 (numpy integers too; bools and floats are
    refused), else raise TypeError or ValueError."""
    return check_int_at_least(owner, arg_name, value, 1)


def check_int_at_least(owner, arg_name, value, least):
    """Return `value` as an int if it is an integral number >= `least` (numpy integers too; bools and floats are
    refused), else raise TypeError or ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"For '{owner}', '{arg_name}' must be an int >= {least}, but got {value!r} "
                        f"of type {type(value).__name__}.")
    if value < least:
        raise ValueError(f"For '{owner}', '{arg_name}' must be an int >= {least}, but got {value}.")
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


def check_dataset(owner, dataset, arg_name="train_dataset"):
    """Return the rows per epoch of `dataset` (its micro-batches) if it is a mindspore.dataset.Dataset that yields
    at least one, else raise TypeError or ValueError."""
    if not isinstance(dataset, Dataset):
        raise TypeError(f"For '{owner}', '{arg_name}' must be a batched mindspore.dataset.Dataset (each row one "
                        f"micro-batch), but got {type(dataset).__name__}. Wrap arrays in "
                        f"mindspore.dataset.NumpySlicesDataset({{'x': x, 'y': y}}).batch(micro_batch_size), or a "
                        f"Python iterable in mindspore.dataset.GeneratorDataset.")
    size = dataset.get_dataset_size()
    if size < 1:
        raise ValueError(f"For '{owner}', '{arg_name}' must yield at least one batch per epoch, but it is empty. "
                         f"Check the data path, or a batch size larger than the data set with drop_remainder=True.")
    return size


def check_dataset_columns(owner, dataset, network, arg_name="train_dataset", hint=""):
    """Raise if each row of `dataset` (its columns, in order) cannot be the positional inputs of `network`'s
    construct, to which the trainers pass them: MindSpore's own error names neither the dataset nor its columns.
    A construct taking ``*inputs``, or whose signature Python cannot read, is not checked. `hint` ends the
    message."""
    try:
        parameters = list(inspect.signature(network.construct).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    columns = dataset.get_col_names()
    if required <= len(columns) <= len(positional):
        return
    takes = f"{required}" if required == len(positional) else f"{required} to {len(positional)}"
    names = ", ".join(p.name for p in positional)
    raise ValueError(f"For '{owner}', each row of '{arg_name}' is passed to {type(network).__name__}.construct("
                     f"{names}), which takes {takes} inputs, but the dataset has {len(columns)} columns {columns}. "
                     f"Keep the columns it takes, in its order, with {arg_name}.project([...]) (or map them into "
                     f"it), or give the network a construct that takes them all.{hint}")


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
        warnings.warn(f"For '{owner}', {len(foreign)} of the optimizer's {len(names)} parameters are not parameters "
                      f"of '{arg_name}' ({foreign[:3]}{' ...' if len(foreign) > 3 else ''}): their gradient is always "
                      f"zero, so they move by weight decay and momentum alone. Build the optimizer on the network "
                      f"you train, for example nn.Momentum(net.trainable_params(), 0.01, 0.9).", stacklevel=3)
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
    """Return `value` as a float if it is a non-zero finite real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value == 0:
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
    if network is not None:
        owned += list(network.get_parameters())
    check_not_aliased(owner, arg_name, grad_sum, owned)
    return grad_sum


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


def check_state_saving(owner, state_path, save_state_every):
    """Raise unless `save_state_every` is an int >= 0, and > 0 only together with a `state_path`."""
    if isinstance(save_state_every, bool) or not isinstance(save_state_every, int) or save_state_every < 0 \
            or (save_state_every and state_path is None):
        raise ValueError(f"For '{owner}', 'save_state_every' must be an int >= 0, and > 0 only with a "
                         f"'state_path', but got {save_state_every!r} with state_path={state_path!r}.")


def check_resume_or_initial_epoch(owner, resume_from, initial_epoch):
    """Raise if both a state file and an initial epoch say where training starts."""
    if resume_from is not None and initial_epoch:
        raise ValueError(f"For '{owner}', pass either 'resume_from' or 'initial_epoch', not both: the state file "
                         f"records where training stopped.")


def check_lr_schedule(owner, optimizer, micro_steps, updates, from_start=True, adaptive=False):
    """
    Raise if the optimizer's learning-rate list is too short for the run; warn if it may have one entry per
    micro-batch instead of one per update.

    A list or 1-D Tensor learning rate is indexed by the optimizer's global_step, which advances once per window.
    With `from_start` (the run begins at its first epoch, so all its `updates` are ahead), the updates already done
    (the optimizer's global_step) and this run's must fit in the list: past its end the optimizer fails mid-run
    (MindSpore 2.10 on CPU: "For 'Gather', the 'input_indices' should be in the range"), after the updates before
    it were spent. A list built with `micro_steps` entries (the count of micro-batches in the run) was likely built
    for the wrong unit and would stretch the schedule by the accumulation factor. It may also be a per-update list
    for a longer run trained over several calls (one epoch per call, say), so this warns instead of raising, and
    not when the updates already done and this run's fill the list exactly. With `adaptive` (an adaptive N),
    `updates` is the most the run may take: every window at the policy's smallest N.
    """
    if not getattr(optimizer, "dynamic_lr", False):
        return
    done = None  # the updates already done, read from the device only for a list
    rates = optimizer.learning_rate
    for rate in rates if isinstance(rates, (tuple, list, CellList)) else (rates,):
        table = getattr(rate, "learning_rate", rate)  # a list or Tensor rate is wrapped in _IteratorLearningRate
        length = table.shape[0] if isinstance(table, Tensor) and len(table.shape) == 1 else None
        if length is None:
            continue
        if done is None:
            done = int(optimizer.global_step.asnumpy().reshape(-1)[0])
        if from_start and done + updates > length:
            needs = "may need" if adaptive else "needs"
            ahead = f"up to {updates} in it, every window at the policy's min_steps" if adaptive else \
                f"{updates} in it"
            raise ValueError(f"For '{owner}', the optimizer's learning-rate list must have an entry for every update, "
                             f"but it has {length} and this run {needs} {done + updates} ({done} done before it, "
                             f"{ahead}): the optimizer would read past its end at update {length + 1} and fail "
                             f"there. Give it {done + updates} entries, one per update, or use a "
                             f"LearningRateSchedule, which has no end.")
        if not adaptive and micro_steps != updates and length == micro_steps and length != done + updates:
            warnings.warn(f"For '{owner}', the optimizer's learning-rate list has {length} entries, one per "
                          f"micro-batch of this run, but the optimizer reads one entry per update ({updates} in this "
                          f"run): a schedule built per micro-batch is stretched {micro_steps / updates:.3g} times (its "
                          f"warm-up and decay take that many times more updates than planned, and this run ends "
                          f"at update {updates} of its {length}). Build it with one entry per update. (A per-update "
                          f"list for a longer run, trained over several calls, is right as it is.)", UserWarning,
                          stacklevel=3)
            return


def is_batch_norm(cell):
    """Whether `cell` is a BatchNorm layer (any of MindSpore's ``_BatchNorm``, SyncBatchNorm included)."""
    return isinstance(cell, BatchNormBase)


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
    """Whether `cell` computes otherwise in training mode: a BatchNorm layer (batch statistics, moving statistics
    updated) or a dropout that drops something."""
    return is_batch_norm(cell) or drops(cell)


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
    warnings.warn(f"For '{owner}', the network must be in training mode to train, but its {noun} {shown}{more} "
                  f"{verb} in inference mode (MindSpore builds every Cell so): BatchNorm normalises with its moving "
                  f"statistics and leaves them as they are, dropout drops nothing. Call set_train(True) on the cell "
                  f"(or the network) before training, as mindspore.train.Model does.", UserWarning, stacklevel=3)
    return True
