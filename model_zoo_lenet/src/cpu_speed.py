"""CPU speed defaults for MindSpore 2.10, chosen by measurement (benchmarks/cpu_settings.py).

On this project's 2-core AVX-512 Xeon the oneDNN bundled with MindSpore falls back to a reference convolution
kernel; capping its instruction set at AVX2 makes LeNet training about 9 times faster, so it is the default
unless ONEDNN_MAX_CPU_ISA is already in the environment. Setting MindSpore's CPU kernel thread count (to 1, or to
the cores available) made no difference beyond the machine's run-to-run noise, so MindSpore's own thread count
stays the default and --cpu_threads N sets another. In PYNATIVE_MODE on CPU, synchronous kernel launches
(`mindspore.runtime.launch_blocking()`) train LeNet 1.6 times faster (benchmarks/cpu_settings.py); GRAPH_MODE is
the same either way.

MS_ACCUM_CPU_DEFAULTS=mindspore in the environment turns both settings off (MindSpore's own defaults), to measure
what they bring. `apply_env_defaults` must run before MindSpore is imported; it imports nothing heavy.
"""
import os

DEFAULT_ONEDNN_ISA = "AVX2"


def tuned():
    """False when MS_ACCUM_CPU_DEFAULTS=mindspore asks for MindSpore's own CPU defaults."""
    return os.environ.get("MS_ACCUM_CPU_DEFAULTS", "").lower() != "mindspore"


def apply_env_defaults():
    """Set ONEDNN_MAX_CPU_ISA=AVX2 unless the user set it (or asked for MindSpore's defaults); return the value in
    force, None for oneDNN's own choice."""
    if not tuned():
        return os.environ.get("ONEDNN_MAX_CPU_ISA")
    return os.environ.setdefault("ONEDNN_MAX_CPU_ISA", DEFAULT_ONEDNN_ISA)


def set_mode(mode, device_target="CPU"):
    """Set MindSpore's execution mode, 'graph' or 'pynative'; PYNATIVE on CPU also launches kernels synchronously
    (once set, for the rest of the process)."""
    import mindspore as ms
    if mode not in ("graph", "pynative"):
        raise ValueError(f"'mode' must be 'graph' or 'pynative', but got {mode!r}.")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    if mode == "pynative" and device_target == "CPU" and tuned():
        ms.runtime.launch_blocking()


def available_cores():
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def set_cpu_threads(threads=None):
    """Set MindSpore's CPU kernel thread count (once per process); None keeps MindSpore's default.

    Returns a description of the setting in force.
    """
    if threads is None:
        return "MindSpore's default"
    import mindspore as ms
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"'--cpu_threads' must be an int >= 1, but got {threads!r}.")
    ms.device_context.cpu.op_tuning.threads_num(threads)
    return str(threads)
