"""The global batch: the samples of one update over every device, G = devices x N x micro-batch.

A run that names G instead of N keeps its learning dynamics when its device count changes: each device derives its
own N, so a window holds G samples on 1, 2 or 8 devices (see ``docs/resume_and_checkpoints.md``).
"""
from .checks import check_positive_int
from .schedule import STEPS_NAME, steps_argument

GLOBAL_BATCH_NAME = "global_batch_size"
DERIVED_STEPS_NAME = "N = global_batch_size / (devices x micro-batch)"  # N's name in messages when G gave it


def data_parallel_size():
    """The devices a window's gradient is reduced over: the communication group's size in a parallel mode, 1 on
    one device (as the accumulation cells decide it)."""
    from mindspore import context  # pylint: disable=import-outside-toplevel
    from mindspore.context import ParallelMode  # pylint: disable=import-outside-toplevel
    if context.get_auto_parallel_context("parallel_mode") == ParallelMode.STAND_ALONE:
        return 1
    from mindspore.communication import get_group_size  # pylint: disable=import-outside-toplevel
    return get_group_size()


def steps_for_global_batch(global_batch_size, micro_batch_size, device_num=None, owner="steps_for_global_batch",
                           arg_name=GLOBAL_BATCH_NAME):
    r"""
    N, the micro-batches per update on each device, for a global batch of `global_batch_size` samples:
    ``global_batch_size / (device_num * micro_batch_size)``.

    Pass the result wherever N is taken (``gradient_accumulation_steps`` of the cells, :class:`Accumulator` or the
    trainers); the trainers also take ``global_batch_size`` themselves. A run that fixes G rather than N resumes exactly
    on another device count (see :func:`load_training_state`).

    Args:
        global_batch_size (int): Samples per update over all devices, G.
        micro_batch_size (int): Samples per micro-batch on one device, b.
        device_num (int, optional): Data-parallel devices. Default: ``None``, the communication group's size in a
            parallel mode, 1 otherwise.
        owner (str): The API asking, for messages. Default: ``"steps_for_global_batch"``.
        arg_name (str): The name `global_batch_size` was given under, for messages (a command line's flag, say).
            Default: ``"global_batch_size"``.

    Returns:
        int, N >= 1.

    Raises:
        TypeError: If an argument is not an int.
        ValueError: If an argument is < 1, or `global_batch_size` is not a multiple of
            ``device_num * micro_batch_size`` (the message gives the nearest valid values).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> ms_accum.steps_for_global_batch(256, 32, device_num=2)
        4
        >>> ms_accum.steps_for_global_batch(256, 32, device_num=1)
        8
    """
    global_batch_size = check_positive_int(owner, arg_name, global_batch_size)
    micro_batch_size = check_positive_int(owner, "micro_batch_size", micro_batch_size)
    device_num = check_positive_int(owner, "device_num", data_parallel_size() if device_num is None else device_num)
    unit = device_num * micro_batch_size
    if global_batch_size % unit:
        below = global_batch_size // unit * unit
        nearest = f"values are {below} or {below + unit}" if below else f"value is {unit}"
        raise ValueError(f"For '{owner}', '{arg_name}' must be a multiple of devices x micro-batch = "
                         f"{device_num} x {micro_batch_size} = {unit}, so that every device runs a whole number "
                         f"of micro-batches per update, but got {global_batch_size}. The nearest valid {nearest}; or "
                         f"change the micro-batch size.")
    return global_batch_size // unit


def steps_or_global_batch(owner, value, aliases, global_batch_size, micro_batch_size, device_num):
    """
    N as a trainer was given it: under one of its names (see :func:`steps_argument`), or derived from
    `global_batch_size`, not both.

    Returns:
        (N, the name it was given under, for messages).
    """
    if global_batch_size is None:
        return steps_argument(owner, value, aliases)
    given = [name for name, given_value in [(STEPS_NAME, value), *aliases.items()] if given_value is not None]
    if given:
        raise TypeError(f"For '{owner}', N must be given once, but got both '{given[0]}' and "
                        f"'{GLOBAL_BATCH_NAME}'. Pass {GLOBAL_BATCH_NAME}=G to derive N = G / (devices x "
                        f"micro-batch) on every device count, or N alone.")
    return steps_for_global_batch(global_batch_size, micro_batch_size, device_num, owner), DERIVED_STEPS_NAME
