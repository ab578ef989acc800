"""MindSpore's compile cache, and the settings its stored graphs were compiled with.

With ``MS_COMPILER_CACHE_ENABLE=1`` MindSpore stores each graph it compiles under ``MS_COMPILER_CACHE_PATH``
(``rank_<r>/graph_cache/compile_cache_<k>.mindir``, by the order of compilation) and, in a later process whose
entry script and local modules hash as before, loads them in that order without compiling. The hash covers
source files only: a Python value frozen into a graph when it compiled (``clip_norm``, ``average``, N, ...) is not
part of it. A second run that changed ``clip_norm`` from None to 0.05, the script unchanged, trained without
clipping and said nothing (MindSpore 2.10.0; a plain Cell with a Python constant does the same).

So every ms_accum cell compiled with the cache on records its settings beside MindSpore's graphs
(``rank_<r>/ms_accum_settings.json``, one entry per cell in the order they are first called, or built for
:class:`Accumulator`, which the user's jit step calls) and, when MindSpore's stored graphs are there, compares
them with the settings this run asks for: a difference is refused before anything is compiled or loaded, naming
the setting, both values and the remedy.
"""
import json
import os

from mindspore import context
from mindspore.communication.management import GlobalComm

SETTINGS_FILE = "ms_accum_settings.json"


def compile_cache_on():
    """Whether MindSpore's compile cache is on for graphs compiled from now (``MS_COMPILER_CACHE_ENABLE=1``, or
    ``enable_compile_cache`` in the context, as MindSpore reads them)."""
    enabled = context.get_context("enable_compile_cache")
    if enabled is None:
        enabled = os.environ.get("MS_COMPILER_CACHE_ENABLE", "").strip()
    return enabled is True or enabled == "1"


def cache_directory():
    """This process's directory in the compile cache: ``<MS_COMPILER_CACHE_PATH or '.'>/rank_<rank>``."""
    root = context.get_context("compile_cache_path") or os.environ.get("MS_COMPILER_CACHE_PATH") or "."
    rank = 0
    if GlobalComm.INITED:
        from mindspore.communication import get_rank  # pylint: disable=import-outside-toplevel
        rank = get_rank()
    return os.path.join(root, f"rank_{rank}")


def _graphs_stored(directory):
    graphs = os.path.join(directory, "graph_cache")
    return os.path.isdir(graphs) and any(name.endswith(".mindir") for name in os.listdir(graphs))


class _Record:
    """This process's view of the settings file: the entries read when the process first looked (the stored
    graphs' settings, or none) and the entries of this run, slot by slot."""

    def __init__(self, directory):
        self.directory = directory
        self.path = os.path.join(directory, SETTINGS_FILE)
        self.stored = []
        if _graphs_stored(directory) and os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as handle:
                self.stored = json.load(handle)["cells"]
        self.this_run = []

    def write(self):
        os.makedirs(self.directory, exist_ok=True)
        partial = self.path + ".partial"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump({"cells": self.this_run + self.stored[len(self.this_run):]}, handle, indent=1)
        os.replace(partial, self.path)


_RECORDS = {}


def check_cached_settings(owner, slot, settings):
    """With the compile cache on, compare `settings` (a dict of str to str: what a cell's graphs freeze when
    compiled, its class among them) with those the stored graphs of the same slot (the cell's order among the cells
    checked in this process) were compiled with, and record them; `owner` names the cell in messages. Returns the
    slot (a new one when `slot` is None), or None when the cache is off. Raises ValueError where MindSpore would
    load graphs compiled otherwise."""
    if not compile_cache_on():
        return None
    directory = cache_directory()
    record = _RECORDS.get(directory)
    if record is None:
        record = _RECORDS[directory] = _Record(directory)
    entry = dict(settings)
    if slot is None:
        slot = len(record.this_run)
        record.this_run.append(entry)
    else:
        record.this_run[slot] = entry
    if slot < len(record.stored):
        stored = record.stored[slot]
        differ = [key for key in sorted(set(stored) | set(entry)) if stored.get(key) != entry.get(key)]
        if differ:
            key = differ[0]
            raise ValueError(
                f"For '{owner}', MindSpore's compile cache in {directory!r} holds graphs compiled with "
                f"{key}={stored.get(key, '(none)')}, but this run asks for {key}={entry.get(key, '(none)')}: "
                f"MindSpore loads stored graphs whenever the script and its local modules are unchanged, and the "
                f"run would train with the old setting. Set MS_COMPILER_CACHE_PATH to another directory for these "
                f"settings, or delete {os.path.dirname(directory) or '.'!r} to compile anew."
                + (f" (Also differing: {', '.join(differ[1:])}.)" if len(differ) > 1 else ""))
    record.write()
    return slot
