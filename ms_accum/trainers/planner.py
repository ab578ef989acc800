"""Choosing the micro-batch for the memory there is: measure, fit, plan.

A training step's peak memory is measured at a few micro-batch sizes b (by a measuring function the caller
supplies, ``memory_probe.py``: :class:`FreshProcessMeasure` runs a command per size, :class:`InProcessMeasure` a step
in this process), fitted by ``peak = fixed + per_sample * b`` (:class:`MemoryModel`), and the plan takes the
micro-batch b for which ``b * N * devices`` is the global batch G exactly and the predicted peak (the measured one
where measured) fits the budget: the largest such b, or the fastest per sample among those measured
(:func:`plan_micro_batch`). The plan (:class:`MicroBatchPlan`) is what the trainers take: its micro-batch to batch
the dataset with, its N. This module is the arithmetic; the measuring processes are ``memory_probe.py``'s, whose
public names it re-exports.
"""
import math
import numbers
import re
from dataclasses import dataclass, field

from ..core.checks import check_int_at_least, check_positive_int
from .memory_probe import (FreshProcessMeasure, InProcessMeasure, Measurement, peak_memory, report_measurement,
                           resident_peak)

__all__ = ["parse_memory", "format_bytes", "MemoryModel", "MicroBatchPlan", "micro_batch_candidates",
           "plan_micro_batch", "steps_from_plan",
           # measuring, from memory_probe.py: ms_accum/__init__.py and earlier callers import them from here
           "Measurement", "FreshProcessMeasure", "InProcessMeasure", "report_measurement", "peak_memory",
           "resident_peak"]

_UNITS = {"": 1, "b": 1, "k": 2 ** 10, "kb": 10 ** 3, "kib": 2 ** 10, "m": 2 ** 20, "mb": 10 ** 6, "mib": 2 ** 20,
          "g": 2 ** 30, "gb": 10 ** 9, "gib": 2 ** 30, "t": 2 ** 40, "tb": 10 ** 12, "tib": 2 ** 40}
PREFERENCES = ("largest", "fastest")


def parse_memory(value, owner="plan_micro_batch", arg_name="max_memory"):
    """
    A memory size in bytes from an int (bytes) or a str such as ``"3GiB"``, ``"512MiB"``, ``"2.5G"`` (K, M, G, T:
    powers of 1024; KB, MB, GB, TB: of 1000).

    Raises:
        TypeError: If `value` is neither an int nor a str.
        ValueError: If the str is not a size, or the size is not > 0.

    Examples:
        >>> import ms_accum
        >>> ms_accum.parse_memory("3GiB"), ms_accum.parse_memory("512MiB")
        (3221225472, 536870912)
    """
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, str)):
        raise TypeError(f"For '{owner}', '{arg_name}' must be an int (bytes) or a str such as '3GiB', but got "
                        f"{type(value).__name__}.")
    if not isinstance(value, str):
        size = int(value)
    else:
        match = re.fullmatch(r"\s*([+-]?)([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if match is None or match.group(3).lower() not in _UNITS:
            raise ValueError(f"For '{owner}', '{arg_name}' must be a size such as '3GiB', '512MiB' or '2.5G' "
                             f"(powers of 1024), '3GB' (of 1000), or a whole number of bytes, but got {value!r}.")
        unit = _UNITS[match.group(3).lower()]
        if unit == 1 and float(match.group(2)) != int(float(match.group(2))):  # '1.5B' was taken as 1 byte
            raise ValueError(f"For '{owner}', '{arg_name}' must be a whole number of bytes, but got {value!r}. Pass "
                             f"a size in a larger unit, such as '512MiB'.")
        size = round(float(match.group(2)) * unit) * (-1 if match.group(1) == "-" else 1)
    if size <= 0:
        raise ValueError(f"For '{owner}', '{arg_name}' must be > 0, but got {value!r}.")
    return size


def format_bytes(size):
    """'2.81 GiB', '734 MiB', '74 KiB': a size for a person."""
    if size >= 2 ** 30:
        return f"{size / 2 ** 30:.2f} GiB"
    if size >= 2 ** 20:
        return f"{size / 2 ** 20:.0f} MiB"
    if size >= 2 ** 10:
        return f"{size / 2 ** 10:.0f} KiB"
    return f"{size} bytes"


@dataclass
class MemoryModel:
    """
    peak = fixed + per_sample * b, fitted by least squares to measurements at two or more micro-batch sizes.

    Examples:
        >>> import ms_accum
        >>> model = ms_accum.MemoryModel.fit([ms_accum.Measurement(b, 100 + 10 * b) for b in (1, 2, 4)])
        >>> round(model.fixed), round(model.per_sample), round(model.predict(8))
        (100, 10, 180)
    """
    fixed: float
    per_sample: float

    @classmethod
    def fit(cls, measurements):
        """The least-squares line through `measurements` (at least two distinct micro-batch sizes)."""
        sizes = [m.micro_batch for m in measurements]
        if len(set(sizes)) < 2:
            raise ValueError(f"For 'MemoryModel', a fit needs measurements at two or more micro-batch sizes, but got "
                             f"{sorted(set(sizes))}.")
        count = len(measurements)
        mean_b = sum(sizes) / count
        mean_p = sum(m.peak for m in measurements) / count
        spread = sum((b - mean_b) ** 2 for b in sizes)
        slope = sum((m.micro_batch - mean_b) * (m.peak - mean_p) for m in measurements) / spread
        slope = max(slope, 0.0)  # a peak that falls with b is noise: memory does not shrink with the batch
        return cls(fixed=mean_p - slope * mean_b, per_sample=slope)

    def predict(self, micro_batch):
        """The predicted peak at `micro_batch`, in bytes."""
        return self.fixed + self.per_sample * micro_batch


@dataclass
class MicroBatchPlan:
    """
    A micro-batch size and N for a global batch on some devices, from measured peak memory.

    Attributes:
        micro_batch (int): b, the samples of one micro-batch on one device.
        steps (int): N, micro-batches per update: ``micro_batch * steps * devices == global_batch_size``.
        devices (int): The devices the global batch is split over.
        global_batch_size (int): G.
        max_memory (int): The budget, in bytes.
        predicted_peak (float): The model's peak at `micro_batch`, in bytes (the measured one is in `measurements`).
        model (MemoryModel): The fitted model.
        measurements (list[Measurement]): What was measured, in the order measured.
        candidates (list[int]): Every micro-batch size that divides the global batch on `devices`.

    Examples:
        >>> import ms_accum
        >>> model = ms_accum.MemoryModel(100.0 * 2 ** 20, 2 ** 20)
        >>> plan = ms_accum.MicroBatchPlan(16, 4, 2, 128, 2 ** 30, model.predict(16), model)
        >>> plan.micro_batch * plan.steps * plan.devices
        128
    """
    micro_batch: int
    steps: int
    devices: int
    global_batch_size: int
    max_memory: int
    predicted_peak: float
    model: MemoryModel
    measurements: list = field(default_factory=list)
    candidates: list = field(default_factory=list)

    def measured(self, micro_batch):
        """The Measurement at `micro_batch`, or None."""
        return next((m for m in self.measurements if m.micro_batch == micro_batch), None)

    def __str__(self):
        found = self.measured(self.micro_batch)
        peak = f"measured {format_bytes(found.peak)}" if found else f"predicted {format_bytes(self.predicted_peak)}"
        return (f"plan: micro-batch {self.micro_batch} x N {self.steps} x {self.devices} device(s) = global batch "
                f"{self.global_batch_size}; peak {peak} of {format_bytes(self.max_memory)} (fixed "
                f"{format_bytes(self.model.fixed)} + {format_bytes(self.model.per_sample)} a sample, from "
                f"{len(self.measurements)} measurements)")

    def table(self):
        """The plan table, as Markdown: every candidate b with its N, predicted peak, measured peak and speed
        where measured, and whether it fits; the chosen row marked."""
        rows = ["| b | N | predicted peak | measured peak | samples/s | fits |", "|---|---|---|---|---|---|"]
        for b in self.candidates:
            found = self.measured(b)
            peak = found.peak if found else self.model.predict(b)
            speed = f"{found.samples_per_second:.0f}" if found and found.samples_per_second else ""
            mark = " (chosen)" if b == self.micro_batch else ""
            rows.append(f"| {b}{mark} | {self.global_batch_size // (b * self.devices)} | "
                        f"{format_bytes(self.model.predict(b))} | {format_bytes(found.peak) if found else ''} | "
                        f"{speed} | {'yes' if peak <= self.max_memory else 'no'} |")
        return "\n".join(rows)


def micro_batch_candidates(global_batch_size, devices=1, owner="plan_micro_batch"):
    """
    Every micro-batch size b for which ``b * N * devices == global_batch_size`` with an integer N >= 1.

    Raises:
        TypeError: If `global_batch_size` or `devices` is not an integer.
        ValueError: If either is < 1, or `global_batch_size` is not a multiple of `devices`, naming the nearest ones
            that are.
    """
    global_batch_size = check_positive_int(owner, "global_batch_size", global_batch_size)
    devices = check_positive_int(owner, "devices", devices)
    if global_batch_size % devices:
        lower = global_batch_size - global_batch_size % devices
        upper = lower + devices
        nearest = [g for g in (lower, upper) if g >= devices]
        raise ValueError(f"For '{owner}', 'global_batch_size' must be a multiple of the {devices} devices, so that "
                         f"every device takes b x N samples an update, but got {global_batch_size}. The nearest "
                         f"valid values: {' and '.join(str(g) for g in nearest)}.")
    per_device = global_batch_size // devices
    return [b for b in range(1, per_device + 1) if per_device % b == 0]


class MemoryBudgetError(ValueError):
    """
    :func:`plan_micro_batch`'s budget cannot hold the smallest micro-batch. A ValueError; a command line that
    planned for a flag of its own can say what to pass from its attributes.

    Args:
        message (str): The error's text.
        micro_batch (int): The smallest micro-batch the plan could take.
        peak (int): Its measured peak, bytes (the largest over the devices).
        budget (int): The budget, bytes.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> measure = lambda b: ms_accum.Measurement(b, (90 + 10 * b) * 2 ** 20)
        >>> try:
        ...     ms_accum.plan_micro_batch(measure, 16, "64MiB", verbose=False)
        ... except ms_accum.MemoryBudgetError as err:
        ...     print(err.micro_batch, err.peak // 2 ** 20, err.budget // 2 ** 20)
        1 100 64
    """

    def __init__(self, message, micro_batch, peak, budget):
        super().__init__(message)
        self.micro_batch, self.peak, self.budget = micro_batch, peak, budget


def _gather_peaks(peak, world):
    """The largest of every rank's `peak` (MiB precision), so that every rank plans from the same figures."""
    if world == 1:
        return peak
    from .state import gather_ints  # pylint: disable=import-outside-toplevel
    return max(row[0] for row in gather_ints([int(math.ceil(peak / 2 ** 20))], world)) * 2 ** 20


def plan_micro_batch(measure, global_batch_size, max_memory, devices=1, prefer="largest", max_measurements=4,
                     world=1, verbose=True):
    r"""
    Choose the micro-batch b and N for a global batch G within a memory budget, from measured peaks.

    Measures the step's peak at the smallest candidate b and at a larger one, fits ``peak = fixed + per_sample *
    b``, then measures the largest candidate predicted to fit, and again lower while a measured peak exceeds the
    budget, fitting only the sizes below it; once a measured size fits, the next larger candidate is measured too,
    and taken (and the search goes on above it) if it fits after all: a plan measured on both sides is tight (up to
    `max_measurements` measurements in all). The chosen size is always one it measured. Candidates are the b with
    ``b * N * devices == G`` exactly. Measurements run in increasing order of b where they can, so that an
    in-process measure on CPU (peak resident memory never falls) reads each size's own peak.

    Args:
        measure (Callable[[int], Measurement]): Measures one micro-batch size: for example a
            :class:`FreshProcessMeasure` or an :class:`InProcessMeasure`.
        global_batch_size (int): G, the samples of one update over every device.
        max_memory (Union[int, str]): The budget per device: bytes, or a size such as ``"3GiB"``.
        devices (int): The devices G is split over. Default: ``1``.
        prefer (str): ``"largest"`` takes the largest b that fits; ``"fastest"`` the fastest per sample among
            the sizes measured that fit. Default: ``"largest"``.
        max_measurements (int): At most this many sizes are measured, >= 2. Default: ``4``.
        world (int): Processes planning together (data parallel): each measures, and all take the largest peak
            of every size, so that every rank takes the same plan. Default: ``1``.
        verbose (bool): Print each measurement and the plan table. Default: ``True``.

    Returns:
        MicroBatchPlan, the plan; ``str(plan)`` is its line, ``plan.table()`` its table.

    Raises:
        TypeError: If `measure` is not callable or returns no Measurement, `max_memory` is neither an int nor a
            str, or `global_batch_size`, `devices`, `world` or `max_measurements` is not an integer.
        ValueError: If `global_batch_size`, `devices` or `world` is < 1, G is not a multiple of `devices`
            (naming the nearest values that are), `max_memory` is not a size > 0, `prefer` is not one of
            "largest" and "fastest", or `max_measurements` < 2.
        MemoryBudgetError: If the smallest micro-batch needs more than `max_memory` (naming its measured peak).
            A ValueError.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> peaks = {1: 100, 2: 110, 4: 130, 8: 170, 16: 250}  # MiB: 90 fixed + 10 a sample
        >>> measure = lambda b: ms_accum.Measurement(b, peaks[b] * 2 ** 20)
        >>> plan = ms_accum.plan_micro_batch(measure, 16, "200MiB", verbose=False)
        >>> plan.micro_batch, plan.steps
        (8, 2)
    """
    owner = "plan_micro_batch"
    if not callable(measure):
        raise TypeError(f"For '{owner}', 'measure' must be a callable taking a micro-batch size and returning a "
                        f"Measurement, but got {type(measure).__name__}. Pass InProcessMeasure(run_at) or "
                        f"FreshProcessMeasure(command).")
    budget = parse_memory(max_memory, owner)
    candidates = micro_batch_candidates(global_batch_size, devices, owner)
    world = check_positive_int(owner, "world", world)
    if prefer not in PREFERENCES:
        raise ValueError(f"For '{owner}', 'prefer' must be one of {list(PREFERENCES)}, but got {prefer!r}.")
    max_measurements = check_int_at_least(owner, "max_measurements", max_measurements, 2)
    measurements = []

    def take(b):
        found = measure(b)
        if not isinstance(found, Measurement):
            raise TypeError(f"For '{owner}', 'measure' must return a Measurement, but returned "
                            f"{type(found).__name__} for micro-batch {b}. Pass InProcessMeasure(run_at) or "
                            f"FreshProcessMeasure(command), which measure a function or a command at b, or a function "
                            f"of your own that returns Measurement(b, peak_bytes).")
        if found.micro_batch != b:  # its peak would be filed under b, and the plan fitted to another size's peak
            raise ValueError(f"For '{owner}', 'measure' must return the Measurement of the micro-batch it was asked "
                             f"for, but returned one of micro-batch {found.micro_batch} when asked for {b}. Run "
                             f"and measure at the size it is called with: Measurement(b, peak_bytes).")
        found = Measurement(b, _gather_peaks(found.peak, world), found.samples_per_second)
        measurements.append(found)
        if verbose:
            speed = f", {found.samples_per_second:.0f} samples/s" if found.samples_per_second else ""
            print(f"plan: micro-batch {b}: peak {format_bytes(found.peak)}{speed}", flush=True)
        return found

    smallest = take(candidates[0])
    if smallest.peak > budget:
        raise MemoryBudgetError(f"For '{owner}', 'max_memory' must hold the smallest micro-batch ({candidates[0]}), "
                                f"which peaked at {format_bytes(smallest.peak)}, but got {format_bytes(budget)}. "
                                f"Raise 'max_memory' to at least {format_bytes(smallest.peak)}, or train a smaller "
                                f"model.", candidates[0], smallest.peak, budget)
    if len(candidates) == 1:
        model = MemoryModel(float(smallest.peak), 0.0)
        return _plan(candidates[0], global_batch_size, devices, budget, model, measurements, candidates, verbose)
    # a second point well apart from the first: about an eighth of the largest candidate, at least the second
    second = max(c for c in candidates if c <= max(candidates[1], candidates[-1] // 8))
    take(second)
    while True:
        over = {m.micro_batch for m in measurements if m.peak > budget}
        ceiling = min(over) if over else math.inf
        below = [m for m in measurements if m.micro_batch < ceiling]  # the peak grows with b: a size over the
        # budget says nothing of those below it, where a second arena may not have opened yet
        model = MemoryModel.fit(below if len({m.micro_batch for m in below}) >= 2 else measurements)
        fitting = [c for c in candidates if c < ceiling and (
            next((m.peak for m in measurements if m.micro_batch == c), None) or model.predict(c)) <= budget]
        choice = fitting[-1] if fitting else candidates[0]
        if len(measurements) >= max_measurements:
            break
        measured = {m.micro_batch for m in measurements}
        if choice not in measured:
            take(choice)
            continue
        # the choice measured and fits: confirm the next size goes over, since peaks grow in steps of the memory
        # pool's chunks as much as by the sample (docs/performance_history.md, Planning the micro-batch)
        larger = [c for c in candidates if c > choice]
        if not larger or larger[0] in measured:
            break
        take(larger[0])
    fits = [m for m in measurements if m.peak <= budget]
    if prefer == "fastest" and any(m.samples_per_second for m in fits):
        choice = max((m for m in fits if m.samples_per_second), key=lambda m: m.samples_per_second).micro_batch
    elif not any(m.micro_batch == choice and m.peak <= budget for m in measurements):
        choice = max(m.micro_batch for m in fits)  # unmeasured or over: the largest measured size that fits
    return _plan(choice, global_batch_size, devices, budget, model, measurements, candidates, verbose)


def _plan(choice, global_batch_size, devices, budget, model, measurements, candidates, verbose):
    plan = MicroBatchPlan(choice, global_batch_size // (choice * devices), devices, global_batch_size, budget,
                          model.predict(choice), model, measurements, candidates)
    if verbose:
        print(plan.table(), flush=True)
        print(plan, flush=True)
    return plan


def steps_from_plan(owner, plan, given, batch_size, devices):
    """
    N from `plan` (a :class:`MicroBatchPlan`), for a trainer whose dataset is batched at `batch_size` on `devices`
    devices; `given`: the names of N or G the caller also passed.

    Raises:
        TypeError: If `plan` is not a MicroBatchPlan, or N or G was given too.
        ValueError: If the dataset is batched at another micro-batch, or the devices are not the plan's.
    """
    if not isinstance(plan, MicroBatchPlan):
        raise TypeError(f"For '{owner}', 'plan' must be a MicroBatchPlan (from ms_accum.plan_micro_batch), but got "
                        f"{type(plan).__name__}.")
    if given:
        raise TypeError(f"For '{owner}', N must be given once: pass only one of 'gradient_accumulation_steps', "
                        f"'global_batch_size' and 'plan', but got {', '.join(repr(name) for name in given)} and "
                        f"'plan'.")
    if batch_size != plan.micro_batch:
        raise ValueError(f"For '{owner}', the dataset must be batched at the plan's micro-batch ({plan.micro_batch}), "
                         f"but it is batched at {batch_size}. Batch it with plan.micro_batch "
                         f"(dataset.batch(plan.micro_batch)), or plan for this micro-batch.")
    if devices != plan.devices:
        raise ValueError(f"For '{owner}', the run must have the plan's {plan.devices} device(s), so that b x N x "
                         f"devices is its global batch ({plan.global_batch_size}), but it has {devices}. Plan with "
                         f"devices={devices}.")
    return plan.steps
