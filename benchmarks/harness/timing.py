"""Clocks and what they are summarised by: wall and CPU seconds, samples per second, median and quartiles; and where
a run's time goes, from Python's profiler and from MindSpore's compile profile."""
import os
import re
import statistics
import sys
import time


def wall_and_cpu(run):
    """(wall seconds, this process's CPU seconds, all threads) of run()."""
    start, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - start, time.process_time() - cpu


def timed(update, seconds, warmup):
    """Samples per second of update(k), which returns the samples it trained on, after `warmup` updates."""
    for k in range(warmup):
        update(k)
    samples, updates, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        samples += update(warmup + updates)
        updates += 1
    return samples / (time.perf_counter() - start)


def timed_epochs(run, seconds, samples):
    """Samples per second of run(epochs), an epoch `samples`: one epoch first (the warm-up, which also sizes the
    run), then as many epochs as take about `seconds`."""
    start = time.perf_counter()
    run(1)
    epochs = max(1, round(seconds / (time.perf_counter() - start)))
    start = time.perf_counter()
    run(epochs)
    return epochs * samples / (time.perf_counter() - start)


def spread(values):
    """(median, lower quartile, upper quartile) of `values`; one value is all three."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    quartiles = statistics.quantiles(values, n=4)
    return statistics.median(values), quartiles[0], quartiles[2]


def where_the_time_goes(run):
    """Run `run()` under Python's profiler; return (what it returned, a dict): ``compile_s``, the seconds in
    MindSpore's graph compiler (its C++ compile calls, with the Python they call back, such as its parser);
    ``graphs``, how many graphs it compiled; ``ms_accum_s``, the seconds in ms_accum's own Python (its checks,
    records and compile-cache guard around the graphs; callees outside ms_accum not included); ``total_s``. The
    rest of ``total_s`` is MindSpore running the graphs and the Python around them. The profiler slows Python, not
    the compiler's C++: the figures are for where the time goes, not for comparison with unprofiled runs."""
    import cProfile  # pylint: disable=import-outside-toplevel
    import pstats  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    package = os.path.dirname(os.path.abspath(ms_accum.__file__)) + os.sep
    profile = cProfile.Profile()
    began = time.perf_counter()
    result = profile.runcall(run)
    found = {"total_s": time.perf_counter() - began, "compile_s": 0.0, "graphs": 0, "ms_accum_s": 0.0}
    for (filename, _, name), (_, calls, own, cumulative, _) in pstats.Stats(profile).stats.items():
        if filename == "~" and "_c_expression" in name and name.endswith(".compile>"):
            found["compile_s"] += cumulative
            found["graphs"] += calls
        elif os.path.abspath(filename).startswith(package):
            found["ms_accum_s"] += own
    return result, found


PHASE_LINE = re.compile(r"^( {0}| {4})\[([a-z_0-9]+)\]: ([0-9.e+-]+)")


def profile_compiles():
    """Turn MindSpore's compile profile on for this process: before its first graph, as MindSpore reads the switch
    once. Each graph compiled after it prints its phases on standard output (see :func:`compile_phases`)."""
    from ms_accum.compat import compile_config  # pylint: disable=import-outside-toplevel
    compile_config().COMPILE_PROFILE = "1"


def compile_phases(run):
    """Run `run()`; return (what it returned, {phase: seconds}) of the last graph it compiled, from MindSpore's
    compile profile (on since :func:`profile_compiles`; an empty dict if `run` compiled nothing or the profile is
    off): ``total`` and MindSpore's own phases, the top ones (``type_inference``, ``optimize``, ``task_emit``, ...)
    and the passes within each as ``<phase>.<pass>`` (``optimize.opt_a``). The profile is MindSpore's C++ printing
    on this process's standard output, which is taken aside while `run` runs."""
    import tempfile  # pylint: disable=import-outside-toplevel
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+") as aside:
        os.dup2(aside.fileno(), 1)
        try:
            result = run()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        aside.seek(0)
        text = aside.read()
    block = text.rsplit("TotalTime = ", 1)
    if len(block) < 2:
        return result, {}
    phases, parent = {"total": float(block[1].split(",", 1)[0].split()[0])}, None
    for line in block[1].splitlines()[1:]:
        found = PHASE_LINE.match(line)
        if found is None:
            continue
        indent, name, seconds = found.groups()
        if not indent:
            parent = name
            phases[name] = float(seconds)
        elif parent is not None:
            phases[f"{parent}.{name}"] = float(seconds)
    return result, phases
