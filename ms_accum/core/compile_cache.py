"""MindSpore's compile cache, and the settings its stored graphs were compiled with.

With ``MS_COMPILER_CACHE_ENABLE=1`` MindSpore stores each graph it compiles under ``MS_COMPILER_CACHE_PATH``
(``rank_<r>/graph_cache/compile_cache_<k>.mindir``, by the order of compilation) and, in a later process whose
entry script and local modules hash as before, loads them in that order without compiling. The hash covers
source files only: a Python value frozen into a graph when it compiled (``clip_norm``, ``average``, N, ...) is not
part of it. A second run that changed ``clip_norm`` from None to 0.05, the script unchanged, trained without
clipping and said nothing (MindSpore 2.10.0; a plain Cell with a Python constant does the same).

So every ms_accum cell compiled with the cache on records its settings beside MindSpore's graphs
(``rank_<r>/ms_accum_settings.json``, one entry per cell, named by its class and its rank among the cells of its
class in the order they are checked: at a cell's first call (which a trainer makes before its first
micro-batch), and when :class:`Accumulator` is built, since the user's jit step calls it) with a hash of the
files MindSpore's own hash covers. When MindSpore's stored graphs are there and those files hash as when they
were stored (so MindSpore will load them), a cell asking for other settings is refused before its graph is
compiled or loaded, naming the setting, both values and the remedy. What a cell does not record (the user's
network's own constants, the optimizer's, a cell compiled only inside another graph of the user's) is the user's
to watch.
"""
import hashlib
import json
import os

import mindspore
from mindspore import context
from mindspore.communication.management import GlobalComm

from ..compat import compile_cache_dep_files

SETTINGS_FILE = "ms_accum_settings.json"


def compile_cache_on():
    """Whether MindSpore's compile cache is on for graphs compiled from now (``MS_COMPILER_CACHE_ENABLE=1``, or
    ``enable_compile_cache`` in the context, as MindSpore reads them)."""
    enabled = context.get_context("enable_compile_cache")
    if enabled is None:
        enabled = os.environ.get("MS_COMPILER_CACHE_ENABLE", "").strip()
    return enabled is True or enabled == "1"


def _cache_root():
    """(the cache's root directory, the setting that named it), as MindSpore reads them."""
    if context.get_context("compile_cache_path"):
        return context.get_context("compile_cache_path"), "compile_cache_path in mindspore.set_context"
    if os.environ.get("MS_COMPILER_CACHE_PATH"):
        return os.environ["MS_COMPILER_CACHE_PATH"], "MS_COMPILER_CACHE_PATH"
    return ".", "MS_COMPILER_CACHE_PATH (unset: the working directory)"


def _rank_directory(root):
    rank = 0
    if GlobalComm.INITED:
        from mindspore.communication import get_rank  # pylint: disable=import-outside-toplevel
        rank = get_rank()
    return os.path.join(root, f"rank_{rank}")


def sources_hash():
    """A hash of what decides whether MindSpore reloads stored graphs: the MindSpore release and the contents of the
    files its compile cache hashes (the entry script and the local modules it imports), in any order and wherever
    they lie (a project moved keeps its hash: refusing where MindSpore might compile anew is the safe side)."""
    contents = []
    for path in compile_cache_dep_files():
        with open(path, "rb") as handle:
            contents.append(hashlib.sha256(handle.read()).hexdigest())
    return hashlib.sha256(" ".join([mindspore.__version__] + sorted(contents)).encode()).hexdigest()


def _graphs_stored(directory):
    graphs = os.path.join(directory, "graph_cache")
    return os.path.isdir(graphs) and any(name.endswith(".mindir") for name in os.listdir(graphs))


class _Record:
    """This process's view of the settings file: the entries of the stored graphs MindSpore will load (none if it
    will compile anew: no graphs stored, or the sources changed since), and this run's, by slot."""

    def __init__(self, directory, sources):
        self.directory, self.sources = directory, sources
        self.path = os.path.join(directory, SETTINGS_FILE)
        self.stored = {}
        if _graphs_stored(directory) and os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as handle:
                saved = json.load(handle)
            # MS_DEV_FORCE_USE_COMPILE_CACHE: MindSpore loads the graphs without checking the sources
            if saved.get("sources") == sources or os.environ.get("MS_DEV_FORCE_USE_COMPILE_CACHE"):
                self.stored = saved["cells"]
        self.this_run = {}

    def new_slot(self, cell):
        """'<cell>#<k>': the k-th cell of its class checked in this process."""
        return f"{cell}#{sum(slot.rsplit('#', 1)[0] == cell for slot in self.this_run)}"

    def write(self):
        os.makedirs(self.directory, exist_ok=True)
        partial = self.path + ".partial"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump({"sources": self.sources, "cells": {**self.stored, **self.this_run}}, handle, indent=1)
        os.replace(partial, self.path)


_RECORDS = {}


_MODES = {str(context.GRAPH_MODE): "GRAPH_MODE", str(context.PYNATIVE_MODE): "PYNATIVE_MODE"}  # as recorded


def _shown(key, settings):
    """``key=value`` of `settings` for a message; the execution mode by its name."""
    value = settings.get(key, "(none)")
    return f"{key}={_MODES.get(value, value) if key == 'mode' else value}"


def check_cached_settings(owner, slot, settings):
    """With the compile cache on, compare `settings` (a dict of str to str: what a cell's graphs freeze when
    compiled, its class as ``cell``) with those the stored graphs of the same slot (the cell's class and its rank
    among the cells of that class checked in this process) were compiled with, and record them; `owner` names the
    cell in messages. Returns the slot (a new one when `slot` is None), or None when the cache is off. Raises
    ValueError where MindSpore would load graphs compiled otherwise; a refused cell takes no slot."""
    if not compile_cache_on():
        return None
    root, named_by = _cache_root()
    directory = _rank_directory(root)
    record = _RECORDS.get(directory)
    if record is None:
        record = _RECORDS[directory] = _Record(directory, sources_hash())
    new_slot = record.new_slot(settings["cell"]) if slot is None else slot
    if new_slot in record.stored:
        stored, entry = record.stored[new_slot], settings
        differ = [key for key in sorted(set(stored) | set(entry)) if stored.get(key) != entry.get(key)]
        if differ:
            key = differ[0]
            raise ValueError(
                f"For '{owner}', MindSpore's compile cache in {directory!r} holds graphs compiled with "
                f"{_shown(key, stored)}, but this run asks for {_shown(key, entry)}: the "
                f"script and its local modules are unchanged, so MindSpore would load those graphs and train with the "
                f"old setting. Point {named_by} to another directory for these settings, or delete "
                f"{os.path.join(directory, 'graph_cache')!r} to compile anew."
                + (f" (Also differing: {', '.join(differ[1:])}.)" if len(differ) > 1 else ""))
    record.this_run[new_slot] = dict(settings)
    record.write()
    return new_slot
