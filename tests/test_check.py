"""ms_accum.check: the equivalence check users run on their own model, as a function and as a command."""
import os
import subprocess
import sys

import numpy as np
import pytest

from mindspore import nn

import ms_accum
from conftest import ROOT
from helpers import BatchNormNet, SmallConvNet


def batch(size=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(size, 1, 6, 6)).astype(np.float32), rng.integers(0, 4, size=size).astype(np.int32)


LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


@pytest.mark.parametrize("cell", ["three_cells", "accu_steps"])
def test_equivalent_model_passes(cell, exec_mode):
    report = ms_accum.check_equivalence(SmallConvNet, LOSS, lambda p: nn.Momentum(p, 0.1, 0.9), batch(), 3,
                                        cell=cell)
    assert report.passed, str(report)
    assert {name for name, _, _ in report.rows} == {"conv.weight", "conv.bias", "fc.weight", "fc.bias"}
    assert "PASS: largest relative difference" in str(report)


def test_batchnorm_model_fails_and_names_the_parameters():
    report = ms_accum.check_equivalence(BatchNormNet, LOSS, lambda p: nn.SGD(p, 0.5), batch(), 4)
    assert not report.passed
    worst = max(report.rows, key=lambda row: row[2])
    assert worst[2] > 1e-3 and worst[0].startswith(("fc.", "bn.", "head."))
    assert str(report).splitlines()[-1].startswith("FAIL: largest relative difference")


def test_accumulation_steps_larger_than_the_batch():
    with pytest.raises(ValueError, match="'accumulation_steps' must be <= the batch size 12, but got 13"):
        ms_accum.check_equivalence(SmallConvNet, LOSS, lambda p: nn.SGD(p, 0.1), batch(), 13)


def run_check(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]))
    return subprocess.run([sys.executable, "-m", "ms_accum.check", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


@pytest.mark.slow
def test_command_passes_and_fails_with_exit_codes():
    ok = run_check("--network", "helpers:SmallConvNet", "--input-shape", "1,6,6", "--num-classes", "4",
                   "--batch-size", "16", "--accumulation-steps", "4", "--mode", "graph")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "one window of 4 micro-batches vs one batch of 16" in ok.stdout and "\nPASS:" in ok.stdout
    differs = run_check("--network", "helpers:BatchNormNet", "--input-shape", "1,6,6", "--num-classes", "4",
                        "--batch-size", "16", "--accumulation-steps", "4", "--optimizer", "sgd", "--lr", "0.5")
    assert differs.returncode == 1 and "\nFAIL:" in differs.stdout, differs.stdout + differs.stderr
    bad = run_check("--network", "helpers:NoSuchNet", "--input-shape", "1,6,6", "--num-classes", "4")
    assert bad.returncode == 2 and "'--network' 'helpers:NoSuchNet' could not be loaded" in bad.stderr
