"""CellFront: the window loop's side for a trainer that drives one engine cell (TrainAccuStepsCell or
TrainAccuStepsWithLossScaleCell), written once for :class:`GradientAccumulation` and :class:`Model_ACCU`.

The cell counts the windows and chooses N on the device (``accu_windows``, ``accu_steps``); the loop asks it the N
of each window when the window opens. A micro-batch runs the cell's accumulation graph, a window's last one that
graph and then the window's end (no network in it), so the network is compiled once.
"""
from functools import partial

from .loop import LoopFrontEnd
from .nonfinite import NonFiniteGuard
from .telemetry import window_record


class CellFront(LoopFrontEnd):
    """
    :class:`LoopFrontEnd` over an engine cell.

    Args:
        owner (str): The trainer's method, named in errors and warnings.
        cell (Cell): The engine cell (its ``accumulation`` mode is set before each call).
        nonfinite (str): The trainer's `nonfinite` ("skip", "raise" or "apply"); "raise" is decided here, on the
            host, where the window's micro-batches are known (the cell skips such a window).
        max_nonfinite_windows (int): Windows skipped in a row that stop training.
    """

    def __init__(self, owner, cell, nonfinite, max_nonfinite_windows):
        self.owner, self.cell = owner, cell
        self.nonfinite, self.max_nonfinite_windows = nonfinite, max_nonfinite_windows

    def window_steps(self, update):
        """The N of the window that opens: the cell's, from the device for a schedule or a policy."""
        return self.cell.next_window_steps()

    def run_cell(self, data, accumulate):
        """Call the cell on micro-batch `data`, accumulating only, or ending the window after it."""
        self.cell.set_accumulation(accumulate)
        return self.cell(*data)

    def accumulate(self, data):
        self.run_cell(data, True)

    def update(self, data):
        return self.run_cell(data, False)

    def drop(self):
        self.cell.drop()

    def end_window(self):
        """End the open window on the device (the cell's window-end graph); returns its outputs."""
        return self.cell.end_window()

    def window_record(self, cb_params, outputs, micro_batches, window_steps):
        """A function building the update's WindowRecord on demand (it reads the device only when called)."""
        cell = self.cell
        return partial(window_record, cb_params, outputs, micro_batches,
                       (cell.accu_last_items, cell.accu_last_grad_norm, cell.accu_last_clipped,
                        cell.accu_nonfinite_streak), cell.optimizer, cell.noise_records, window_steps)

    def nonfinite_guard(self, save_state):
        cell = self.cell
        return NonFiniteGuard(self.owner, self.nonfinite, self.max_nonfinite_windows,
                              (cell.accu_nonfinite_streak, cell.accu_skip_history), cell.scale_kind is not None,
                              save_state)
