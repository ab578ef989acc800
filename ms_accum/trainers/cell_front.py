"""CellFront: the window loop's side for a trainer that drives one engine cell (TrainAccuStepsCell or
TrainAccuStepsWithLossScaleCell), written once for :class:`GradientAccumulation` and :class:`Model_ACCU`.

The cell counts the windows and chooses N on the device (``accu_windows``, ``accu_steps``); the loop asks it the N
of each window when the window opens. A micro-batch runs the cell's accumulation graph, a window's last one that
graph and then the window's end (no network in it), so the network is compiled once.
"""
from functools import partial

from .loop import LoopFrontEnd
from .nonfinite import NonFiniteGuard
from .telemetry import rate_held, window_record


class CellFront(LoopFrontEnd):
    """
    :class:`LoopFrontEnd` over an engine cell.

    Args:
        owner (str): The trainer's method, named in errors and warnings.
        cell (Cell): The engine cell (its ``accumulation`` mode is set before each call). Its `nonfinite` is the
            trainer's: under "raise" the cell skips a window whose gradient is not finite and raises, and the
            trainer's guard raises instead, naming the window's micro-batches, which the cell does not know.
        max_nonfinite_windows (int): Windows skipped in a row that stop training.
    """

    def __init__(self, owner, cell, max_nonfinite_windows):
        self.owner, self.cell, self.max_nonfinite_windows = owner, cell, max_nonfinite_windows

    def window_steps(self, update):
        """The N of the window that opens: the cell's, from the device for a schedule or a policy."""
        return self.cell.next_window_steps()

    def run_cell(self, data, accumulate):
        """Call the cell on micro-batch `data`, accumulating only, or ending the window after it (without the
        cell's own raise for a skipped non-finite window: the trainer's guard, which reads every window under
        "raise", stops with the window's micro-batches named)."""
        self.cell.set_accumulation(True)
        outputs = self.cell(*data)
        return outputs if accumulate else self.end_window()

    def accumulate(self, data):
        self.run_cell(data, True)

    def update(self, data):
        return self.run_cell(data, False)

    def drop(self):
        self.cell.drop()

    def end_window(self):
        """End the open window on the device (the cell's window-end graph); returns its outputs."""
        return self.cell.end_window(raise_skipped=False)

    def window_record(self, cb_params, outputs, micro_batches, window_steps):
        """A function building the update's WindowRecord on demand (it reads the device only when called)."""
        cell = self.cell
        return partial(window_record, cb_params, outputs, micro_batches,
                       (cell.accu_last_items, cell.accu_last_grad_norm, cell.accu_last_clipped,
                        cell.accu_nonfinite_streak), cell.optimizer, cell.noise_records, window_steps,
                       rate_held(cell.optimizer))

    def nonfinite_guard(self, save_state):
        cell = self.cell
        return NonFiniteGuard(self.owner, cell.nonfinite, self.max_nonfinite_windows,
                              (cell.accu_nonfinite_streak, cell.accu_skip_history), cell.scale_kind is not None,
                              save_state)
