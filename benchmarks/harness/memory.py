"""Memory as the benchmarks read it: this process's resident memory and its peak (VmHWM), in MiB, and the unit of
the memory tables, one float32 copy of a network's trainable parameters."""
import os

import numpy as np


def rss_mib():
    """This process's resident memory now, MiB."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def peak_mib():
    """This process's peak resident memory (VmHWM), MiB; not ru_maxrss, which carries the peak of the process that
    started this one."""
    from ms_accum.trainers.memory_probe import resident_peak  # pylint: disable=import-outside-toplevel
    return resident_peak() / 2 ** 20


def copy_mib_of(net):
    """MiB of one float32 copy of `net`'s trainable parameters: the unit of the memory figures."""
    return sum(int(np.prod(p.shape)) for p in net.trainable_params()) * 4 / 2 ** 20
