"""Resuming an exact state on another device count, with the global batch kept.

A window is an exact weighted mean over its samples, so a window of G samples gives the same update whether R
devices carry N micro-batches each or R' devices carry N * R / R'. What must hold for a resume on R' devices to
continue the uninterrupted run:

- the same global batch G = devices x N x micro-batch, one fixed N per device (not a schedule or a policy);
- each window holding the same samples on every device count: with MindSpore's distributed sampler (a dataset's
  ``num_shards``/``shard_id``, the same shuffle seed) rank r of R reads positions r, r + R, r + 2R, ... of one
  device-independent order of the epoch, so a window's samples over all ranks are the same contiguous block of
  that order for every R;
- epochs cut alike: the same number of whole windows, and either ``partial_window="drop"`` or a last partial
  window of the same samples.

Positions are converted through the sample offset in the epoch. A state written in the middle of a window (one
device writes every few micro-batches) resumes from the window's start: the parameters are those of the last
complete window, the open window's sums are dropped and its micro-batches run again on the new devices.
"""
from dataclasses import dataclass

from .checkpoint import CheckpointError
from ..core.open_window import PARTIAL_WINDOW_POLICIES as _PARTIAL
from ..core.global_batch import GLOBAL_BATCH_NAME

LAYOUT_KEYS = ("ms_accum_micro_batch", "ms_accum_steps_per_epoch", "ms_accum_layout_steps",
               "ms_accum_partial_window", "ms_accum_sharded", "ms_accum_open_window")
SHARDING_HINT = ("build the dataset with num_shards=<devices>, shard_id=<rank> (on one device num_shards=1, "
                 "shard_id=0): MindSpore's distributed sampler then shares one order of each epoch out by rank")


@dataclass(frozen=True)
class RunLayout:
    """
    How a run cuts its data into windows: what its exact state files record so that
    :func:`load_training_state` can resume them on another number of devices with the global batch kept.
    :class:`GradientAccumulation` and :class:`Model_ACCU` make their own; a loop of your own passes one to
    :func:`save_training_state` and :func:`load_training_state`.

    Args:
        world (int): Data-parallel devices.
        micro_batch_size (int): Samples per micro-batch on one device.
        steps_per_epoch (int): Micro-batches per epoch on one device.
        steps (int): N, micro-batches per window on one device; 0 when N varies (a schedule or a policy).
        partial_window (str): ``"flush"``, ``"drop"`` or ``"carry"``, what becomes of an epoch's last, partial
            window.
        sharded (bool): Whether the data are shared out by MindSpore's distributed sampler over `world` shards (a
            dataset's ``num_shards``/``shard_id``, one shard on one device): what makes a window the same samples
            on every device count. Default: ``True``.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> two = ms_accum.RunLayout(world=2, micro_batch_size=32, steps_per_epoch=937, steps=4,
        ...                          partial_window="drop")
        >>> one = ms_accum.RunLayout(1, 32, 1875, 8, "drop")
        >>> two.global_batch_size == one.global_batch_size, two.full_windows == one.full_windows
        (True, True)
    """

    world: int
    micro_batch_size: int
    steps_per_epoch: int
    steps: int
    partial_window: str
    sharded: bool = True

    @property
    def global_batch_size(self):
        """Samples per window over every device (0 when N varies)."""
        return self.world * self.steps * self.micro_batch_size

    @property
    def full_windows(self):
        """Whole windows in an epoch."""
        return self.steps_per_epoch // self.steps

    @property
    def tail_samples(self):
        """Samples of the epoch after its whole windows, over every device."""
        return (self.steps_per_epoch - self.full_windows * self.steps) * self.micro_batch_size * self.world

    def describe(self):
        """'256 = 2 devices x 4 micro-batches x 32 samples'."""
        return (f"{self.global_batch_size} = {count(self.world, 'device')} x {count(self.steps, 'micro-batch')} "
                f"x {count(self.micro_batch_size, 'sample')}")

    def entries(self, open_window):
        """What a state file records of the layout, `open_window` being the micro-batches of the open window."""
        return dict(zip(LAYOUT_KEYS, (self.micro_batch_size, self.steps_per_epoch, self.steps,
                                      _PARTIAL.index(self.partial_window), int(self.sharded), open_window)))


def count(number, noun):
    """'1 window', '2 windows', '3 micro-batches': `number` and `noun`, in the plural unless it is 1."""
    return f"{number} {noun}{'' if number == 1 else 'es' if noun.endswith('h') else 's'}"


def saved_layout(params, world):
    """(the RunLayout a state file records, the micro-batches of its open window), or (None, None) for a file
    written without one (ms_accum 0.2.0 and older, or a user's own loop)."""
    if not all(key in params for key in LAYOUT_KEYS):
        return None, None
    micro, per_epoch, steps, partial, sharded, open_window = (int(params[key].asnumpy()) for key in LAYOUT_KEYS)
    return RunLayout(world, micro, per_epoch, steps, _PARTIAL[partial], bool(sharded)), open_window


def dataset_shards(dataset):
    """The shards of `dataset`'s source when MindSpore's distributed sampler shares it out (num_shards/shard_id,
    or a DistributedSampler), else None."""
    return dataset_sharding(dataset)[0]


BATCH_OPERATIONS = ("BatchDataset", "PaddedBatchDataset", "BucketBatchByLengthDataset")


def _pipeline(dataset):
    """Every node of `dataset`'s pipeline, from `dataset` down to its sources (MindSpore's ``children``)."""
    pending = [dataset]
    while pending:
        node = pending.pop()
        children = getattr(node, "children", None) or []
        pending.extend(children)
        yield node, children


def dataset_batched(dataset):
    """Whether `dataset`'s pipeline batches its rows (``.batch``, ``.padded_batch``,
    ``.bucket_batch_by_length``): only then does ``get_batch_size()`` give the micro-batch (it is 1 otherwise,
    whatever the rows hold, such as a GeneratorDataset yielding whole micro-batches)."""
    return any(type(node).__name__ in BATCH_OPERATIONS for node, _ in _pipeline(dataset))


def dataset_sharding(dataset):
    """(num_shards, shard_id) of `dataset`'s source when MindSpore's distributed sampler shares it out, else
    (None, None)."""
    for node, children in _pipeline(dataset):
        sampler = None if children else getattr(node, "sampler", None)  # a source's sampler
        if type(sampler).__name__ == "DistributedSampler":
            return (getattr(sampler, "num_shards", None) or getattr(node, "num_shards", None),
                    getattr(sampler, "shard_id", getattr(node, "shard_id", None)))
    return None, None


def check_same_global_batch(saved, mine, path, arg_name="resume_from"):
    """Refuse a resume that would change the global batch: from a fixed N to a schedule or a policy or back, or
    from one fixed G to another (`arg_name`: the argument that named the file `path`)."""
    if bool(saved.steps) != bool(mine.steps):
        was = "was fixed" if saved.steps else "changed between windows (a schedule or a policy)"
        now = "changes between windows" if saved.steps else "is fixed"
        keep = f"{GLOBAL_BATCH_NAME}={saved.global_batch_size}" if saved.steps else "schedule or policy"
        raise CheckpointError(f"'{arg_name}' {path!r} continues a run whose N {was}, but this run's N {now}: "
                              f"resuming would change the learning dynamics. Resume with the saved run's {keep}, or "
                              f"start a new run from an epoch checkpoint.")
    if saved.steps and mine.steps and saved.global_batch_size != mine.global_batch_size:
        per_step = mine.world * mine.micro_batch_size
        steps = saved.global_batch_size // per_step
        keep_n = f"gradient_accumulation_steps={steps} (or {GLOBAL_BATCH_NAME}={saved.global_batch_size})" \
            if steps and steps * per_step == saved.global_batch_size else \
            f"{GLOBAL_BATCH_NAME}={saved.global_batch_size} with a micro-batch that divides it"
        raise CheckpointError(
            f"'{arg_name}' {path!r} continues a run whose '{GLOBAL_BATCH_NAME}' was {saved.describe()}, but this "
            f"run's is {mine.describe()}: resuming would change the learning dynamics. Pass {keep_n}, so that "
            f"N x devices x micro-batch stays {saved.global_batch_size}, or start a new run from an epoch "
            f"checkpoint.")


def check_same_partial_window(saved, mine, where, then=", or start a new run from an epoch checkpoint"):
    """Refuse a resume under another `partial_window` than the saved run's (`where`: the message's opening, naming
    the file; `then`: its close), which would cut the rest of the run into other windows than the saved run planned
    (a partial window flushed in its first epochs, dropped or carried after). On the same device count, an epoch of
    whole windows only (a fixed N that divides it) has no partial window to treat otherwise: accepted."""
    if saved.partial_window == mine.partial_window:
        return
    if saved.world == mine.world and mine.steps and mine.steps_per_epoch % mine.steps == 0:
        return
    raise CheckpointError(f"{where}: 'partial_window' must be the saved run's {saved.partial_window!r}, but got "
                          f"{mine.partial_window!r}. Pass partial_window={saved.partial_window!r}{then}.")


def moves(saved, mine):
    """Whether a state of layout `saved` resumes into layout `mine` through the sample offset (another device count
    or another micro-batch: a position counted in the saved run's micro-batches is not this run's)."""
    return saved.world != mine.world or saved.micro_batch_size != mine.micro_batch_size


def _as_saved(saved):
    """How to resume a state of layout `saved` as it was written (the close of a refusal)."""
    return f"on {count(saved.world, 'device')} with micro-batches of {count(saved.micro_batch_size, 'sample')}"


def elastic_position(saved, mine, position, updates, open_window, path, arg_name="resume_from"):
    """
    Where a state written on `saved.world` devices with micro-batches of `saved.micro_batch_size` samples resumes
    on `mine.world` devices with micro-batches of `mine.micro_batch_size` (one of them other, :func:`moves`):
    (micro-batches done on each of this run's devices, updates done, micro-batches of the saved open window that run
    again).

    Raises:
        CheckpointError: If the runs' windows would not hold the same samples (see the module's docstring).
    """
    if saved.world != mine.world:
        where = f"'{arg_name}' {path!r} was written on {count(saved.world, 'device')} and this run has {mine.world}"
        other = "another device count"
    else:
        where = f"'{arg_name}' {path!r} was written with micro-batches of {count(saved.micro_batch_size, 'sample')} " \
                f"and this run's hold {mine.micro_batch_size}"
        other = "another micro-batch"
    if not saved.steps or not mine.steps:
        raise CheckpointError(f"{where}: an exact state moves to {other} only with a fixed "
                              f"'{GLOBAL_BATCH_NAME}' (one N), but N changes between windows in the "
                              f"{'saved' if not saved.steps else 'new'} run. Resume {_as_saved(saved)}, or from an "
                              f"epoch checkpoint.")
    check_same_global_batch(saved, mine, path, arg_name)
    if saved.world != mine.world and (not saved.sharded or not mine.sharded):  # one device: the dataset's order
        which = "saved" if not saved.sharded else "new"
        raise CheckpointError(f"{where}: a window holds the same samples on both only when both runs share their "
                              f"data out with MindSpore's distributed sampler, but the {which} run's dataset is not "
                              f"sharded over its devices. To continue exactly, {SHARDING_HINT}.")
    check_same_partial_window(saved, mine, where, f"; if the epochs' partial windows then differ, resume "
                                                 f"{_as_saved(saved)} or from an epoch checkpoint")
    if saved.full_windows != mine.full_windows:
        raise CheckpointError(f"{where}: an epoch must hold the same windows of {saved.global_batch_size} samples, "
                              f"but it holds {saved.full_windows} there and {mine.full_windows} here (micro-batches "
                              f"per device and epoch: {saved.steps_per_epoch} and {mine.steps_per_epoch}). Use the "
                              f"same data set and sample count (train.py: --num_samples counts every device's "
                              f"samples with --global_batch_size).")
    if saved.partial_window != "drop" and saved.tail_samples != mine.tail_samples:
        raise CheckpointError(f"{where}: each epoch ends with a partial window of {saved.tail_samples} samples there "
                              f"and {mine.tail_samples} here, which are not the same samples. Train both runs with "
                              f"partial_window='drop' (train.py does with --global_batch_size), or resume "
                              f"{_as_saved(saved)}.")
    start = position - open_window  # the open window runs again from its first micro-batch
    epoch, offset = divmod(start, saved.steps_per_epoch)
    samples = offset * saved.micro_batch_size * saved.world
    per_step = mine.micro_batch_size * mine.world
    if samples % per_step:
        raise CheckpointError(f"{where}: its window starts {samples} samples into an epoch, which is not a whole "
                              f"number of this run's micro-batches over all devices ({per_step} samples).")
    return epoch * mine.steps_per_epoch + samples // per_step, updates - (1 if open_window else 0), open_window


def resume_notice(saved, mine, position, rerun):
    """The log line of a resume through the sample offset (:func:`elastic_position`)."""
    epoch, offset = divmod(position, mine.steps_per_epoch)
    state = f"a state of {count(saved.world, 'device')} on {mine.world}" if saved.world != mine.world else \
        f"a state of micro-batches of {count(saved.micro_batch_size, 'sample')} with micro-batches of " \
        f"{mine.micro_batch_size}"
    line = (f"ms_accum: resuming {state}, the global batch kept ({saved.describe()} -> {mine.describe()}), at "
            f"epoch {epoch + 1} with {offset} of its {mine.steps_per_epoch} micro-batches done"
            + (" on each device" if mine.world > 1 else ""))
    if rerun:
        change = "device count" if saved.world != mine.world else "micro-batch"
        line += (f"; it was written {count(rerun, 'micro-batch')} into a window, which runs again from its start "
                 f"(after a change of {change} a state resumes from the last complete window)")
    return line + "."
