"""Parallel set-up for train.py: communication init, the parallel context, and this process's rank."""
import os

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
        init()  # in msrun's scheduler process this returns only when the job ends
    except RuntimeError as err:
        reason = str(err).splitlines()[0]
        role = os.environ.get("MS_ROLE")
        if role == "MS_SCHED":
            raise ValueError(f"the msrun scheduler ended the '--parallel_mode' {mode} job: a node was lost or failed "
                             f"({reason}); its worker log says why") from err
        if role is None:
            raise ValueError(f"'--parallel_mode' {mode} needs a distributed launch (msrun; see README.md), but "
                             f"communication could not start: {reason}") from err
        raise ValueError(f"'--parallel_mode' {mode}: this worker could not reach the msrun scheduler or lost it "
                         f"({reason}); check --master_addr/--master_port and the scheduler's log") from err
    world = get_group_size()
    ms.set_auto_parallel_context(parallel_mode=PARALLEL_MODES[mode], gradients_mean=True, device_num=world)
    return get_rank(), world


def release_parallel():
    """Release the communication library explicitly, instead of leaving it to interpreter teardown."""
    from mindspore.communication import release
    release()
