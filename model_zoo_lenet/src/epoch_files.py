"""train.py's epoch checkpoints on disk: <prefix>-<epoch>_<update in the epoch>.ckpt, the newest `keep` kept.

One writer for every trainer: the callback of the driver and Model_ACCU (train.py's EpochCheckpoint) and the
functional loop (src/functional_train.py) both write through EpochFiles, so --keep_checkpoint_max means the same
on each.
"""
import os

import ms_accum


class EpochFiles:
    """Write `state` at an epoch's end as <directory>/<prefix>-<epoch>_<number>.ckpt with epoch_num, step_num and
    `extra`, and remove this run's oldest files beyond the newest `keep` (files of earlier runs stay)."""

    def __init__(self, directory, prefix, keep, extra=None):
        self.directory, self.prefix, self.keep, self.extra = directory, prefix, keep, extra or {}
        self.written = []

    @property
    def latest(self):
        """The path written last, or None."""
        return self.written[-1] if self.written else None

    def write(self, state, epoch, number, step_num):
        """Save `state` (a Cell) as epoch `epoch`'s checkpoint, `number` its update in the epoch, `step_num` the
        run's; returns the path."""
        path = os.path.join(self.directory, f"{self.prefix}-{epoch}_{number}.ckpt")
        ms_accum.save_checkpoint_atomic(state, path, append_dict={"epoch_num": epoch, "step_num": step_num,
                                                                  **self.extra})
        self.written.append(path)
        while len(self.written) > self.keep:
            os.remove(self.written.pop(0))
        return path
