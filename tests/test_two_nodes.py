"""Two nodes, one worker each: msrun across two network namespaces (see two_hosts.py), as on two machines.

Needs root and iproute2; skips with the reason elsewhere. Each namespace holds only its loopback and its end of a
veth pair, so the job's traffic stays between the two namespaces this module creates.
"""
import glob
import os
import signal
import subprocess
import time
from functools import partial

import numpy as np
import pytest

import mindspore as ms

from conftest import ROOT, ZOO
from dp_worker import load, scenario, union_windows
from helpers import (KILL_NODE_TIMEOUT, SAMPLE, assert_equals_large_batch, msrun_argv, msrun_env, reference_train,
                     train_py_worker)
from src.lenet import LeNet5
from two_hosts import MASTER_PORT, TwoHosts, stop, unavailable_reason

_REASON = unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]
HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_ARGS = ("--parallel_mode", "data_parallel", "--data_path", SAMPLE, "--num_samples", 640, "--batch_size", 16,
              "--accumulation_steps", 4, "--epoch_size", 4, "--log_every", 0, "--save_state_every", 1)
FINAL = "checkpoint_lenet-4_10.ckpt"  # 640 samples per rank / 16 = 40 micro-batches = 10 windows per epoch


@pytest.fixture(scope="module")
def hosts():
    with TwoHosts() as made:
        yield made


def start_job(hosts, log_dir, script, *args, node_timeout=None):
    """Both nodes' launchers (node 1 first); node 0 runs the scheduler at its own address (`node_timeout`: see
    helpers.msrun_env)."""
    return [hosts.launch(node, msrun_argv(node, hosts.addresses[0], MASTER_PORT, script, *args,
                                          log_dir=log_dir / f"node{node}"),
                         env=msrun_env(node_timeout), cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
            for node in (1, 0)][::-1]


def finish(launchers, log_dir, timeout=300):
    """Wait for both launchers; their exit codes, and the workers' logs (tails) for messages."""
    deadline = time.time() + timeout
    codes = []
    try:
        for launcher in launchers:
            launcher.communicate(timeout=max(1.0, deadline - time.time()))
            codes.append(launcher.returncode)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the two-node job did not end in {timeout} s; logs in {log_dir}")
    finally:
        for launcher in launchers:
            stop(launcher)
    logs = "".join(f"--- {p}\n" + open(p, encoding="utf-8", errors="replace").read()[-3000:]
                   for p in sorted(glob.glob(str(log_dir / "node*" / "*.log"))))
    return codes, logs


def run_job(hosts, log_dir, script, *args):
    codes, logs = finish(start_job(hosts, log_dir, script, *args), log_dir)
    assert codes == [0, 0], f"launchers exited {codes}\n{logs}"
    return logs


def params(arrays):
    return {k[len("param:"):]: v for k, v in arrays.items() if k.startswith("param:")}


def test_the_namespaces_and_links_are_removed_also_after_a_failure():
    made = TwoHosts(tag="x")
    with pytest.raises(RuntimeError, match="inside"):
        with made:
            assert made.leftovers() == list(made.namespaces), "the two namespaces were not created"
            raise RuntimeError("a failure inside the block")
    assert made.leftovers() == []


MODEL_ACCU = scenario("graph", "model_accu", 3, 3)
OVERFLOW = scenario("graph", "dynamic", 2, 3, 1, 0, 1)  # an inf on rank 1 (node 1), window 0, micro-step 1


@pytest.fixture(scope="module")
def worker_runs(hosts, tmp_path_factory):
    """dp_worker.py's scenarios the tests below read, in one job on the two nodes; its output directory and the
    workers' logs."""
    out = tmp_path_factory.mktemp("two_node_scenarios")
    logs = run_job(hosts, out / "logs", os.path.join(HERE, "dp_worker.py"), out, MODEL_ACCU, OVERFLOW)
    return out, logs


def test_two_nodes_through_model_accu_equal_one_process_on_their_union(worker_runs):
    windows, steps = 3, 3
    out, logs = worker_runs
    assert "rank 0/2 done" in logs and "rank 1/2 done" in logs, logs
    ranks = load(out, MODEL_ACCU)
    for name, value in params(ranks[0]).items():
        np.testing.assert_array_equal(params(ranks[1])[name], value, err_msg=f"{name} differs between the nodes")
    assert_equals_large_batch(params(ranks[0]), partial(reference_train, "momentum"), union_windows(windows, steps),
                              context="two nodes through Model_ACCU against one process on their union")
    assert all(r["global_step"][0] == windows and bool(r["accu_grads_zero"]) for r in ranks)


def test_an_overflow_on_node_1_skips_the_window_on_both_nodes(worker_runs):
    windows, steps = 2, 3
    ranks = load(worker_runs[0], OVERFLOW)
    for rank, arrays in enumerate(ranks):
        _, overflow, scale = arrays["outputs"][0]
        assert overflow == 1.0 and scale == 512.0, f"node {rank} window 0: overflow {overflow}, scale {scale}"
        assert arrays["global_step"][0] == 1, f"node {rank} did not skip the overflowing window"
    for name, value in params(ranks[0]).items():
        np.testing.assert_array_equal(params(ranks[1])[name], value, err_msg=f"{name} differs between the nodes")
    assert_equals_large_batch(params(ranks[0]), partial(reference_train, "momentum"),
                              union_windows(windows, steps)[1:], context="two nodes after the skipped window")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """scripts/two_node_demo.sh with the kill test's arguments: the uninterrupted run, made as a user would."""
    out = tmp_path_factory.mktemp("two_node_demo")
    result = subprocess.run(["bash", os.path.join(ROOT, "scripts", "two_node_demo.sh"), str(out),
                             *map(str, TRAIN_ARGS[2:])], capture_output=True, text=True, timeout=600, check=False)
    return out, result


def test_the_demo_script_prints_its_commands_and_ends_with_identical_nodes(demo_run):
    out, result = demo_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    printed = result.stdout
    for expected in ("+ ip netns add", "+ ip link add", "--node_rank=0", "--node_rank=1",
                     "--master_addr=10.231.0.1", "hold identical parameters"):
        assert expected in printed, f"'{expected}' missing from the demo's output:\n{printed}"
    assert (out / "ckpt" / "rank_1" / FINAL).exists()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert "msdemo" not in listed, f"the demo left namespaces behind: {listed}"


def test_a_killed_worker_on_node_1_ends_both_launchers_and_both_resume_exactly(hosts, demo_run, tmp_path):
    full, _ = demo_run
    cut = tmp_path / "cut"
    train_py = os.path.join(ZOO, "train.py")
    launchers = start_job(hosts, tmp_path / "cut_logs", train_py, "--ckpt_path", cut, *TRAIN_ARGS,
                          node_timeout=KILL_NODE_TIMEOUT)
    deadline = time.time() + 300
    while not (cut / "rank_1" / "train_state.prev.ckpt").exists() and time.time() < deadline \
            and all(launcher.poll() is None for launcher in launchers):
        time.sleep(0.05)
    worker = train_py_worker(launchers[1])
    assert worker is not None and all(launcher.poll() is None for launcher in launchers), \
        "the job ended before node 1's worker could be killed"
    worker.send_signal(signal.SIGKILL)
    codes, logs = finish(launchers, tmp_path / "cut_logs", timeout=180)
    assert codes[0] != 0 and codes[1] != 0, f"a launcher reported success after node 1's worker was killed: {codes}"
    assert "the msrun scheduler ended the '--parallel_mode' data_parallel job: a node was lost" in logs \
        and "The node: 1 is timed out" in logs, f"node 0's logs do not say that node 1 was lost:\n{logs}"
    assert not (cut / "rank_0" / FINAL).exists(), "the kill came after the end of training"

    run_job(hosts, tmp_path / "resume_logs", train_py, "--ckpt_path", cut, "--resume", cut, *TRAIN_ARGS)
    for rank in range(2):
        want = ms.load_checkpoint(str(full / "ckpt" / f"rank_{rank}" / FINAL))
        got = ms.load_checkpoint(str(cut / f"rank_{rank}" / FINAL))
        for param in LeNet5().get_parameters():
            np.testing.assert_allclose(got[param.name].asnumpy(), want[param.name].asnumpy(), rtol=1e-6,
                                       atol=1e-7, err_msg=f"rank {rank}: {param.name}")
