"""A device that runs out of memory above some micro-batch size, for tests/test_out_of_memory.py: the seam
(:func:`out_of_memory_above`, wrapped around the driver's ``_add_micro_batch``, through which it adds every
micro-batch), and model_zoo_lenet/train.py run on it in this process:

    python tests/oom_worker.py LIMIT STOP_AFTER [train.py arguments ...]

Micro-batches of more than LIMIT samples fail with MindSpore's device out-of-memory message before they run;
after STOP_AFTER micro-batches were asked for (0: never), the process SIGKILLs itself at the next one, as a
crash would stop it there.
"""
import os
import runpy
import signal
import sys

ZOO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_zoo_lenet")

OOM_MESSAGE = ("Malloc device memory failed, free memory size is less than half of total memory size. "
               "Device(id:0) Out of Memory")


def out_of_memory_above(add, limit, seen, stop_after=None, stop=None):
    """`add` (a trainer's ``_add_micro_batch``, bound or taken from the class) failing as MindSpore's device memory
    pool fails for micro-batches of more than `limit` samples. Each micro-batch asked for appends its size to
    `seen`; once `stop_after` were asked for, `stop()` is called at the next one instead (a crash)."""
    def add_or_fail(*args):
        data = args[-1]
        if stop_after is not None and len(seen) == stop_after:
            stop()
        seen.append(int(data[0].shape[0]))
        if data[0].shape[0] > limit:
            raise RuntimeError(OOM_MESSAGE)
        return add(*args)
    return add_or_fail


def kill_this_process():
    os.kill(os.getpid(), signal.SIGKILL)


def main():
    limit, stop_after = int(sys.argv[1]), int(sys.argv[2])
    sys.path.insert(0, ZOO)
    from src.cpu_speed import apply_env_defaults  # pylint: disable=import-outside-toplevel
    apply_env_defaults()  # as train.py does, before MindSpore is imported
    import ms_accum  # pylint: disable=import-outside-toplevel
    trainer = ms_accum.GradientAccumulation
    trainer._add_micro_batch = out_of_memory_above(  # pylint: disable=protected-access
        trainer._add_micro_batch, limit, [], stop_after or None, kill_this_process)  # pylint: disable=protected-access
    sys.argv = [os.path.join(ZOO, "train.py"), *sys.argv[3:]]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
