"""The devices of a data-parallel run, for both trainers: this process's rank among them, whether the dataset is
shared out over them, and what every device must agree on before training (compared in one AllGather): its
micro-batches an epoch, N, its shard and the learning-rate rule. A device whose window ended elsewhere would wait
alone at the window's gradient reduction until MindSpore's collective timeout; one stepping at another rate would
part its weights from the others' in silence."""
import zlib

import numpy as np

from ..core.global_batch import DERIVED_STEPS_NAME
from ..core.lr_scaling import SCALING_RULES
from ..core.schedule import shown_steps_name
from ..core.user_warning import warn
from .elastic import SHARDING_HINT, dataset_sharding, dataset_shards
from .state import gather_ints


def rank_and_world(cell):
    """This process's rank and the number of processes `cell` reduces over (0 and 1 on one device)."""
    if not cell.is_distributed:
        return 0, 1
    from mindspore.communication import get_group_size, get_rank  # pylint: disable=import-outside-toplevel
    return get_rank(), get_group_size()


def check_sharding(owner, cell, train_dataset):
    """Whether MindSpore's distributed sampler shares the data out over `cell`'s devices (on one device: whether
    the dataset is whole, one shard); in data parallel, a warning when it does not (every device would read every
    sample, unless each reads files of its own), and on one device when the process looks like one of several
    meant for data parallel (:func:`_check_alone`)."""
    world = rank_and_world(cell)[1]
    shards = dataset_shards(train_dataset)
    if world == 1:
        _check_alone(owner, shards)
    elif shards is None:
        warn(f"For '{owner}', the dataset is not sharded over the {world} devices: unless each device reads "
             f"data of its own, every device trains on every sample and a window holds the same samples "
             f"{world} times. To share them out, {SHARDING_HINT}.", UserWarning)
    elif shards != world:  # a new user's num_shards=4 on 2 devices read as not sharded at all
        unread = "part of the data is never trained on (the shards no device reads)" if shards > world else \
            "the devices' shards overlap, and their samples are trained more than once"
        warn(f"For '{owner}', the dataset is sharded into {shards} shards (num_shards), but there are {world} "
             f"devices: each device reads 1/{shards} of the data, so {unread}. Pass num_shards={world}, "
             f"shard_id=<rank>.", UserWarning)
    return shards == world


def _check_alone(owner, shards):
    """A cell on one device warns when it looks like one of several processes meant for data parallel: processes
    that called ``mindspore.communication.init()``, or a dataset sharded for several (a new user's two msrun ranks
    without the data-parallel context each trained alone on its shard, their weights parting, in silence)."""
    from mindspore.communication.management import GlobalComm  # pylint: disable=import-outside-toplevel
    processes = 1
    if GlobalComm.INITED:
        from mindspore.communication import get_group_size  # pylint: disable=import-outside-toplevel
        processes = get_group_size()
    if processes > 1:
        warn(f"For '{owner}', this process is one of {processes} (mindspore.communication.init() was called), but "
             f"the cell trains on one device (parallel mode 'stand_alone'): every process trains alone on its data, "
             f"no gradient is reduced across them, and their weights part. For data parallel, call "
             f"mindspore.set_auto_parallel_context(parallel_mode=mindspore.ParallelMode.DATA_PARALLEL, "
             f"gradients_mean=True) before building the cell.", UserWarning)
    elif shards is not None and shards > 1:
        warn(f"For '{owner}', the dataset is sharded into {shards} shards (num_shards), but the cell trains on one "
             f"device (no mindspore.communication.init(), parallel mode 'stand_alone'): it reads 1/{shards} of the "
             f"data, alone. Launched as several processes for data parallel? Call init() and "
             f"mindspore.set_auto_parallel_context(parallel_mode=mindspore.ParallelMode.DATA_PARALLEL, "
             f"gradients_mean=True) before building the cell; on one device, pass num_shards=1.", UserWarning)


def check_devices_agree(owner, cell, train_dataset):
    """In data parallel every device must run as many micro-batches an epoch, the same windows (the same N), a
    shard of its own and the same learning-rate rule: a new user's ranks given N 2 and 4 trained mixed windows,
    then one failed inside MindSpore's AllReduce; ranks given reference_batch 40 and 80 trained to the end apart.
    The devices compare them first (one AllGather) and every device refuses what differs, naming each device's."""
    world = rank_and_world(cell)[1]
    if world == 1:
        return
    steps = cell.gradient_accumulation_steps
    shown = steps if isinstance(steps, int) else 0  # a schedule or a policy: compared by its description
    num_shards, shard = dataset_sharding(train_dataset)
    reference = 0.0 if cell.lr_state is None else float(cell.lr_state.reference_batch.asnumpy())
    rows = gather_ints([train_dataset.get_dataset_size(), shown, zlib.crc32(repr(steps).encode()) >> 1,
                        train_dataset.get_batch_size(), -1 if shard is None else shard,
                        SCALING_RULES.index(cell.lr_scaling), int(np.float32(reference).view(np.int32))], world)
    sizes, micro_batches = [row[0] for row in rows], [row[3] for row in rows]
    # micro-batches of other sizes are weighed by their samples, so only windows of other counts are refused;
    # when the sizes cause it, named first (the advice below for the counts would not fit)
    if len(set(micro_batches)) > 1 and (len(set(sizes)) > 1 or len({row[2] for row in rows}) > 1):
        raise ValueError(f"For '{owner}', every device must run as many micro-batches an epoch and the same N, "
                         f"but the devices batch their data at {micro_batches} samples (by rank), which gives "
                         f"them {sizes} micro-batches: a device whose window ends elsewhere would wait alone at "
                         f"its gradient reduction. Batch every device's data at one size.")
    shards = [row[4] for row in rows]
    if num_shards == world and len(set(shards)) < world:
        raise ValueError(f"For '{owner}', every device must read a shard of its own, but their shard_ids are "
                         f"{shards} (by rank): a window would hold the same samples on several devices. Pass "
                         f"shard_id=<rank> (mindspore.communication.get_rank()).")
    if len(set(sizes)) > 1:
        raise ValueError(f"For '{owner}', every device's dataset must hold as many micro-batches, but "
                         f"they hold {sizes} (by rank): a device with more would wait alone at a window's "
                         f"gradient reduction until MindSpore's collective timeout. To share the data out evenly, "
                         f"{SHARDING_HINT}; or cut every device's data to {min(sizes)} batches.")
    if len({row[2] for row in rows}) > 1:
        derived = cell.steps_name == DERIVED_STEPS_NAME  # each device's own G: its N x devices x micro-batch
        by_rank = ", ".join((f"{row[1]} (global_batch_size {row[1] * world * row[3]})" if derived else str(row[1]))
                            if row[1] else "a schedule or policy" for row in rows)
        raise ValueError(f"For '{owner}', {shown_steps_name(cell.steps_name)} must be the same on every device, "
                         f"but they take {by_rank} (by rank; this device {steps!r}): a device whose window ends "
                         f"elsewhere would wait alone at its gradient reduction. Give every device the same N, "
                         f"or the same 'global_batch_size'.")
    if len({(row[5], row[6]) for row in rows}) > 1:
        rules = ", ".join(f"{SCALING_RULES[row[5]]!r} at {_reference_shown(row[6])}" for row in rows)
        raise ValueError(f"For '{owner}', the learning-rate rule ('lr_scaling' and 'reference_batch') must be "
                         f"the same on every device, but they take {rules} (by rank): the devices would step "
                         f"the same reduced gradient at other rates, and their weights would part in silence. "
                         f"Build every device's cell with the same 'lr_scaling' and 'reference_batch'.")


def _reference_shown(bits):
    """A rule's G0 as :func:`check_devices_agree` gathers it (a float32's bits as an int32)."""
    reference = float(np.array(bits, np.int32).view(np.float32))
    return f"reference_batch={reference:g}" if reference else "reference_batch=None (the first window's items)"
