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
compiled or loaded, naming the setting, both values and the remedy. Since MindSpore takes its k-th stored graph for
the k-th graph it compiles, whatever that is, the cells also record their calls that compile a graph (the cell,
its phase, its inputs' shapes and types) in that order, and a call other than the one stored at its rank (another
micro-batch size, another path of the script) is refused before it runs. What a cell does not record (the user's
network's own constants, the optimizer's, a cell compiled only inside another graph of the user's) is the user's
to watch.
"""
import hashlib
import json
import os

import mindspore
from mindspore import Tensor, context
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
        self.stored, self.stored_calls = {}, []
        if _graphs_stored(directory) and os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as handle:
                saved = json.load(handle)
            # MS_DEV_FORCE_USE_COMPILE_CACHE: MindSpore loads the graphs without checking the sources
            if saved.get("sources") == sources or os.environ.get("MS_DEV_FORCE_USE_COMPILE_CACHE"):
                self.stored = saved["cells"]
                self.stored_calls = saved.get("calls", [])  # none in files of ms_accum 0.4.0: not checked
        self.this_run, self.this_calls = {}, []

    def new_slot(self, cell):
        """'<cell>#<k>': the k-th cell of its class checked in this process."""
        return f"{cell}#{sum(slot.rsplit('#', 1)[0] == cell for slot in self.this_run)}"

    def write(self):
        os.makedirs(self.directory, exist_ok=True)
        partial = self.path + ".partial"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump({"sources": self.sources, "cells": {**self.stored, **self.this_run},
                       # the graphs in the order they compiled: the run's that compiled the most of them
                       "calls": max(self.stored_calls, self.this_calls, key=len)}, handle, indent=1)
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
        differ = sorted((key for key in set(stored) | set(entry) if stored.get(key) != entry.get(key)),
                        key=lambda key: (key == "buffers_named", key))  # the owner's path first, its names after
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


def call_signature(phase, args):
    """What a cell's call compiles a graph for, as a str: its phase and the shapes and types of its arguments."""
    return f"phase {phase!r}, inputs (" + ", ".join(
        f"{tuple(arg.shape)} {arg.dtype}" if isinstance(arg, Tensor) else type(arg).__name__ for arg in args) + ")"


def check_cached_call(owner, slot, signature):
    """With the compile cache on, the cell of `slot` (from :func:`check_cached_settings`) called for the first time
    in this process as `signature` (:func:`call_signature`), which compiles a graph: compared with what the stored
    graph of the same rank among ms_accum's was compiled for, and recorded. MindSpore keys its stored graphs by the
    order they compiled in alone, so it would load another cell's graph, or one compiled for another micro-batch
    size (on MindSpore 2.10 a graph of 8 samples called with 16 read 8 of them; one of 16 called with 8 read beyond
    them; a cell called before another ran the other's graph). Raises ValueError then, before the graph is loaded."""
    record = _RECORDS.get(_rank_directory(_cache_root()[0]))
    if slot is None or record is None:
        return
    rank, call = len(record.this_calls), f"{slot}: {signature}"
    if rank < len(record.stored_calls) and record.stored_calls[rank] != call:
        named_by = _cache_root()[1]
        raise ValueError(
            f"For '{owner}', MindSpore's compile cache in {record.directory!r} holds graphs whose ms_accum graph "
            f"number {rank + 1} was compiled for {record.stored_calls[rank]}, but this run's is {call}: MindSpore "
            f"loads its stored graphs by the order they compiled in alone, so it would run that graph here (on "
            f"inputs of another shape it reads part of a larger micro-batch, or memory beyond a smaller one). Point "
            f"{named_by} to another directory for this micro-batch size, data set (whose last micro-batch may be "
            f"smaller) or path of the script, or delete {os.path.join(record.directory, 'graph_cache')!r} to "
            f"compile anew.")
    record.this_calls.append(call)
    record.write()
