"""CPU speed defaults for MindSpore 2.10, chosen by measurement (benchmarks/cpu_settings.py).

On this project's 2-core AVX-512 Xeon the oneDNN bundled with MindSpore falls back to a reference convolution
kernel; capping its instruction set at AVX2 makes LeNet training about 10 times faster, and setting the kernel
thread count to the cores available adds about 20%. Both keep the user's choice when one is made:
ONEDNN_MAX_CPU_ISA in the environment wins, and an explicit thread count replaces the default.

`apply_env_defaults` must run before MindSpore is imported; it imports nothing heavy.
"""
import os

DEFAULT_ONEDNN_ISA = "AVX2"


def apply_env_defaults():
    """Set ONEDNN_MAX_CPU_ISA=AVX2 unless the user set it; return the value in force."""
    return os.environ.setdefault("ONEDNN_MAX_CPU_ISA", DEFAULT_ONEDNN_ISA)


def available_cores():
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def set_cpu_threads(threads=None):
    """Set MindSpore's CPU kernel thread count (once per process); None means the cores available."""
    import mindspore as ms
    threads = available_cores() if threads is None else threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"'--cpu_threads' must be an int >= 1, but got {threads!r}.")
    ms.device_context.cpu.op_tuning.threads_num(threads)
    return threads
