"""Exact training state: written every few micro-batches, resumed at the exact micro-batch, on every rank.

A state file holds a training cell (network, optimizer state, gradient buffers and window counters, so a window
may be half full) and the run's position: micro-batches done and windows begun, and the rank and device count that
wrote it. Each write keeps the previous generation beside it (``<name>.prev.ckpt``). In data parallel every rank
writes its own file at update boundaries only, so two ranks' newest files differ by at most one generation even
when a crash falls between their writes; on resume the ranks agree on the newest position that all of them
hold, and refuse to start if there is none.
"""
import os
from contextlib import contextmanager

import numpy as np
from mindspore import Parameter, nn

from ..core.compiled import write_parameter
from ..core.checks import check_ckpt_path, check_int_at_least, check_positive_int
from ..core.deprecation import renamed_argument
from ..core.engine import WindowEngine
from ..core.user_warning import warn
from .checkpoint import CheckpointError, buffer_writer, load_into, read_checkpoint, save_checkpoint_atomic
from .elastic import (check_same_global_batch, check_same_partial_window, count, elastic_position, moves,
                      resume_notice, saved_layout)

MICRO_BATCHES_DONE = "ms_accum_micro_steps_done"  # the file's key, as every format has written it
UPDATES_DONE = "ms_accum_updates_done"
RANK = "ms_accum_rank"
WORLD = "ms_accum_world"
FORMAT = "ms_accum_state_format"
STATE_FORMAT = 5  # 1: ms_accum 0.1.0 (no FORMAT entry); 2: 0.2.0, which added '.steps'; 3: 0.3.0, which added
#                    the skip records (ADDED_IN_FORMAT_3) and may add the run's layout (elastic.LAYOUT_KEYS, read
#                    only when present);
#                    4: '.items_unit', written between 0.3.0 and 0.4.0 (never released); 5: ms_accum 0.4.0, the
#                    one-device driver's state its engine cell's, with the cell's window count and N
ADDED_IN_FORMAT_2 = (".steps",)
ADDED_IN_FORMAT_3 = (".skipped_windows", ".nonfinite_streak", ".skip_history")
ADDED_IN_FORMAT_4 = (".items_unit",)
ADDED_IN_FORMAT_5 = (".windows", ".overflow")
DRIVER_STEPS_BEFORE_FORMAT_5 = "ms_accum_window_steps"  # the driver's N, kept on its own before format 5


def _added_since_format_1(name):
    """Parameters a state file of ms_accum 0.1.0 cannot hold: the N an adaptive policy chose ('<prefix>.steps'),
    which no 0.1.0 cell had (its initial value is right for every N 0.1.0 could take), and the counts of skipped
    windows (0.1.0 counted none: they start from 0)."""
    return name.endswith(ADDED_IN_FORMAT_2 + ADDED_IN_FORMAT_3)


def _added_since(saved_format, name):
    """Whether a state file of `saved_format` may lack the Parameter `name`: those of :func:`_added_since_format_1`,
    and before format 4 the items of the open window's first micro-batch, to which the buffers of ms_accum 0.4.0
    hold their gradients relative (older states hold them weighted by the items themselves: relative to 1.0); before
    format 5, what :func:`_from_earlier_formats` fills in."""
    if saved_format < 2 and _added_since_format_1(name):
        return True
    if saved_format < 3 and name.endswith(ADDED_IN_FORMAT_3):  # no skip counted before 0.3.0: they start from 0
        return True
    if saved_format < 5 and name.endswith(ADDED_IN_FORMAT_5 + (".steps",)):  # the driver's N had a name of its own
        return True
    return saved_format < 4 and name.endswith(ADDED_IN_FORMAT_4)


def _from_earlier_formats(cell, params, updates):
    """Before format 5 the driver kept N in a Parameter of its own and counted windows on the host: its N goes
    to the cell's '<prefix>.steps', its window count ('<prefix>.windows') is the windows begun less the open one,
    and a loss scale's overflow flag starts cleared (the next micro-batch finds an inf the buffers hold)."""
    names = {param.name: param for param in cell.get_parameters()}
    if DRIVER_STEPS_BEFORE_FORMAT_5 in params:
        for name, param in names.items():
            if name.endswith(".steps") and name not in params:
                write_parameter(param, int(params[DRIVER_STEPS_BEFORE_FORMAT_5].asnumpy()))
    for name, param in names.items():
        if name.endswith(".windows") and name not in params:
            held = params.get(name[:-len(".windows")] + ".micro_steps")
            open_window = held is not None and int(held.asnumpy()) > 0
            write_parameter(param, updates - (1 if open_window else 0))


def previous_generation(state_path):
    """Where the generation before `state_path`'s is kept: 'train_state.ckpt' -> 'train_state.prev.ckpt'."""
    return f"{state_path[:-len('.ckpt')]}.prev.ckpt"


def is_state_file(params):
    """Whether checkpoint contents are a training state (they record the position in the data)."""
    return MICRO_BATCHES_DONE in params and UPDATES_DONE in params


class _Together(nn.Cell):
    """Several cells saved and loaded as one, their Parameters under their own names (no prefix is added)."""

    def __init__(self, cells):
        super().__init__(auto_prefix=False)
        for index, cell in enumerate(cells):
            self.insert_child_to_cell(f"cell_{index}", cell)


def _state_cell(owner, cell):
    """`cell` as one Cell to save or load: a Cell, or a tuple or list of Cells (a network and the Accumulator that
    trains it) whose Parameters have distinct names."""
    if isinstance(cell, nn.Cell):
        return cell
    if not isinstance(cell, (tuple, list)) or not cell or not all(isinstance(c, nn.Cell) for c in cell):
        raise TypeError(f"For '{owner}', 'cell' must be a Cell, or a tuple or list of Cells (such as (network, "
                        f"accumulator)), but got {type(cell).__name__}"
                        f"{' of ' + str([type(c).__name__ for c in cell]) if isinstance(cell, (tuple, list)) else ''}.")
    together = _Together(cell)
    seen = {}
    for param in together.get_parameters():  # each Parameter once, even when two cells share it
        if param.name in seen:
            raise ValueError(f"For '{owner}', the Parameters of the cells in 'cell' must have distinct names, but two "
                             f"different Parameters are named {param.name!r}: a state file keeps one value per name. "
                             f"Make them attributes of one parent Cell (which prefixes their names with the "
                             f"attributes') and save and load that Cell.")
        seen[param.name] = param
    return together


def _warn_without_network(owner, cell):
    """Warn when `cell` is an ms_accum cell that does not hold the network (Accumulator, TrainOptim, TrainClear):
    the network's Parameters outside the optimizer would not be in the state."""
    if isinstance(cell, WindowEngine) and getattr(cell, "network", None) is None:
        kind = type(cell).__name__
        warn(f"For '{owner}', 'cell' ({kind}) holds the optimizer's parameters and the open window but not "
             f"the network: the network's other Parameters (BatchNorm moving statistics, frozen weights) "
             f"are not saved or loaded with it. Pass the network with it, as a tuple "
             f"(network, {kind.lower() if kind == 'Accumulator' else 'cell'}), to keep them.", UserWarning)


def save_training_state(cell, state_path, micro_batches_done=None, updates_done=None, rank=0, world=1, layout=None,
                        open_window=0, *, micro_steps_done=None):
    """
    Write a training cell's exact state atomically, keeping the previous generation.

    Args:
        cell (Union[Cell, tuple[Cell]]): The training cell (TrainForwardBackward for the driver and the three
            cells, the accumulation cell for Model_ACCU), or several cells saved together: an
            :class:`Accumulator` does not hold the network, so pass ``(network, accumulator)`` to keep the
            network's Parameters that the optimizer does not train (BatchNorm moving statistics, frozen weights).
            An :class:`Accumulator`, :class:`TrainOptim` or :class:`TrainClear` alone is saved with a warning.
        state_path (str): Target file, ending with ``.ckpt``; the previous file moves to
            ``<name>.prev.ckpt``.
        micro_batches_done (int): Micro-batches consumed since the start of training.
        updates_done (int): Windows begun since the start of training (callbacks' ``cur_step_num``).
        rank (int): This process's rank. Default: ``0``.
        world (int): The number of data-parallel processes. Default: ``1``.
        layout (RunLayout, optional): How the run cuts its data into windows (its global batch); recorded so that
            :func:`load_training_state` can resume the state on another device count. Default: ``None``.
        open_window (int): Micro-batches of the open window when `layout` is given (0 at an update boundary).
            Default: ``0``.
        micro_steps_done (int): Deprecated: `micro_batches_done`, its name before ms_accum 0.4.0 (keyword only;
            removed in 0.5.0).

    Returns:
        str, the absolute path written.

    Raises:
        TypeError: If `cell` is neither a Cell nor a tuple or list of Cells, or `micro_batches_done`,
            `updates_done`, `rank`, `world` or `open_window` is not an int.
        ValueError: If `state_path` does not end with ``.ckpt``, two Parameters of the cells share a name,
            `micro_batches_done`, `updates_done`, `rank` or `open_window` is < 0, `world` < 1, `rank` >= `world`,
            or `updates_done` or `open_window` is above `micro_batches_done`.
        OSError: If the file cannot be written; the previous generations are left as they were.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
        >>> cell = ms_accum.TrainForwardBackward(nn.WithLossCell(net, nn.MSELoss()), optimizer, grad_sum)
        >>> path = ms_accum.save_training_state(cell, "/tmp/saved_state.ckpt", micro_batches_done=37,
        ...                                     updates_done=9)
        >>> ms_accum.load_training_state(cell, path, total_micro_batches=100)
        ms_accum: resuming /tmp/saved_state.ckpt at 37 micro-batches done, 9 windows begun.
        (37, 9)
    """
    owner = "save_training_state"
    micro_batches_done = renamed_argument(owner, "micro_steps_done", "micro_batches_done", micro_steps_done,
                                          micro_batches_done)
    check_ckpt_path(owner, "state_path", state_path)
    micro_batches_done, updates_done, rank, open_window = (
        check_int_at_least(owner, name, value, 0) for name, value in (
            ("micro_batches_done", micro_batches_done), ("updates_done", updates_done), ("rank", rank),
            ("open_window", open_window)))
    world = check_positive_int(owner, "world", world)
    if rank >= world:
        raise ValueError(f"For '{owner}', 'rank' must be < 'world' ({world}), but got {rank}.")
    for name, value in (("updates_done", updates_done), ("open_window", open_window)):
        if value > micro_batches_done:
            raise ValueError(f"For '{owner}', '{name}' must be <= 'micro_batches_done' ({micro_batches_done}): "
                             f"each window begun holds at least one of this process's micro-batches, but got {value}. "
                             f"Pass the counts of the run being saved (a callback's cb_params.cur_step_num and the "
                             f"micro-batches it has consumed).")
    entries = {MICRO_BATCHES_DONE: micro_batches_done, UPDATES_DONE: updates_done, RANK: rank, WORLD: world,
               FORMAT: STATE_FORMAT}
    if layout is not None:
        entries.update(layout.entries(open_window))
    _warn_without_network("save_training_state", cell)
    return save_checkpoint_atomic(_state_cell("save_training_state", cell), state_path,
                                  keep_previous=previous_generation(state_path), append_dict=entries)


def read_state(path, arg_name):
    """The contents of the state file `path` (named by the argument `arg_name`); a CheckpointError that names the
    generation kept before it, where there is one, if the file cannot be read."""
    try:
        return read_checkpoint(path, arg_name=arg_name)
    except CheckpointError as error:
        previous = previous_generation(path) if path.endswith(".ckpt") else None
        if previous is None or previous == path or not os.path.isfile(previous):
            raise
        raise CheckpointError(f"{error} The state written before it is kept beside it: resume from {previous!r} "
                              f"(the updates since are trained again).") from error


def _generation(path, rank, world, may_move, arg_name):
    """(micro-batches done, contents) of one state file, checked against this process's rank and world; with
    `may_move` a state of another world is let through (to be checked against the run's layout). `arg_name`: the
    argument that named the file."""
    params = read_state(path, arg_name)
    if not is_state_file(params):
        raise CheckpointError(f"'{arg_name}' must be a training state file (written with 'state_path'), but "
                              f"{path!r} does not record the position in the data.")
    saved_format = int(params[FORMAT].asnumpy()) if FORMAT in params else 1
    if saved_format > STATE_FORMAT:
        raise CheckpointError(f"'{arg_name}' {path!r} is a state file of format {saved_format}, written by a newer "
                              f"ms_accum than this one (which reads formats 1 to {STATE_FORMAT}). Upgrade ms_accum, "
                              f"or resume from an epoch checkpoint.")
    saved_rank = int(params[RANK].asnumpy()) if RANK in params else 0
    saved_world = int(params[WORLD].asnumpy()) if WORLD in params else 1
    if saved_world != world and not may_move:
        raise CheckpointError(f"'{arg_name}' {path!r} was written by a run on {saved_world} process(es), but this "
                              f"run has {world}: an exact state resumes on the same number of processes, or on "
                              f"another with its global batch kept through the trainers (global_batch_size). "
                              f"Resume from an epoch checkpoint to change it.")
    if saved_rank != rank and saved_world == world:
        raise CheckpointError(f"'{arg_name}' {path!r} is rank {saved_rank}'s state, but this is rank {rank}: "
                              f"every rank resumes from its own file (train.py: pass the run's checkpoint "
                              f"directory to '--resume').")
    return int(params[MICRO_BATCHES_DONE].asnumpy()), params


def common_position(positions_per_rank, arg_name="resume_from"):
    """
    The newest position (micro-batches done) that every rank holds a state for: the first of rank 0's positions,
    newest written first, that every rank holds. Within one run the newest written is the furthest; a previous
    generation that another run left on the same path (a run started afresh, which has saved fewer micro-batches)
    is older, whatever its position.

    Args:
        positions_per_rank (list[list[int]]): Each rank's available positions, newest written first.
        arg_name (str): The argument that named the state file, for the error. Default: ``"resume_from"``.

    Returns:
        int.

    Raises:
        CheckpointError: If no position is held by every rank.
    """
    common = set(positions_per_rank[0]).intersection(*map(set, positions_per_rank[1:]))
    if not common:
        held = "; ".join(f"rank {r}: {sorted(p, reverse=True) or 'none'}" for r, p in enumerate(positions_per_rank))
        raise CheckpointError(f"'{arg_name}': the ranks must resume from the same position, but no position is "
                              f"saved by every rank ({held}). Resume from an epoch checkpoint instead.")
    return next(position for position in positions_per_rank[0] if position in common)


def gather_ints(values, world):
    """Every process's `values` (as many ints on each), by rank, gathered across the `world` processes (one
    AllGather)."""
    if world == 1:
        return [list(values)]
    import numpy as np  # pylint: disable=import-outside-toplevel
    from mindspore import Tensor, ops  # pylint: disable=import-outside-toplevel
    gathered = ops.AllGather()(Tensor(np.array(values, np.int32))).asnumpy().reshape(world, len(values))
    return [[int(v) for v in row] for row in gathered]


def gather_positions(positions, world):
    """Every rank's available positions (up to 2 each), gathered across the `world` processes."""
    gathered = gather_ints((list(positions) + [-1, -1])[:2], world)
    return [[p for p in row if p >= 0] for row in gathered]


def load_training_state(cell, state_path, total_micro_batches=None, rank=0, world=1, layout=None, drop_window=None,
                        *, total_micro_steps=None):
    """
    Load into `cell` the newest state written through :func:`save_training_state` that every rank holds.

    On one process that is the state file itself, the newest generation (the one before it is not read). With
    `world` > 1 the ranks exchange the positions of their two generations (one AllGather) and all load the newest
    written one they have in common.

    With `layout`, a state written on another number of devices resumes too, when both runs keep the same global
    batch with one fixed N (devices x N x micro-batch) and cut their epochs alike: the position moves to the same
    sample of the epoch. Every device's file of the saved run holds the same parameters at an update boundary, so
    any of them may be loaded. A state written inside a window resumes from the window's start (the open window's
    sums are dropped through `drop_window` and its micro-batches run again); a line says so.

    Args:
        cell (Union[Cell, tuple[Cell]]): The training cell, or the cells saved together, built like those that
            were saved.
        state_path (str): This rank's state file (after a change of device count, any rank's file of the saved run).
        total_micro_batches (int): Micro-batches of the whole run being resumed (epochs x micro-batches per epoch).
        rank (int): This process's rank. Default: ``0``.
        world (int): The number of data-parallel processes. Default: ``1``.
        layout (RunLayout, optional): This run's layout (see :func:`save_training_state`). It checks that the
            global batch is the saved run's and lets the device count change. Default: ``None``.
        drop_window (Callable, optional): Discards the cell's open window (such as the cell's ``drop``); needed
            when the device count changes and the state was written inside a window. Default: ``None``.
        total_micro_steps (int): Deprecated: `total_micro_batches`, its name before ms_accum 0.4.0 (keyword only;
            removed in 0.5.0).

    Returns:
        tuple[int, int], micro-batches done (on each device of this run) and windows begun at the position
        resumed (the updates done, plus one when the state was written inside a window).

    Raises:
        TypeError: If `cell` is neither a Cell nor a tuple or list of Cells.
        ValueError: If two Parameters of the cells share a name.
        CheckpointError: If the file is missing or unreadable, belongs to another model, another ms_accum path
            (the driver's state in a TrainAccuStepsCell, say), another rank or (without `layout`) another device
            count, was written by a newer ms_accum (state files of ms_accum 0.1.0 and 0.3.0, and of format 4, are
            read), records no position, was written at or past the end of this run, the ranks hold no common
            position, or the saved run's global batch or cut of epochs differs from `layout`'s.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
        >>> cell = ms_accum.TrainForwardBackward(nn.WithLossCell(net, nn.MSELoss()), optimizer, grad_sum)
        >>> path = ms_accum.save_training_state(cell, "/tmp/loaded_state.ckpt", micro_batches_done=12,
        ...                                     updates_done=3)
        >>> micro_done, updates_done = ms_accum.load_training_state(cell, path, total_micro_batches=10 * 4)
        ms_accum: resuming /tmp/loaded_state.ckpt at 12 micro-batches done, 3 windows begun.
        >>> micro_done, updates_done
        (12, 3)
    """
    total = renamed_argument("load_training_state", "total_micro_steps", "total_micro_batches", total_micro_steps,
                             total_micro_batches)
    return resume_training_state(cell, state_path, total, rank, world, layout, drop_window,
                                 arg_name="state_path")[:2]


def _shown_values(array):
    """A Parameter's value for a message: its few numbers, or the first two and how many."""
    flat = array.reshape(-1)
    if flat.size <= 3:
        return ", ".join(f"{value:g}" for value in flat)
    return f"[{flat[0]:g}, {flat[1]:g}, ... ({flat.size} values)]"


def _other_hyperparameters(cell, params):
    """The learning rates and momenta of the optimizers in `cell`, Parameters a state file holds (`params`), whose
    values differ from those the optimizer was built with, as text: loading puts the saved ones back, as an exact
    resume must, so a change made by building the optimizer otherwise would be undone in silence."""
    changed = []
    for _, optimizer in cell.cells_and_names():
        if not isinstance(optimizer, nn.Optimizer):
            continue
        rate = optimizer.learning_rate  # a list or Tensor rate is wrapped in a Cell holding the Parameter
        for param in (getattr(rate, "learning_rate", rate), getattr(optimizer, "momentum", None)):
            if not isinstance(param, Parameter) or param.name not in params:
                continue
            saved, built = params[param.name].asnumpy(), param.asnumpy()
            if saved.shape == built.shape and not np.array_equal(saved, built):
                changed.append(f"{param.name} {_shown_values(saved)} (built with {_shown_values(built)})")
    return changed


def resume_training_state(cell, state_path, total_micro_batches, rank=0, world=1, layout=None, drop_window=None,
                          arg_name="resume_from"):
    """:func:`load_training_state`, its errors naming `arg_name`, the argument that named `state_path`: the
    trainers' ``resume_from``, whose run's length (`total_micro_batches`) its ``epoch`` sets. Returns (micro-batches
    done, windows begun, micro-batches of the open window as the dataset gave them): the file's record of the open
    window, which the cell's counter may exceed (a window rerun with split micro-batches counts the pieces); 0 when
    a window written on another device count or with another micro-batch runs again from its start."""
    _warn_without_network("load_training_state", cell)
    cell = _state_cell("load_training_state", cell)
    generations = {}  # newest written first: the state file, then (with other ranks to agree with) the one before
    for path in (state_path, previous_generation(state_path))[:1 if world == 1 else 2]:
        if path == state_path or os.path.exists(path):
            position, params = _generation(path, rank, world, layout is not None, arg_name)
            generations.setdefault(position, (path, params))
    position = common_position(gather_positions(list(generations), world), arg_name)
    path, params = generations[position]
    updates = int(params[UPDATES_DONE].asnumpy())
    saved_world = int(params[WORLD].asnumpy()) if WORLD in params else 1
    saved, open_window = saved_layout(params, saved_world) if layout is not None else (None, None)
    if saved_world != world and saved is None:
        raise CheckpointError(f"'{arg_name}' {path!r} was written by a run on {saved_world} process(es), but this "
                              f"run has {world}, and the file does not record its global batch (it was written by "
                              f"ms_accum 0.2.0 or older, or without a layout). Resume on {saved_world} process(es), "
                              f"or from an epoch checkpoint.")
    written, training = buffer_writer(params), buffer_writer(p.name for p in cell.get_parameters())
    if written and training and written != training:
        raise CheckpointError(f"'{arg_name}' {path!r} is the exact state of a run trained with {written}, but this "
                              f"run trains with {training}, whose state holds other buffers: resume it with the "
                              f"path that wrote it, or resume from an epoch checkpoint (network and optimizer), "
                              f"which every path loads.")
    saved_format = int(params[FORMAT].asnumpy()) if FORMAT in params else 1
    # every check of the run against the file before anything is loaded: a refused resume leaves the cell as it was
    # (a new user's trial found a refused one's network and optimizer holding the state's values)
    saved_updates, rerun = updates, False
    moved = saved is not None and moves(saved, layout)
    if moved:
        position, updates, rerun = elastic_position(saved, layout, position, updates, open_window, path,
                                                    arg_name)
        if rerun and drop_window is None:
            raise CheckpointError(f"'{arg_name}' {path!r} was written inside a window of {saved.describe()}: "
                                  f"resuming it as {layout.describe()} needs 'drop_window' to discard that "
                                  f"window's sums.")
    elif saved is not None:
        check_same_global_batch(saved, layout, path, arg_name)
        check_same_partial_window(saved, layout, f"'{arg_name}' {path!r} continues a run whose epochs' partial "
                                                 f"windows this run would treat otherwise")
    if not 0 <= position < total_micro_batches:
        longer = "raise 'epoch'" if arg_name == "resume_from" else "pass a larger 'total_micro_batches'"
        raise CheckpointError(f"'{arg_name}' {path!r} was written after {position} micro-batches, but this run "
                              f"ends after {total_micro_batches}, so nothing is left to train: {longer} to continue "
                              f"it.")
    changed = _other_hyperparameters(cell, params)
    load_into(cell, params, path, arg_name=arg_name, what="a training state of this model",
              optional=lambda name: _added_since(saved_format, name))
    if changed:
        warn(f"'{arg_name}' {path!r} holds the optimizer's {', '.join(changed)}, which loading it put back: an exact "
             f"resume continues the run that wrote it. Build the optimizer as that run did, or set another value "
             f"after the resume (for example optimizer.learning_rate.set_data(...)), which the next window trains "
             f"with.", UserWarning)
    forget = getattr(cell, "_forget_open_window", None)  # a parallel cell's host view of its window
    if forget is not None:
        forget()
    for param in cell.get_parameters():
        if param.name.endswith(ADDED_IN_FORMAT_4) and param.name not in params:
            write_parameter(param, 1.0)  # the buffers it wrote hold item-weighted sums
    if saved_format < 5:
        _from_earlier_formats(cell, params, saved_updates)
    if moved:
        if rerun:
            drop_window()
        print(resume_notice(saved, layout, position, rerun), flush=True)
    else:
        if layout is None:
            where = f"{count(position, 'micro-batch')} done"
        else:
            epoch, offset = divmod(position, layout.steps_per_epoch)
            where = f"epoch {epoch + 1} with {offset} of its {layout.steps_per_epoch} micro-batches done ({position} " \
                    f"in all)"
        opened = f" (window {updates} open with {count(open_window, 'micro-batch')} in it, continued)" \
            if open_window else ""
        print(f"ms_accum: resuming {path} at {where}, {count(updates, 'window')} begun{opened}.", flush=True)
    if moved:
        return position, updates, 0
    if open_window is None:  # a file without a layout: the cell's own count
        counter = getattr(cell, "accu_micro_steps", None)
        open_window = 0 if counter is None else int(counter.asnumpy())
    return position, updates, open_window


class StateWriter:
    """
    Writes the exact state as training goes: every `every` micro-batches on one process; in data parallel at the
    first update boundary once `every` more micro-batches have passed, so that ranks never drift apart by more
    than one generation. With a `layout` each file records it, and the micro-batches of the open window.
    """

    def __init__(self, cell, state_path, every, total_micro_batches, start, rank=0, world=1, layout=None):
        self.cell, self.state_path, self.every = cell, state_path, every
        self.total, self.last, self.rank, self.world = total_micro_batches, start, rank, world
        self.layout = layout

    def _save(self, micro_done, updates_done, open_window):
        return save_training_state(self.cell, self.state_path, micro_done, updates_done, self.rank, self.world,
                                   self.layout, open_window)

    def after(self, micro_done, updates_done, at_update_boundary, open_window=0):
        """Write the state if one is due after `micro_done` micro-batches (`open_window` of them in the open
        window); return whether it wrote."""
        if not self.every or micro_done >= self.total:
            return False
        if self.world > 1:
            due = at_update_boundary and micro_done // self.every > self.last // self.every
        else:
            due = micro_done % self.every == 0
        if due:
            self._save(micro_done, updates_done, open_window)
            self.last = micro_done
        return due

    def on_stop(self, micro_done, updates_done):
        """Training stops at an update boundary on request: write the state there, when there is a `state_path`
        (with `every` 0 too: the state is then written at such stops only) and it is not written at this position
        already."""
        if self.state_path and micro_done != self.last and micro_done < self.total:
            self.save_now(micro_done, updates_done)

    def save_now(self, micro_done, updates_done):
        """Write the state as it is now, at an update boundary (before training stops); return the path, or None
        without a `state_path`."""
        if not self.state_path:
            return None
        self.last = micro_done
        return self._save(micro_done, updates_done, 0)


@contextmanager
def dataset_starting_at(dataset, micro_batches_done):
    """
    Iterators created inside the block start after `micro_batches_done` micro-batches, in the order of an
    uninterrupted run (MindSpore's dataset init step replays the earlier epochs' shuffles); the dataset is left
    as it was afterwards.
    """
    if not micro_batches_done:
        yield dataset
        return
    dataset.set_init_step(micro_batches_done)
    try:
        yield dataset
    finally:
        dataset.set_init_step(0)
