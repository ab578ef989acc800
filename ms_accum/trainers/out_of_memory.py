"""Rerunning a window that ran out of device memory with half the micro-batch, as MosaicML Composer's automatic
micro-batching does.

:class:`MicroBatchHalving` sits between the training loop and a trainer's cells: it holds the open window's
micro-batches, and when adding one fails with MindSpore's device out-of-memory error it discards the window
(nothing was applied: the optimizer steps only at the window's end) and adds it again from its start, every
micro-batch split in two along its leading dimension, and so on while the error comes back. The global batch and
the optimizer's step count never change; the split is kept for the rest of the run.
"""

OOM_POLICIES = ("raise", "halve")
_OOM_TEXTS = ("Out of Memory", "out of memory", "Malloc device memory failed", "Allocate memory failed",
              "Alloc memory failed", "Memory not enough", "memory isn't enough")


def is_device_out_of_memory(error):
    """
    Whether `error` is MindSpore's failure to allocate device memory (a RuntimeError or MemoryError whose text is
    one of the messages of MindSpore's GPU and Ascend memory pools).

    Examples:
        >>> import ms_accum
        >>> ms_accum.is_device_out_of_memory(RuntimeError("Malloc device memory failed ... Out of Memory"))
        True
        >>> ms_accum.is_device_out_of_memory(ValueError("shape mismatch"))
        False
    """
    return isinstance(error, (RuntimeError, MemoryError)) and any(text in str(error) for text in _OOM_TEXTS)


def split_micro_batch(owner, data, pieces):
    """`data` (a tuple of Tensors, one micro-batch) cut into `pieces` micro-batches along the leading dimension,
    as equal as can be (every piece holds at least one sample)."""
    rows = {tuple(item.shape)[0] if getattr(item, "ndim", 0) else None for item in data}
    if len(rows) != 1 or None in rows:
        raise ValueError(f"For '{owner}', on_out_of_memory='halve' splits a micro-batch along the leading dimension "
                         f"of its inputs, which must agree, but they have shapes "
                         f"{[tuple(item.shape) for item in data]}. Pass on_out_of_memory='raise' and a smaller "
                         f"micro-batch.")
    size = rows.pop()
    if pieces > size:
        return None
    bounds = [size * index // pieces for index in range(pieces + 1)]
    return [tuple(item[start:end] for item in data) for start, end in zip(bounds, bounds[1:])]


class MicroBatchHalving:
    """
    The open window's micro-batches, added through `add` (one micro-batch, a tuple of Tensors) and ended through
    `end`; on a device out-of-memory error while adding, the window is discarded with `drop` and added again from
    its start with every micro-batch split in twice as many pieces.

    Args:
        owner (str): Named in messages.
        add (Callable): Adds one micro-batch to the window.
        end (Callable): Ends the window (the optimizer's step); returns its outputs. Not retried: a smaller
            micro-batch does not make it smaller.
        drop (Callable): Discards the open window (buffers and counters cleared, nothing applied).
        open_window (OpenWindow): The training loop's count of the open window's micro-batches (this one's last
            included when it is added): a window opened before this run (a resume) holds more than are held here,
            and cannot be rerun.
    """

    def __init__(self, owner, add, end, drop, open_window):
        self.owner, self._add, self._end, self._drop = owner, add, end, drop
        self.open_window = open_window
        self.splits = 1
        self.window = []  # the open window's micro-batches, as the dataset gave them

    def accumulate(self, data):
        """Add micro-batch `data` to the open window."""
        self.window.append(data)
        self._guarded(lambda: self._add_split(data))

    def update(self, data):
        """Add the window's last micro-batch `data` and end the window; returns what `end` returns."""
        self.window.append(data)
        self._guarded(lambda: self._add_split(data))
        outputs = self._end()
        self.window = []
        return outputs

    def drop(self):
        """Discard the open window."""
        self._drop()
        self.window = []

    def _add_split(self, data):
        pieces = split_micro_batch(self.owner, data, self.splits) if self.splits > 1 else [data]
        for piece in pieces:
            self._add(piece)

    def _guarded(self, run):
        while True:
            try:
                run()
                return
            except (RuntimeError, MemoryError) as error:
                if not is_device_out_of_memory(error):
                    raise
                self._halve(error)
                run = self._rerun

    def _halve(self, error):
        """Discard the window and double the split, or raise `error` if the window cannot be rerun smaller."""
        if len(self.window) != self.open_window.micro_batches:
            raise RuntimeError(f"For '{self.owner}', a window ran out of device memory, but it was opened before "
                               f"this run resumed, so its first micro-batches are not held to rerun it with a "
                               f"smaller micro-batch. Resume with the dataset batched smaller and the same global "
                               f"batch ('global_batch_size'), or from an epoch checkpoint.") from error
        size = tuple(self.window[-1][0].shape)[0]
        if split_micro_batch(self.owner, self.window[-1], self.splits * 2) is None:
            raise RuntimeError(f"For '{self.owner}', a window ran out of device memory with micro-batches of "
                               f"{max(1, size // self.splits)} sample(s), which cannot be halved. Train a smaller "
                               f"model, or on a device with more memory.") from error
        self._drop()
        self.splits *= 2
        print(f"{self.owner}: a window ran out of device memory with micro-batches of {-(-size // (self.splits // 2))}"
              f" sample(s): rerunning it from its start with {-(-size // self.splits)} and {self.splits} times as "
              f"many micro-batches (the global batch and the update count stay the same).", flush=True)

    def _rerun(self):
        for data in self.window:
            self._add_split(data)
