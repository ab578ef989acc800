"""Measuring a training step's peak memory at one micro-batch size, for the planner (``planner.py``).

:class:`FreshProcessMeasure` runs a command per size in a fresh process, which prints its :class:`Measurement`
with :func:`report_measurement`; :class:`InProcessMeasure` runs a step in this process. Peak memory is
MindSpore's peak device memory on GPU and Ascend, and the peak resident memory (``VmHWM``) on CPU
(:func:`peak_memory`, :func:`resident_peak`).
"""
import gc
import json
import os
import resource
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass

from ..core.user_warning import warn
from . import preloaded_run


@dataclass
class Measurement:
    """
    One measured micro-batch size: its peak memory in bytes, and its speed in samples per second (None where not
    measured).

    Examples:
        >>> import ms_accum
        >>> ms_accum.Measurement(8, 300 * 2 ** 20, 950.0).peak
        314572800
    """
    micro_batch: int
    peak: int
    samples_per_second: float = None


class FreshProcessMeasure:
    r"""
    Measures a micro-batch size in a fresh process: runs `command` with ``{micro_batch}`` replaced by b, and reads
    the last line of its standard output that is a JSON object with ``"peak"`` (bytes) and, optionally,
    ``"samples_per_second"`` (what :func:`report_measurement` prints).

    With `preload`, the process of the next measurement is started while the current one runs, and imports these
    modules, then waits for its arguments: MindSpore's import, a good part of a small measurement's time
    (docs/performance_history.md, Planning the micro-batch), overlaps the measurement before it. Each measurement
    still runs in a process that has done nothing but import. `command` must then be a Python script run by an
    interpreter: ``[python, script.py, *arguments]``; the script is run as ``__main__`` with its own directory first
    on ``sys.path``, as Python would run it. Call :meth:`close` when done (or use the measure as a context manager)
    to end the process waiting for a next measurement.

    Args:
        command (list[str]): The command, one argument a list entry; ``{micro_batch}`` in any of them.
        env (dict, optional): Its environment. Default: ``None`` (this process's). MindSpore's compile cache is
            turned off in it (``MS_COMPILER_CACHE_ENABLE=0``): a micro-batch's peak holds its compilation, and the
            cache, which hands out its graphs by their order, would run each size on the graphs of the size
            measured before it.
        timeout (float, optional): Seconds before the measurement is given up. Default: ``None``.
        preload (Union[list[str], tuple[str]]): Modules the next process imports ahead, such as
            ``("mindspore",)``. Default: ``()`` (none: each process starts when its measurement does).

    Raises:
        TypeError: If `command` or `preload` is not a list of str.
        ValueError: If no argument of `command` holds ``{micro_batch}``, or `preload` is given and `command` is not
            ``[python, script.py, ...]``.
        RuntimeError: When called, if the command fails or prints no measurement (its standard error's end in
            the message).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import sys
        >>> import ms_accum
        >>> script = "import json, sys; print(json.dumps({'peak': 2 ** 20 * (100 + int(sys.argv[1]))}))"
        >>> measure = ms_accum.FreshProcessMeasure([sys.executable, "-c", script, "{micro_batch}"])
        >>> measure(8).peak // 2 ** 20
        108
    """

    def __init__(self, command, env=None, timeout=None, preload=()):
        if not isinstance(command, (list, tuple)) or not all(isinstance(arg, str) for arg in command):
            raise TypeError(f"For 'FreshProcessMeasure', 'command' must be a list of str, but got {command!r}.")
        if not any("{micro_batch}" in arg for arg in command):
            raise ValueError(f"For 'FreshProcessMeasure', 'command' must hold '{{micro_batch}}' where the micro-batch "
                             f"size goes, but got {command!r}.")
        if not isinstance(preload, (list, tuple)) or not all(isinstance(name, str) for name in preload):
            raise TypeError(f"For 'FreshProcessMeasure', 'preload' must be a list of module names, but got "
                            f"{preload!r}.")
        if preload and (len(command) < 2 or not command[1].endswith(".py") or "{micro_batch}" in command[0]):
            raise ValueError(f"For 'FreshProcessMeasure', 'preload' runs a Python script in a process started ahead, "
                             f"so 'command' must be [python, script.py, *arguments], but got {command!r}. Drop "
                             f"'preload', or run the script with the interpreter.")
        self.command, self.timeout, self.preload = list(command), timeout, tuple(preload)
        self.env = dict(os.environ if env is None else env, MS_COMPILER_CACHE_ENABLE="0")
        self._ahead = [None]  # the process started ahead for the next measurement, ended when this measure goes
        weakref.finalize(self, _end_process, self._ahead)

    def __call__(self, micro_batch):
        argv = [arg.replace("{micro_batch}", str(micro_batch)) for arg in self.command]
        if not self.preload:
            done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=self.timeout,
                                  check=False)
            return self._read(micro_batch, argv, done.returncode, done.stdout, done.stderr)
        process = self._ahead[0] or self._start()
        self._ahead[0] = self._start()  # imports while `process` measures
        try:
            stdout, stderr = process.communicate(json.dumps(argv[1:]) + "\n", timeout=self.timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        return self._read(micro_batch, argv, process.returncode, stdout, stderr)

    def _start(self):
        return subprocess.Popen([self.command[0], os.path.abspath(preloaded_run.__file__), *self.preload],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env)

    @staticmethod
    def _read(micro_batch, argv, returncode, stdout, stderr):
        lines = [line for line in stdout.splitlines() if line.startswith("{") and '"peak"' in line]
        if returncode or not lines:
            raise RuntimeError(f"For 'FreshProcessMeasure', measuring micro-batch {micro_batch} failed (exit code "
                               f"{returncode}{'' if lines else ', no measurement printed'}): "
                               f"{' '.join(argv)}\n{stderr[-2000:]}")
        found = json.loads(lines[-1])
        return Measurement(micro_batch, int(found["peak"]), found.get("samples_per_second"))

    def close(self):
        """End the process started ahead for a next measurement, if any."""
        _end_process(self._ahead)
        self._ahead[0] = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def _end_process(holder):
    """Kill the process started ahead (`holder[0]`, or None), and reap it."""
    process = holder[0]
    if process is not None and process.poll() is None:
        process.kill()
        process.communicate()


def resident_peak():
    """This process's peak resident memory in bytes: Linux's ``VmHWM``, the high-water mark of the process's own
    memory. Not ``ru_maxrss``: Linux carries it across ``exec`` from the process that started this one, so a
    process started by a large one can read the starter's peak, not its own (docs/performance_history.md, Planning
    the micro-batch). Elsewhere ru_maxrss (kilobytes; bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def peak_memory():
    """This process's peak memory so far, in bytes: on GPU and Ascend MindSpore's peak device memory, on CPU (where
    MindSpore's statistics are 0) the peak resident memory (:func:`resident_peak`)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    if ms.get_context("device_target") != "CPU":
        return int(ms.runtime.max_memory_allocated())
    return resident_peak()


def reset_peak_memory():
    """Start the figure :func:`peak_memory` reads afresh, at what this process holds now: on GPU and Ascend
    ``mindspore.runtime.reset_max_memory_allocated()``, on CPU Linux's ``/proc/self/clear_refs`` (``5`` resets the
    process's ``VmHWM``). Returns False where it cannot be reset (the peak then never falls)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    if ms.get_context("device_target") != "CPU":
        ms.runtime.reset_max_memory_allocated()
        return True
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:  # not Linux, or not writable here: the caller is told by the False
        return False
    return True


def report_measurement(samples, seconds):
    """
    In a measuring process (:class:`FreshProcessMeasure`): print its peak memory (:func:`peak_memory`) and its
    speed over `samples` trained in `seconds`, as the JSON line the parent reads.

    Examples:
        >>> import ms_accum
        >>> ms_accum.report_measurement(256, 0.5)  # doctest: +SKIP
        {"peak": 734003200, "samples_per_second": 512.0}
    """
    speed = samples / seconds if seconds > 0 else None
    print(json.dumps({"peak": peak_memory(), "samples_per_second": speed}), flush=True)


class InProcessMeasure:
    r"""
    Measures micro-batch sizes in this process: ``run_at(b)`` trains a few steps at micro-batch b; the measure is
    the peak memory after it (:func:`peak_memory`) and the samples per second of a second call (which counts
    whatever ``run_at`` does: a ``run_at`` that builds and compiles its trainer each time reads a speed of
    building, so keep the trainer of each size between its two calls for a speed of training). Before each size
    it collects the garbage of the sizes before and starts the peak afresh (:func:`reset_peak_memory`), so a size
    reads its own peak over what the process holds then (what earlier sizes left, their compiled graphs, counts;
    a fresh process per size, :class:`FreshProcessMeasure`, leaves that out). Where the peak cannot be reset it
    never falls, and a size measured after a larger one reads at least the larger one's peak (with a warning).

    Args:
        run_at (Callable[[int], int]): Trains a few steps at micro-batch b; returns the samples trained.

    Raises:
        TypeError: If `run_at` is not callable.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> measure = ms_accum.InProcessMeasure(lambda b: 4 * b)  # a step that trains 4 micro-batches of b
        >>> measure(8).micro_batch
        8
    """

    def __init__(self, run_at):
        if not callable(run_at):
            raise TypeError(f"For 'InProcessMeasure', 'run_at' must be callable, but got {type(run_at).__name__}.")
        self.run_at, self._told = run_at, False

    def __call__(self, micro_batch):
        gc.collect()
        if not reset_peak_memory() and not self._told:
            self._told = True
            warn("For 'InProcessMeasure', this process's peak memory cannot be reset here (/proc/self/clear_refs is "
                 "not writable), so a micro-batch measured after a larger one reads at least the larger one's peak, "
                 "and a plan near the budget errs towards smaller micro-batches. Use FreshProcessMeasure for a plan "
                 "that measures each size alone.", UserWarning)
        self.run_at(micro_batch)  # compiles and warms up
        start = time.perf_counter()
        samples = self.run_at(micro_batch)
        seconds = time.perf_counter() - start
        return Measurement(micro_batch, peak_memory(), samples / seconds if samples and seconds > 0 else None)
