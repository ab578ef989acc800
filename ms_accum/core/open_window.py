"""The open window as the host counts it, and what becomes of it at an epoch's end.

The device counts a window's micro-batches in ``accu_micro_steps``; reading it after every micro-batch would make the
host wait for each one. So the host keeps one count of its own, :class:`OpenWindow`, seeded from the device once: the
training loop's (``trainers/loop.py``), which the out-of-memory rerun reads, and, for a parallel cell called in a
loop of the user's, the cell's automatic mode's. (With ``noise_scale="first"`` a parallel cell also keeps one
bit, whether its next micro-batch opens a window, to choose its measuring graph: ``cells/parallel.py``.)
:func:`epoch_end_action` is the partial-window rule, written once for the loop and for the plan of a run's updates
(``schedule.py``).
"""

PARTIAL_WINDOW_POLICIES = ("flush", "drop", "carry")


def epoch_end_action(partial_window, last_epoch):
    """
    What becomes of a window still open at an epoch's end: ``"update"`` (applied as a smaller window: ``"flush"``,
    and ``"carry"`` after the last epoch), ``"drop"`` (discarded) or ``"carry"`` (kept open into the next epoch).

    Args:
        partial_window (str): One of :data:`PARTIAL_WINDOW_POLICIES`.
        last_epoch (bool): Whether the epoch is the run's last.

    Returns:
        str.
    """
    if partial_window == "carry":
        return "update" if last_epoch else "carry"
    return "update" if partial_window == "flush" else "drop"


class OpenWindow:
    """
    The open window's micro-batches so far and its N, counted on the host.

    Args:
        micro_batches (int): Micro-batches already added (a window opened before: a resume). Default: ``0``.
        steps (int): Its N (0 while no window is open). Default: ``0``.
    """

    def __init__(self, micro_batches=0, steps=0):
        self.micro_batches, self.steps = micro_batches, steps

    @classmethod
    def of_cell(cls, cell):
        """The open window of an engine cell, read from its device counters once."""
        micro_batches = int(cell.accu_micro_steps.asnumpy())
        return cls(micro_batches, cell.next_window_steps() if micro_batches else 0)

    @property
    def is_open(self):
        """Whether a micro-batch has been added since the last window ended."""
        return self.micro_batches > 0

    def open(self, steps):
        """A window of `steps` micro-batches opens (before its first micro-batch is added)."""
        self.steps = steps

    def add(self):
        """One more micro-batch in the window; returns whether it is the window's last (N reached)."""
        self.micro_batches += 1
        return self.micro_batches >= self.steps

    def close(self):
        """The window ended or was dropped; returns the micro-batches it held."""
        held, self.micro_batches, self.steps = self.micro_batches, 0, 0
        return held
