"""The checks of a training run's arguments, made before its first micro-batch, written once for both trainers:
the dataset, what the loss network takes, state saving, where the run starts, whether N fits an epoch, and the
learning-rate list against the run's updates (or, read from progress, against its reference steps).

Each check raises with one message shape: "For 'Owner', 'arg' must be <expected>, but got <received>."
"""
import math

from mindspore import Tensor
from mindspore.dataset import Dataset
from mindspore.nn import CellList
from mindspore.train import Callback

from ..core.adaptive import AdaptiveAccumulation
from ..core.checks import check_ckpt_path, construct_inputs, inputs_text
from ..core.goodput import GoodputAccumulation
from ..core.progress_lr import progress_rates
from ..core.schedule import AccumulationSchedule, max_updates, shown_steps_name
from ..core.user_warning import warn
from .elastic import dataset_batched

POLICIES = (AdaptiveAccumulation, GoodputAccumulation)  # N chosen on the device as the run goes


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
    taken = construct_inputs(network)
    if taken is None:
        return
    required, most, names = taken
    columns = dataset.get_col_names()
    if required <= len(columns) <= most:
        return
    raise ValueError(f"For '{owner}', each row of '{arg_name}' is passed to {type(network).__name__}.construct("
                     f"{names}), which takes {inputs_text(required, most)} input{'' if most == 1 else 's'}, but the "
                     f"dataset has {len(columns)} column{'' if len(columns) == 1 else 's'} {columns}. "
                     f"Keep the columns it takes, in its order, with {arg_name}.project([...]) (or map them into "
                     f"it), or give the network a construct that takes them all.{hint}")


def check_dataset_rows(owner, dataset, arg_name="train_dataset"):
    """Warn if `dataset` has no batch operation and a column holds a scalar in each row beside a column that does
    not: its rows are then most likely single samples, each passed to the network as a micro-batch and weighed by
    its inputs' leading dimension (a feature axis), so a learning-rate rule and the records count the wrong samples.
    A row that is a whole micro-batch with a scalar beside it (its token count, say) is legitimate: not refused.
    Returns whether it warned."""
    if dataset_batched(dataset):
        return False
    shapes = dict(zip(dataset.get_col_names(), (list(shape) for shape in dataset.output_shapes())))
    scalars = [name for name, shape in shapes.items() if not shape]
    others = {name: shape for name, shape in shapes.items() if shape}
    if not scalars or not others:
        return False
    warn(f"For '{owner}', '{arg_name}' has no batch operation, and its column(s) {scalars} hold a scalar in each "
         f"row beside {others}: its rows look like single samples, but each row is passed to the network as one "
         f"micro-batch and weighs its inputs' leading dimension ({next(iter(others.values()))[0]} here) in the "
         f"window, the learning-rate rule and the records. Batch the samples with "
         f"{arg_name}.batch(micro_batch_size). A row that is already a whole micro-batch is trained as it is.")
    return True


def check_state_saving(owner, state_path, save_state_every):
    """Raise unless `save_state_every` is an int >= 0, and > 0 only together with a `state_path`, a '.ckpt' file's
    name (refused before training, not at the first save)."""
    if isinstance(save_state_every, bool) or not isinstance(save_state_every, int) or save_state_every < 0 \
            or (save_state_every and state_path is None):
        raise ValueError(f"For '{owner}', 'save_state_every' must be an int >= 0, and > 0 only with a "
                         f"'state_path', but got {save_state_every!r} with state_path={state_path!r}.")
    if state_path is not None:
        check_ckpt_path(owner, "state_path", state_path)


def check_callbacks(owner, callbacks):
    """Raise unless `callbacks` is None, a mindspore.train.Callback, or a list or tuple of them: MindSpore's own
    error names neither the trainer nor what was passed."""
    if callbacks is None or isinstance(callbacks, Callback):
        return
    if not isinstance(callbacks, (list, tuple)):
        got = type(callbacks).__name__
    else:
        others = sorted({type(callback).__name__ for callback in callbacks if not isinstance(callback, Callback)})
        if not others:
            return
        got = f"a {type(callbacks).__name__} holding {', '.join(others)}"
    raise TypeError(f"For '{owner}', 'callbacks' must be a mindspore.train.Callback, or a list or tuple of them, but "
                    f"got {got}.")


def check_resume_or_initial_epoch(owner, resume_from, initial_epoch):
    """Raise if both a state file and an initial epoch say where training starts, or `resume_from` is not a '.ckpt'
    file's name."""
    if resume_from is not None:
        check_ckpt_path(owner, "resume_from", resume_from)
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
    if progress_rates(optimizer):  # read from progress: see check_progress_lr_schedule
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
            warn(f"For '{owner}', the optimizer's learning-rate list has {length} entries, one per "
                 f"micro-batch of this run, but the optimizer reads one entry per update ({updates} in this "
                 f"run): a schedule built per micro-batch is stretched {micro_steps / updates:.3g} times (its "
                 f"warm-up and decay take that many times more updates than planned, and this run ends "
                 f"at update {updates} of its {length}). Build it with one entry per update. (A per-update "
                 f"list for a longer run, trained over several calls, is right as it is.)", UserWarning)
            return


def largest_steps(steps):
    """The largest N a run can take: an int's, a schedule's (an AccumulationSchedule) or a policy's max_steps."""
    if isinstance(steps, POLICIES):
        return steps.max_steps
    if isinstance(steps, AccumulationSchedule):
        return max(steps.counts)
    return steps


def check_window_fits(owner, steps_name, steps, micro_batches_per_epoch, partial_window, carry_hint="",
                      carry="partial_window='carry'"):
    """Raise if a window of the run (N an int, a schedule or a policy) can be longer than an epoch, unless windows
    are carried across epochs. `carry` says how the caller's user asks for that (a command line's flag, say), and
    `carry_hint` follows it in the message."""
    if largest_steps(steps) > micro_batches_per_epoch and partial_window != "carry":
        shown = steps if isinstance(steps, POLICIES) else largest_steps(steps)
        raise ValueError(f"For '{owner}', {shown_steps_name(steps_name)} must be <= the {micro_batches_per_epoch} "
                         f"micro-batches in an epoch, "
                         f"but got {shown}. Lower it, or pass {carry}{carry_hint} to let windows span "
                         f"epochs.")


def plan_updates(steps, micro_batches_per_epoch, epochs, partial_window):
    """(windows begun before each epoch, the run's updates, its micro-batches that reach an update) for N an int
    or a schedule, from one walk (:meth:`AccumulationSchedule.walk`); (None, None, None) for a policy, whose
    windows are decided as it goes."""
    if isinstance(steps, POLICIES):
        return None, None, None
    return AccumulationSchedule(steps).walk(micro_batches_per_epoch, epochs, partial_window)


def check_progress_lr_schedule(owner, optimizer, micro_steps, first_steps, micro_batch_items, from_start=True,
                               adascale=False):
    """
    Raise if the learning-rate list of an optimizer that reads it from progress (a cell built with `lr_scaling`)
    is too short for the run: it is indexed by reference steps, the run's samples over G0 (G0 given, in samples;
    else the first window's, `first_steps` micro-batches of `micro_batch_items` samples over all devices, so that
    the run takes `micro_steps` / `first_steps` of them), not by updates. The progress already made counts, as
    the updates done do for a list read by update. With `adascale` that is the most the run may take (r <= G / G0
    while G >= G0).
    """
    rates = progress_rates(optimizer)
    tables = [rate.list_length for rate in rates if rate.list_length is not None]
    if not tables or not from_start:
        return
    reference = float(rates[0].reference_batch.asnumpy())
    ahead = micro_steps * micro_batch_items / reference if reference > 0 else micro_steps / first_steps
    done = float(rates[0].progress_steps.asnumpy().reshape(-1)[0]) + float(rates[0].progress_fraction.asnumpy())
    needs = math.ceil(done + ahead - 1e-6)
    length = min(tables)
    if length < needs:
        may = "may need up to" if adascale else "needs"
        raise ValueError(f"For '{owner}', the optimizer's learning-rate list must have an entry for every reference "
                         f"step of the run (it is read at the run's progress, samples over G0, because the cell was "
                         f"built with lr_scaling), but it has {length} and this run {may} {needs} ({done:g} done "
                         f"before it, {ahead:g} in it: {micro_steps} micro-batches of {micro_batch_items:g} samples "
                         f"over G0 = {reference if reference > 0 else first_steps * micro_batch_items:g}). Give it "
                         f"{needs} entries, one per reference step, or use a LearningRateSchedule, which has no end.")


def check_run_learning_rate(owner, optimizer, steps, micro_batches_per_epoch, epochs, partial_window, from_start,
                            updates, trained, micro_batch_items=None, lr_scaling="none"):
    """:func:`check_lr_schedule` for a run of `epochs` epochs of `micro_batches_per_epoch` micro-batches with N
    `steps` (an int, a schedule or a policy, whose run takes at most every window at its min_steps), and `updates`
    and `trained`, the run's updates and micro-batches that reach one as :func:`plan_updates` planned them (None
    for a policy); for an optimizer that reads its rate from progress, :func:`check_progress_lr_schedule`
    (`micro_batch_items`: the samples of one micro-batch over all devices, None: not checked; `lr_scaling`: the
    cell's concrete rule)."""
    if micro_batch_items is not None and progress_rates(optimizer):
        first = steps.initial_steps if hasattr(steps, "initial_steps") else \
            steps.steps_at(0) if isinstance(steps, AccumulationSchedule) else steps
        if trained is None:  # a policy's windows: at most every micro-batch (a schedule's plan leaves out the
            trained = micro_batches_per_epoch * epochs  # windows a partial-window policy drops: they move no progress)
        check_progress_lr_schedule(owner, optimizer, trained, first, micro_batch_items, from_start,
                                   adascale=lr_scaling.startswith("adascale"))
        return
    adaptive = isinstance(steps, POLICIES)
    most = max_updates(steps.min_steps, micro_batches_per_epoch, epochs, partial_window) if adaptive else updates
    check_lr_schedule(owner, optimizer, micro_batches_per_epoch * epochs, most, from_start=from_start,
                      adaptive=adaptive)
