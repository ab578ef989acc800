"""A device that runs out of memory above some micro-batch size, for tests/test_out_of_memory.py: the seam
(:func:`out_of_memory_above`, wrapped around the driver's ``_add_micro_batch``, through which it adds every
micro-batch)."""

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
