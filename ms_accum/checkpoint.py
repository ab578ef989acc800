"""Checkpoint writing that never leaves a half-written file under the final name, and loading with clear errors.

MindSpore's own ``save_checkpoint`` deletes an existing file before it writes the new one, so a crash in between
loses both. ``save_checkpoint_atomic`` writes a temporary file beside the target, flushes it to disk and renames
it over the target in one step.
"""
import os
from contextlib import contextmanager

import mindspore as ms


BUFFER_PREFIXES = ("accu_grads.", "grad_sum.")
WINDOW_COUNTERS = ("accu_samples", "accu_loss", "accu_micro_steps", "accu_overflow", "accu_last_samples",
                   "accu_last_grad_norm")


def is_accumulation_buffer(name):
    """
    Whether a parameter name is a transient accumulation buffer or window counter.

    Those are ``grad_sum.*`` (the single-device cells and their window counters), ``accu_grads.*`` and the
    ``accu_*`` counters of the parallel cells. They are zero at every update boundary, so a checkpoint may omit
    them; everything else in a training cell (network, optimizer state, loss scale) is state.

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
    return name.startswith(BUFFER_PREFIXES) or name in WINDOW_COUNTERS


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, or does not fit the network it is loaded into."""


def save_checkpoint_atomic(save_obj, ckpt_path, choice_func=None, append_dict=None):
    """
    Save a checkpoint so that `ckpt_path` holds either the previous complete file or the new complete file.

    Args:
        save_obj (Union[Cell, list, dict]): What :func:`mindspore.save_checkpoint` accepts.
        ckpt_path (str): Target file; it must end with ``.ckpt``. Missing parent directories are created.
        choice_func (Callable[[str], bool], optional): Keeps the parameters whose name it accepts.
            Default: ``None`` (all).
        append_dict (dict, optional): Extra entries, as in :func:`mindspore.save_checkpoint`. Default: ``None``.

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
    if not isinstance(ckpt_path, str) or not ckpt_path.endswith(".ckpt"):
        raise ValueError(f"For 'save_checkpoint_atomic', 'ckpt_path' must be a str ending with '.ckpt', "
                         f"but got {ckpt_path!r}.")
    target = os.path.abspath(ckpt_path)
    directory, name = os.path.split(target)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{name[:-5]}.partial-{os.getpid()}.ckpt")
    try:
        ms.save_checkpoint(save_obj, tmp, choice_func=choice_func, append_dict=append_dict)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
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


def read_checkpoint(ckpt_path):
    """
    Read a checkpoint file into a name-to-Parameter dict, with one clear error for every way it can fail.

    Args:
        ckpt_path (str): The checkpoint file.

    Returns:
        dict[str, Parameter], the checkpoint's contents.

    Raises:
        CheckpointError: If the file does not exist, is not a file, or cannot be parsed (truncated or not a
            checkpoint).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum import read_checkpoint
        >>> params = read_checkpoint("/tmp/dense.ckpt")
    """
    if not os.path.exists(ckpt_path):
        raise CheckpointError(f"'ckpt_path' must be an existing checkpoint file, but {ckpt_path!r} does not exist.")
    if not os.path.isfile(ckpt_path):
        raise CheckpointError(f"'ckpt_path' must be a checkpoint file, but {ckpt_path!r} is not a file.")
    try:
        params = ms.load_checkpoint(ckpt_path)
    except (ValueError, RuntimeError, OSError, TypeError) as err:
        raise CheckpointError(f"'ckpt_path' must be a complete MindSpore checkpoint, but {ckpt_path!r} could not "
                              f"be read (truncated or not a checkpoint): {str(err).splitlines()[0]}") from err
    if not params:
        raise CheckpointError(f"'ckpt_path' must be a MindSpore checkpoint holding parameters, but {ckpt_path!r} "
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
        >>> from ms_accum import load_network_checkpoint
        >>> params = load_network_checkpoint(nn.Dense(2, 2), "/tmp/dense.ckpt")
    """
    params = read_checkpoint(ckpt_path)
    missing, mismatched = [], []
    for param in network.get_parameters():
        found = params.get(param.name)
        if found is None:
            if optional is None or not optional(param.name):
                missing.append(param.name)
        elif tuple(found.shape) != tuple(param.shape):
            mismatched.append(f"{param.name} {tuple(found.shape)} != {tuple(param.shape)}")
    if missing or mismatched:
        detail = (f"missing {missing[:5]}" if missing else "") + \
                 ("; " if missing and mismatched else "") + \
                 (f"shape mismatch {mismatched[:5]}" if mismatched else "")
        raise CheckpointError(f"'ckpt_path' must be a checkpoint of {type(network).__name__}, but {ckpt_path!r} "
                              f"belongs to another network: {detail}.")
    ms.load_param_into_net(network, params)
    return params


MICRO_STEPS_DONE = "ms_accum_micro_steps_done"
UPDATES_DONE = "ms_accum_updates_done"


def save_training_state(cell, state_path, micro_steps_done, updates_done):
    """
    Write a training cell's exact state atomically, with the run's position: micro-batches and updates done.

    The cell (TrainForwardBackward for the driver, the accumulation cell for Model_ACCU) holds the network, the
    optimizer state, the gradient buffers and the window counters, so a window may be half full.

    Args:
        cell (Cell): The training cell.
        state_path (str): Target file, ending with ``.ckpt``.
        micro_steps_done (int): Micro-batches consumed since the start of training.
        updates_done (int): Windows begun since the start of training (callbacks' ``cur_step_num``).

    Returns:
        str, the absolute path written.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> # ms_accum.save_training_state(trainer.forward_backward, "runs/state.ckpt", 37, 9)
    """
    return save_checkpoint_atomic(cell, state_path,
                                  append_dict={MICRO_STEPS_DONE: micro_steps_done, UPDATES_DONE: updates_done})


def load_training_state(cell, state_path, total_micro_steps):
    """
    Load a state file written by :func:`save_training_state` into `cell`.

    Args:
        cell (Cell): The training cell, built like the one that was saved.
        state_path (str): The state file.
        total_micro_steps (int): Micro-batches of the whole run being resumed (epochs x micro-batches per epoch).

    Returns:
        tuple[int, int], micro-batches and updates done when the state was written.

    Raises:
        CheckpointError: If the file is unreadable, belongs to another model, records no position, or was written
            at or past the end of this run.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> # micro_done, updates_done = ms_accum.load_training_state(cell, "runs/state.ckpt", 10 * 1875)
    """
    params = load_network_checkpoint(cell, state_path)
    if MICRO_STEPS_DONE not in params or UPDATES_DONE not in params:
        raise CheckpointError(f"'resume_from' must be a training state file (written with 'state_path'), but "
                              f"{state_path!r} does not record the position in the data.")
    micro_done = int(params[MICRO_STEPS_DONE].asnumpy())
    if not 0 <= micro_done < total_micro_steps:
        raise CheckpointError(f"'resume_from' {state_path!r} was written after {micro_done} micro-batches, but this "
                              f"run has only {total_micro_steps}: raise 'epoch' to continue it.")
    return micro_done, int(params[UPDATES_DONE].asnumpy())


def save_training_state_if_due(cell, state_path, save_state_every, micro_steps_done, total_micro_steps,
                               updates_done):
    """Call :func:`save_training_state` when `save_state_every` (> 0) divides the micro-batches done, before the
    run's end; return whether it wrote."""
    due = bool(save_state_every) and micro_steps_done % save_state_every == 0 \
        and micro_steps_done < total_micro_steps
    if due:
        save_training_state(cell, state_path, micro_steps_done, updates_done)
    return due


@contextmanager
def dataset_starting_at(dataset, micro_steps_done):
    """
    Iterators created inside the block start after `micro_steps_done` micro-batches, in the order of an
    uninterrupted run (MindSpore's dataset init step replays the earlier epochs' shuffles); the dataset is left
    as it was afterwards.
    """
    if not micro_steps_done:
        yield dataset
        return
    dataset.set_init_step(micro_steps_done)
    try:
        yield dataset
    finally:
        dataset.set_init_step(0)
