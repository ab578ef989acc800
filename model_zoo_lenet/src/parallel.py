"""Parallel set-up for train.py: communication init, the parallel context, and this process's rank."""
PARALLEL_MODES = {
    "stand_alone": "stand_alone",
    "data_parallel": "data_parallel",
    "semi_auto_parallel": "semi_auto_parallel",
    "auto_parallel": "auto_parallel",
}


def init_parallel(mode):
    """
    Initialise communication for `mode` (a key of PARALLEL_MODES) and return (rank, world size).

    stand_alone needs no launcher and returns (0, 1). The other modes expect to be started by msrun (or
    mpirun), which sets the cluster environment; gradients are averaged over devices.
    """
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank, init
    if mode == "stand_alone":
        return 0, 1
    try:
        init()
    except RuntimeError as err:
        raise ValueError(f"'--parallel_mode' {mode} needs a distributed launch (msrun; see README.md), but "
                         f"communication could not start: {str(err).splitlines()[0]}") from err
    world = get_group_size()
    ms.set_auto_parallel_context(parallel_mode=PARALLEL_MODES[mode], gradients_mean=True, device_num=world)
    return get_rank(), world


def release_parallel():
    """Release the communication library explicitly, instead of leaving it to interpreter teardown."""
    from mindspore.communication import release
    release()
