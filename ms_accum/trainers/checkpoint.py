"""Checkpoint writing that never leaves a half-written file under the final name, and loading with clear errors.

MindSpore's own ``save_checkpoint`` deletes an existing file before it writes the new one, so a crash in between
loses both. ``save_checkpoint_atomic`` writes a temporary file beside the target, flushes it to disk and renames
it over the target in one step.
"""
import os
import shutil

import mindspore as ms
from mindspore import nn, ops

from ..core.checks import check_ckpt_path

BUFFER_PREFIXES = ("accu_grads.", "grad_sum.", "accu_window.")
BUFFER_WRITERS = {"grad_sum.": "GradientAccumulation (the driver) or the three single-device cells",
                  "accu_grads.": "TrainAccuStepsCell (Model_ACCU) or Accumulator"}


def buffer_prefix(names):
    """The prefix of :data:`BUFFER_WRITERS` that the parameter `names` hold buffers under, or None."""
    names = list(names)
    return next((prefix for prefix in BUFFER_WRITERS if any(name.startswith(prefix) for name in names)), None)


def buffer_writer(names):
    """Which ms_accum paths keep their buffers under the parameter `names` (a description), or None."""
    prefix = buffer_prefix(names)
    return None if prefix is None else BUFFER_WRITERS[prefix]


def is_accumulation_buffer(name):
    """
    Whether a parameter name is a transient accumulation buffer or window counter.

    Those are ``grad_sum.*`` (the single-device cells and their window counters), ``accu_grads.*`` and
    ``accu_window.*`` (the parallel cells' buffers and counters). They are zero at every update boundary, so a
    checkpoint may omit them; everything else in a training cell (network, optimizer state, loss scale) is state.

    Args:
        name (str): A parameter name.

    Returns:
        bool.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum import is_accumulation_buffer
        >>> is_accumulation_buffer("accu_grads.fc.weight"), is_accumulation_buffer("moments.fc.weight")
        (True, False)
    """
    return name.startswith(BUFFER_PREFIXES)


class CheckpointError(ValueError):
    """
    A checkpoint file is missing, unreadable, or does not fit the network it is loaded into. A ValueError, so
    code that catches MindSpore's own checkpoint errors catches it too.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> try:
        ...     ms_accum.read_checkpoint("/tmp/no_such_file.ckpt")
        ... except ms_accum.CheckpointError as err:
        ...     print(err)
        'ckpt_path' must be an existing checkpoint file, but '/tmp/no_such_file.ckpt' does not exist.
    """


def save_checkpoint_atomic(save_obj, ckpt_path, choice_func=None, append_dict=None, keep_previous=None):
    """
    Save a checkpoint so that `ckpt_path` holds either the previous complete file or the new complete file.

    Args:
        save_obj (Union[Cell, list, dict]): What :func:`mindspore.save_checkpoint` accepts.
        ckpt_path (str): Target file; it must end with ``.ckpt``. Missing parent directories are created.
        choice_func (Callable[[str], bool], optional): Keeps the parameters whose name it accepts.
            Default: ``None`` (all).
        append_dict (dict, optional): Extra entries, as in :func:`mindspore.save_checkpoint`. Default: ``None``.
        keep_previous (str, optional): Where the file that `ckpt_path` held so far is kept (replaced atomically),
            once the new one is complete and before it takes the name. Default: ``None`` (not kept).

    Returns:
        str, the absolute path written.

    Raises:
        ValueError: If `ckpt_path` does not end with ``.ckpt``.
        OSError: If the file cannot be written; the previous file, if any, is left as it was.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import save_checkpoint_atomic
        >>> path = save_checkpoint_atomic(nn.Dense(2, 2), "/tmp/dense.ckpt")
    """
    check_ckpt_path("save_checkpoint_atomic", "ckpt_path", ckpt_path)
    target = os.path.abspath(ckpt_path)
    directory, name = os.path.split(target)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{name[:-5]}.partial-{os.getpid()}.ckpt")
    try:
        ms.save_checkpoint(save_obj, tmp, choice_func=choice_func, append_dict=append_dict)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        if keep_previous is not None and os.path.exists(target):
            _keep(target, os.path.abspath(keep_previous))
        os.replace(tmp, target)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def _keep(path, keep_path):
    """Give `keep_path` the contents of `path` atomically (a hard link where the file system has them)."""
    tmp = f"{keep_path}.partial-{os.getpid()}"
    try:
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copyfile(path, tmp)
        os.replace(tmp, keep_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_checkpoint(ckpt_path, arg_name="ckpt_path"):
    """
    Read a checkpoint file into a name-to-Parameter dict, with one clear error for every way it can fail.

    Args:
        ckpt_path (str): The checkpoint file.
        arg_name (str): The argument named in errors, where the path came from (``"resume_from"``, a
            command-line flag). Default: ``"ckpt_path"``.

    Returns:
        dict[str, Parameter], the checkpoint's contents.

    Raises:
        CheckpointError: If the file does not exist, is not a file, or cannot be parsed (truncated or not a
            checkpoint).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import read_checkpoint, save_checkpoint_atomic
        >>> path = save_checkpoint_atomic(nn.Dense(2, 2), "/tmp/dense.ckpt")
        >>> sorted(read_checkpoint(path))
        ['bias', 'weight']
    """
    if not os.path.exists(ckpt_path):
        raise CheckpointError(f"'{arg_name}' must be an existing checkpoint file, but {ckpt_path!r} does not exist.")
    if not os.path.isfile(ckpt_path):
        raise CheckpointError(f"'{arg_name}' must be a checkpoint file, but {ckpt_path!r} is not a file.")
    try:
        params = ms.load_checkpoint(ckpt_path)
    except (ValueError, RuntimeError, OSError, TypeError) as err:
        raise CheckpointError(f"'{arg_name}' must be a complete MindSpore checkpoint, but {ckpt_path!r} could not "
                              f"be read (truncated or not a checkpoint): {str(err).splitlines()[0]}") from err
    if not params:
        raise CheckpointError(f"'{arg_name}' must be a MindSpore checkpoint holding parameters, but {ckpt_path!r} "
                              f"holds none.")
    return params


def load_network_checkpoint(network, ckpt_path, optional=None):
    """
    Load a checkpoint into `network`, requiring every parameter of the network, with its shape.

    Entries the network does not have (optimizer state, the tutorial's ``grad_sum`` buffers) are ignored, so
    checkpoints of ms_accum's driver, of Model_ACCU and of the tutorial's forward-backward cell all load into a
    bare network. To resume training, pass the training cell (network and optimizer) and
    ``optional=is_accumulation_buffer``.

    Args:
        network (Cell): The cell to fill: a network, or a training cell holding network and optimizer.
        ckpt_path (str): The checkpoint file.
        optional (Callable[[str], bool], optional): Parameters of `network` whose name it accepts may be absent
            from the checkpoint (they keep their values). Default: ``None`` (all are required).

    Returns:
        dict[str, Parameter], the checkpoint's contents, including entries `network` does not have.

    Raises:
        CheckpointError: If the file cannot be read (see :func:`read_checkpoint`), or it lacks required
            parameters of `network` or holds them with other shapes (a checkpoint of another network).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import load_network_checkpoint, save_checkpoint_atomic
        >>> path = save_checkpoint_atomic(nn.Dense(2, 2), "/tmp/dense.ckpt")
        >>> params = load_network_checkpoint(nn.Dense(2, 2), path)
    """
    params = read_checkpoint(ckpt_path)
    load_into(network, params, ckpt_path, optional)
    return params


def _entry(params, name):
    """The checkpoint's entry for the Parameter `name`. A learning-rate rule's progress (``<prefix>.lr.*``) is also
    found under another path's prefix: the driver's cell keeps it under ``grad_sum.``, the parallel cells and
    Model_ACCU under ``accu_window.``, and a checkpoint of one path loads into the other with the run's progress."""
    found = params.get(name)
    if found is None and name.startswith(BUFFER_PREFIXES) and ".lr." in name:
        rest = name[name.index(".lr.") + 1:]
        found = next((params[prefix + rest] for prefix in BUFFER_PREFIXES if prefix + rest in params), None)
    return found


def _optimizer_state(network):
    """The names of the Parameters of the optimizers inside `network` that are their own (moments, step count,
    learning rate), not the weights they train."""
    optimizers = [cell for _, cell in network.cells_and_names() if isinstance(cell, nn.Optimizer)]
    weights = {param.name for optimizer in optimizers for param in optimizer.parameters}
    return {param.name for optimizer in optimizers for param in optimizer.get_parameters()} - weights


def load_into(network, params, ckpt_path, optional=None, arg_name="ckpt_path", what=None):
    """Load checkpoint contents already read from `ckpt_path` into `network`, with the checks of
    :func:`load_network_checkpoint`; errors name `arg_name` and call what was expected `what` (by default a
    checkpoint of the network's class)."""
    missing, mismatched = [], []
    for param in network.get_parameters():
        found = _entry(params, param.name)
        if found is None:
            if optional is None or not optional(param.name):
                missing.append(param.name)
        elif tuple(found.shape) != tuple(param.shape):
            mismatched.append(f"{param.name} {tuple(found.shape)} != {tuple(param.shape)}")
    if missing or mismatched:
        detail = (f"missing {missing[:5]}" if missing else "") + \
                 ("; " if missing and mismatched else "") + \
                 (f"shape mismatch {mismatched[:5]}" if mismatched else "")
        expected = what or f"a checkpoint of {type(network).__name__}"
        if set(missing + [entry.split(" ", 1)[0] for entry in mismatched]) <= _optimizer_state(network):
            raise CheckpointError(f"'{arg_name}' must be {expected}, but {ckpt_path!r} was written with another "
                                  f"optimizer, or one built otherwise (its state differs, the network's does not): "
                                  f"{detail}. Build the optimizer as the run that wrote it did, or load the network's "
                                  f"weights alone (ms_accum.load_network_checkpoint on the network) to train on with "
                                  f"this one.")
        raise CheckpointError(f"'{arg_name}' must be {expected}, but {ckpt_path!r} belongs to another network: "
                              f"{detail}.")
    for param in network.get_parameters():
        # written with an assign, which graphs the network has already run with read (load_param_into_net's
        # set_data detaches a Parameter from an ms.jit graph in PYNATIVE_MODE: write_parameter)
        found = _entry(params, param.name)
        if found is not None:
            ops.assign(param, found if found.dtype == param.dtype else ops.cast(found, param.dtype))
