"""MindSpore's compile cache (MS_COMPILER_CACHE_ENABLE=1): every ms_accum Cell path compiles, stores its graphs,
and on the second run loads them and trains to the same parameters as plain large-batch training.

A `raise` in a graph (the window's checks) is a PyExecute node, which the cache cannot store ("Cannot export a
PyExecute CNode in MindIR" at the first window's end); with the cache on, the checks are MindSpore's Assert
(ms_accum/core/runtime_checks.py). Each run is a fresh process (tests/cache_worker.py).
"""
import json
import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest

from mindspore import Tensor, nn

import ms_accum
from helpers import assert_equals_large_batch, build, functional_reference, micro_batches, reference_train
from ms_accum.core import compile_cache
from conftest import ROOT

WORKER = os.path.join(ROOT, "tests", "cache_worker.py")
SIZES, STEPS = (3, 5, 4, 4, 2, 6), 3


# MindSpore's warning (GLOG_v=2, its default) for each graph it takes from the cache, and for each it compiles
LOADED = "Use the compilation cache and execute the backend actions only."
COMPILED = "Execute all the compilation actions."


def run_worker(path, out, cache):
    env = dict(os.environ, MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=str(cache), GLOG_v="2")
    done = subprocess.run([sys.executable, WORKER, path, str(out)], capture_output=True, text=True, env=env,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with np.load(out) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))], done


def in_order(reference):
    """`reference` (windows -> {name: value}) keyed by position, as the worker saves the parameters."""
    return lambda windows: dict(enumerate(reference(windows).values()))


def stored_graphs(cache):
    """What MindSpore stored in the cache directory `cache`: each file of its graph_cache (the graphs' MindIR and
    the sources' hash) with its size and modification time."""
    found = {}
    for root, _, files in os.walk(cache):
        if os.path.basename(root) == "graph_cache":
            for name in files:
                stat = os.stat(os.path.join(root, name))
                found[os.path.relpath(os.path.join(root, name), cache)] = (stat.st_size, stat.st_mtime_ns)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("path", ["three-cells", "driver", "model-accu"])
def test_a_second_run_loads_the_cached_graphs_and_trains_alike(path, tmp_path):
    """The first run compiles and stores every graph; the second stores nothing (every file of the cache as the
    first left it) and MindSpore reports taking each stored graph from the cache, compiling none."""
    batches = micro_batches(SIZES, seed=5)
    windows = [batches[:STEPS], batches[STEPS:]]
    first, done = run_worker(path, tmp_path / "first.npz", tmp_path / "cache")
    assert_equals_large_batch(dict(enumerate(first)), in_order(partial(reference_train, "momentum")), windows,
                              context=f"{path}, first run (compiling and storing)")
    stored = stored_graphs(tmp_path / "cache")
    graphs = [name for name in stored if name.endswith(".mindir")]
    assert graphs, f"nothing was stored in the compile cache: {stored}"
    assert (done.stdout + done.stderr).count(COMPILED) == len(graphs), done.stderr[-3000:]
    second, done = run_worker(path, tmp_path / "second.npz", tmp_path / "cache")
    assert stored_graphs(tmp_path / "cache") == stored, "the second run wrote the cache again: it compiled anew"
    log = done.stdout + done.stderr
    assert log.count(LOADED) == len(graphs) and COMPILED not in log, \
        f"{len(graphs)} graphs stored, {log.count(LOADED)} taken from the cache:\n{done.stderr[-3000:]}"
    assert_equals_large_batch(dict(enumerate(second)), in_order(partial(reference_train, "momentum")), windows,
                              context=f"{path}, second run (from the cache)")


@pytest.mark.slow
def test_with_the_cache_a_window_without_items_still_stops_before_the_update(tmp_path):
    """The check survives as an Assert: the optimizer is not stepped."""
    for run in ("first", "second"):
        _, done = run_worker("zero-items", tmp_path / f"{run}.npz", tmp_path / "cache")
        assert "STOPPED: assert failed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
        assert "For 'Assert' condition is false." in done.stdout + done.stderr
        assert "UNCHANGED" in done.stdout, f"{run} run: the optimizer stepped on a window without items"


@pytest.mark.slow
def test_a_run_asking_other_settings_than_the_cached_graphs_is_refused_before_it_trains(tmp_path):
    """MindSpore loads stored graphs by their order whenever the script and its local modules hash as before, and a
    setting frozen into a graph is not part of that hash: the driver clipping to 0.05 after a run without clipping
    trained unclipped, in silence. It is refused, naming the setting and both values; in a directory of its own
    the clipped run compiles and trains as the clipped large batch."""
    batches = micro_batches(SIZES, seed=5)
    run_worker("driver", tmp_path / "plain.npz", tmp_path / "cache")
    env = dict(os.environ, MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, WORKER, "driver-clip", str(tmp_path / "refused.npz")],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode != 0 and not os.path.exists(tmp_path / "refused.npz"), done.stdout[-2000:]
    assert "holds graphs compiled with clip_norm=None, but this run asks for clip_norm=0.05" in done.stderr, \
        done.stderr[-3000:]
    # MindSpore takes its stored graphs by their order alone: a first micro-batch of 6 samples would run the graph
    # of 3 (a new user's trial: 16 into 8's trained on 8 of them, 8 into 16's crashed), the three cells the
    # driver's graphs
    for path, message in (("driver-sizes", "holds graphs whose ms_accum graph number 1 was compiled for "
                                           "TrainAccuStepsCell#0: phase 'train_accumulate', inputs ((3, 1, 6, 6) "
                                           "Float32, (3,) Int32), but this run's is TrainAccuStepsCell#0: phase "
                                           "'train_accumulate', inputs ((6, 1, 6, 6) Float32, (6,) Int32)"),
                          ("three-cells", "but this run's is TrainForwardBackward#0: phase 'train', inputs ((3, 1, 6, "
                                          "6) Float32, (3,) Int32): MindSpore loads its stored graphs by the order "
                                          "they compiled in alone")):
        done = subprocess.run([sys.executable, WORKER, path, str(tmp_path / "refused.npz")],
                              capture_output=True, text=True, env=env, timeout=900, check=False)
        assert done.returncode != 0 and not os.path.exists(tmp_path / "refused.npz"), done.stdout[-2000:]
        assert message in done.stderr, done.stderr[-3000:]
    clipped, _ = run_worker("driver-clip", tmp_path / "clipped.npz", tmp_path / "own-cache")
    assert_equals_large_batch(dict(enumerate(clipped)),
                              in_order(lambda windows: functional_reference("momentum", windows, clip_norm=0.05)[0]),
                              [batches[:STEPS], batches[STEPS:]], context="clipped, own cache")


class TestRecordedSettings:
    """compile_cache.check_cached_settings in one process, the cache's directory laid out as MindSpore lays it out
    (rank_0/graph_cache/compile_cache_<k>.mindir); `fresh` stands for a new process."""

    @staticmethod
    def fresh(monkeypatch, root, sources="script v1"):
        monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
        monkeypatch.setenv("MS_COMPILER_CACHE_PATH", str(root))
        monkeypatch.setattr(compile_cache, "_RECORDS", {})
        monkeypatch.setattr(compile_cache, "sources_hash", lambda: sources)

    @staticmethod
    def store_graphs(root):
        os.makedirs(root / "rank_0" / "graph_cache", exist_ok=True)
        (root / "rank_0" / "graph_cache" / "compile_cache_0.mindir").write_bytes(b"graph")

    @staticmethod
    def check(cell, clip_norm):
        return compile_cache.check_cached_settings(cell, None, {"cell": cell, "clip_norm": clip_norm})

    def test_settings_differing_from_the_stored_graphs_are_refused_cell_by_cell(self, monkeypatch, tmp_path):
        self.fresh(monkeypatch, tmp_path)
        assert self.check("TrainOptim", "None") == "TrainOptim#0" and self.check("TrainClear", "None") == "TrainClear#0"
        self.store_graphs(tmp_path)
        self.fresh(monkeypatch, tmp_path)
        # another order of first calls finds each cell's own settings (the graphs' order: check_cached_call)
        assert self.check("TrainClear", "None") == "TrainClear#0"
        with pytest.raises(ValueError, match=r"For 'TrainOptim', MindSpore's compile cache in '.*rank_0' holds "
                                             r"graphs compiled with clip_norm=None, but this run asks for "
                                             r"clip_norm=0\.5: the script and its local modules are unchanged, so "
                                             r"MindSpore would load those graphs .* Point MS_COMPILER_CACHE_PATH to "
                                             r"another directory for these settings, or delete '.*graph_cache'"):
            self.check("TrainOptim", "0.5")
        with open(tmp_path / "rank_0" / compile_cache.SETTINGS_FILE, encoding="utf-8") as handle:
            assert json.load(handle)["cells"]["TrainOptim#0"]["clip_norm"] == "None"  # the refusal wrote nothing
        assert self.check("TrainOptim", "None") == "TrainOptim#0"  # the refused call took no slot
        monkeypatch.setenv("MS_DEV_FORCE_USE_COMPILE_CACHE", "1")  # MindSpore loads whatever the sources
        self.fresh(monkeypatch, tmp_path, sources="script v2")
        with pytest.raises(ValueError, match="clip_norm=None, but this run asks for clip_norm=0.5"):
            self.check("TrainOptim", "0.5")

    def test_the_execution_mode_is_named(self, monkeypatch, tmp_path):
        """The mode is recorded as MindSpore's number and named in the refusal (it read 'mode=0')."""
        self.fresh(monkeypatch, tmp_path)
        compile_cache.check_cached_settings("TrainOptim", None, {"cell": "TrainOptim", "mode": "0"})
        self.store_graphs(tmp_path)
        self.fresh(monkeypatch, tmp_path)
        with pytest.raises(ValueError, match=r"holds graphs compiled with mode=GRAPH_MODE, but this run asks for "
                                             r"mode=PYNATIVE_MODE"):
            compile_cache.check_cached_settings("TrainOptim", None, {"cell": "TrainOptim", "mode": "1"})

    def test_records_are_read_only_where_mindspore_will_load_the_graphs(self, monkeypatch, tmp_path):
        self.fresh(monkeypatch, tmp_path)
        self.check("TrainOptim", "None")
        self.fresh(monkeypatch, tmp_path)  # the first run stopped before MindSpore stored a graph
        assert self.check("TrainOptim", "0.5") == "TrainOptim#0"
        self.store_graphs(tmp_path)
        self.fresh(monkeypatch, tmp_path, sources="script v2")  # an edited script: MindSpore compiles anew
        assert self.check("TrainOptim", "7") == "TrainOptim#0"
        self.fresh(monkeypatch, tmp_path, sources="script v2")
        with pytest.raises(ValueError, match="clip_norm=7, but this run asks for clip_norm=0.5"):
            self.check("TrainOptim", "0.5")
        monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "0")
        assert self.check("TrainOptim", "0.5") is None

    def test_graphs_are_checked_in_the_order_mindspore_loads_them(self, monkeypatch, tmp_path):
        """MindSpore takes its k-th stored graph for the k-th graph it compiles: the k-th call compiling an ms_accum
        graph must be the stored k-th (its cell, phase and inputs). A run that stopped early stored fewer, which a
        later run goes on from; the longer record is kept; a refusal records nothing; a settings file of ms_accum
        0.4.0 (no calls recorded) is not checked."""
        def call(slot, batch):
            compile_cache.check_cached_call("GradientAccumulation", slot, compile_cache.call_signature(
                "train_accumulate", (Tensor(np.zeros((batch, 4), np.float32)),)))

        self.fresh(monkeypatch, tmp_path)
        slot = self.check("TrainAccuStepsCell", "None")
        call(slot, 8)  # the first run stopped after one graph
        self.store_graphs(tmp_path)
        self.fresh(monkeypatch, tmp_path)
        slot = self.check("TrainAccuStepsCell", "None")
        call(slot, 8)
        call(slot, 4)  # a last, smaller micro-batch: a graph the first run did not reach
        settings = tmp_path / "rank_0" / compile_cache.SETTINGS_FILE
        calls = json.loads(settings.read_text())["calls"]
        assert calls == ["TrainAccuStepsCell#0: phase 'train_accumulate', inputs ((8, 4) Float32)",
                         "TrainAccuStepsCell#0: phase 'train_accumulate', inputs ((4, 4) Float32)"], calls
        self.fresh(monkeypatch, tmp_path)
        slot = self.check("TrainAccuStepsCell", "None")
        with pytest.raises(ValueError, match=r"For 'GradientAccumulation', MindSpore's compile cache in '.*rank_0' "
                                             r"holds graphs whose ms_accum graph number 1 was compiled for "
                                             r"TrainAccuStepsCell#0: phase 'train_accumulate', inputs \(\(8, 4\) "
                                             r"Float32\), but this run's is TrainAccuStepsCell#0: phase "
                                             r"'train_accumulate', inputs \(\(16, 4\) Float32\): MindSpore loads "
                                             r"its stored graphs by the order they compiled in alone.* Point "
                                             r"MS_COMPILER_CACHE_PATH to another directory for this micro-batch "
                                             r"size"):
            call(slot, 16)
        assert json.loads(settings.read_text())["calls"] == calls, "the refusal recorded its call"
        self.fresh(monkeypatch, tmp_path)
        other = self.check("TrainForwardBackward", "None")  # another path of the script: its graphs come first
        with pytest.raises(ValueError, match=r"number 1 was compiled for TrainAccuStepsCell#0: .*, but this run's "
                                             r"is TrainForwardBackward#0"):
            call(other, 8)
        saved = json.loads(settings.read_text())
        del saved["calls"]
        settings.write_text(json.dumps(saved))
        self.fresh(monkeypatch, tmp_path)
        call(self.check("TrainAccuStepsCell", "None"), 16)

    def test_a_cell_refused_at_its_first_call_is_checked_again_at_the_next(self, monkeypatch, tmp_path):
        """The check runs once per cell once it passes (the driver runs it before its first micro-batch, then
        calls the cells); a refusal must not mark the cell checked, or a retry in the same process would load the
        old graphs."""
        self.fresh(monkeypatch, tmp_path)
        _, _, opt = build("momentum")
        ms_accum.TrainOptim(opt, opt.parameters.clone(prefix="grad_sum", init="zeros"))._on_first_call()
        self.store_graphs(tmp_path)
        self.fresh(monkeypatch, tmp_path)
        _, _, opt = build("momentum")
        clipped = ms_accum.TrainOptim(opt, opt.parameters.clone(prefix="grad_sum", init="zeros"), clip_norm=0.5)
        for _ in range(2):
            with pytest.raises(ValueError, match="clip_norm=None, but this run asks for clip_norm=0.5"):
                clipped._on_first_call()  # pylint: disable=protected-access

    def test_the_sources_hash_follows_the_files_mindspore_hashes(self, monkeypatch, tmp_path):
        script = tmp_path / "train.py"
        script.write_text("x = 1\n")
        monkeypatch.setattr(compile_cache, "compile_cache_dep_files", lambda: [str(script)])
        first = compile_cache.sources_hash()
        assert compile_cache.sources_hash() == first
        moved = tmp_path / "moved" / "train.py"
        moved.parent.mkdir()
        moved.write_text("x = 1\n")
        monkeypatch.setattr(compile_cache, "compile_cache_dep_files", lambda: [str(moved)])
        assert compile_cache.sources_hash() == first  # the same contents elsewhere: compared, the safe side
        moved.write_text("x = 2\n")
        assert compile_cache.sources_hash() != first


def test_the_recorded_settings_read_as_the_user_passed_them():
    """A new user's refusal read 'steps=((0,), (2,))' and 'noise_scale=None ... every' for N=2 and True."""
    net, loss, opt = build("momentum")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=4,
                                       noise_scale=True)
    settings = cell._compile_settings()  # pylint: disable=protected-access
    assert settings["gradient_accumulation_steps"] == "4" and settings["noise_scale"] == "True"
    cell.gradient_accumulation_steps = {0: 2, 3: 4}
    assert cell._compile_settings()["gradient_accumulation_steps"] == "AccumulationSchedule({0: 2, 3: 4})"
    recorded = set()
    for initial in (2, 4):  # a policy's first N is a Parameter's value, not frozen: the same record
        cell.gradient_accumulation_steps = ms_accum.AdaptiveAccumulation(2, 8, initial_steps=initial)
        recorded.add(cell._compile_settings()["gradient_accumulation_steps"])
    assert recorded == {"AdaptiveAccumulation(min_steps=2, max_steps=8, interval=10, max_factor=2.0)"}
