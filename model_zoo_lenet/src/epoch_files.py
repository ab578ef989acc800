"""train.py's epoch checkpoints on disk: <prefix>-<epoch>_<update in the epoch>.ckpt, the newest `keep` kept.

One writer for every trainer: the callback of the driver and Model_ACCU (train.py's EpochCheckpoint) and the
functional loop (src/functional_train.py) both write through EpochFiles, so --keep_checkpoint_max means the same
on each.
"""
import os
import re

import ms_accum

BUFFERS = "accu_grads."  # a TrainAccuStepsCell's gradient buffers, left out of epoch checkpoints


class EpochFiles:
    """Write `state` at an epoch's end as <directory>/<prefix>-<epoch>_<number>.ckpt with epoch_num, step_num and
    `extra`, and remove the oldest files of the prefix beyond the newest `keep`: those this run wrote and those
    it continues (written under the same prefix before a resume), as MindSpore's ModelCheckpoint prunes its
    prefix's files; another run's prefix is not touched."""

    def __init__(self, directory, prefix, keep, extra=None):
        self.directory, self.prefix, self.keep, self.extra = directory, prefix, keep, extra or {}
        name = re.compile(rf"{re.escape(prefix)}-(\d+)_(\d+)\.ckpt")
        found = [(int(m.group(1)), int(m.group(2)), m.group(0)) for m in map(name.fullmatch, self._listing()) if m]
        self.written = [os.path.join(directory, file) for _, _, file in sorted(found)]

    def _listing(self):
        return os.listdir(self.directory) if os.path.isdir(self.directory) else []

    @property
    def latest(self):
        """The newest checkpoint of the prefix (this run's last, or before its first write the newest of those
        written before its resume), or None."""
        return self.written[-1] if self.written else None

    def write(self, state, epoch, number, step_num):
        """Save `state` (a Cell) as epoch `epoch`'s checkpoint, `number` its update in the epoch, `step_num` the
        run's, without the gradient buffers (a TrainAccuStepsCell's ``accu_grads``: not the network's, and zero
        but for a window carried on, which a resume at an epoch does not take); returns the path."""
        path = os.path.join(self.directory, f"{self.prefix}-{epoch}_{number}.ckpt")
        ms_accum.save_checkpoint_atomic(state, path, choice_func=lambda name: not name.startswith(BUFFERS),
                                        append_dict={"epoch_num": epoch, "step_num": step_num, **self.extra})
        if path in self.written:  # a resumed run writing an epoch again
            self.written.remove(path)
        self.written.append(path)
        while len(self.written) > self.keep:
            oldest = self.written.pop(0)
            if os.path.exists(oldest):  # a file removed by hand is gone already
                os.remove(oldest)
        return path
