"""DATA_PARALLEL across two real processes on CPU (msrun, 127.0.0.1 only, bounded time)."""
import glob
import os
import re
import signal
import subprocess
import time
from functools import partial

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn

import ms_accum
from conftest import DOC_FENCE, ROOT, ZOO
from dp_worker import CLIP_NORM, load, rank_batches, rank_token_batches, scenario, union_windows
from helpers import (ACCURACY, KILL_NODE_TIMEOUT, SAMPLE, assert_equals_large_batch, assert_noise_records_match,
                     assert_params_equal, functional_reference, large_batch, launch_local, noise_reference, params_of,
                     reference_train, run_local, run_script, token_reference, train_py_worker)
from src.dataset import create_dataset
from src.lenet import LeNet5

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2


PLAIN = scenario("graph", "plain", 3, 3)  # first: its graphs are the ones saved
OVERFLOW = {mode: scenario(mode, "dynamic", 2, 3, 1, 0, 1) for mode in ("graph", "pynative")}  # rank 1, window 0,
TOKENS = scenario("graph", "tokens", 2, 3)                                                        # micro-step 1
NOISE = scenario("graph", "noise", 3, 1)
MEAN_FALSE = scenario("graph", "mean_false", 2, 2)
UNEVEN_FLUSH = scenario("graph", "uneven_flush", 2, 2)
UNEVEN_EPOCHS = scenario("graph", "uneven_epochs", 2, 2)
UNEVEN_STEPS = scenario("graph", "uneven_steps", 2, 2)  # rank 0 N 2, rank 1 N 4
CLIP = scenario("graph", "clip", 2, 3)
PLAN = scenario("graph", "plan", 0, 0)
RULES = {rule: scenario("graph", f"rule_{rule}", 0, 0) for rule in ("linear", "sqrt", "adascale")}
DRIVER = scenario("graph", "driver", 3, 3)
DRIVER_UNEVEN_STEPS = scenario("graph", "driver_uneven_steps", 2, 2)  # rank 0 N 2, rank 1 N 4
SCENARIOS = (PLAIN, OVERFLOW["graph"], TOKENS, NOISE, MEAN_FALSE, UNEVEN_FLUSH, UNEVEN_EPOCHS, UNEVEN_STEPS, CLIP, PLAN,
             *RULES.values(), DRIVER, DRIVER_UNEVEN_STEPS, OVERFLOW["pynative"])


def params(rank_arrays):
    return {k[len("param:"):]: v for k, v in rank_arrays.items() if k.startswith("param:")}


@pytest.fixture(scope="module")
def worker_runs(tmp_path_factory):
    """Every scenario of dp_worker.py these tests read, one after another in one msrun job of two workers (a
    launch costs both workers MindSpore's start and the communication's set-up); the output directory."""
    out = tmp_path_factory.mktemp("dp_scenarios")
    run_local(out, os.path.join(HERE, "dp_worker.py"), out, *SCENARIOS, timeout=900)
    return out


@pytest.fixture(scope="module")
def plain_graph_run(worker_runs):
    """3 windows of 3 micro-steps per rank, GRAPH_MODE, TrainAccuStepsCell; graphs saved."""
    return worker_runs, load(worker_runs, PLAIN)


def assert_ranks_trained_their_union(ranks, windows, steps, context):
    """Both ranks' parameters alike and the large batch's `windows` steps on the union of their micro-batches,
    every window applied and the buffers left empty."""
    for name, value in params(ranks[0]).items():
        np.testing.assert_array_equal(params(ranks[1])[name], value, err_msg=f"{name} differs between ranks")
    assert_equals_large_batch(params(ranks[0]), partial(reference_train, "momentum"), union_windows(windows, steps),
                              context=context)
    assert all(r["global_step"][0] == windows and bool(r["accu_grads_zero"]) for r in ranks)


def test_two_ranks_equal_single_process_training_on_their_union(plain_graph_run):
    assert_ranks_trained_their_union(plain_graph_run[1], 3, 3, "two ranks against one process on their union")


def test_the_driver_on_two_ranks_equals_one_process_on_their_union(worker_runs):
    """GradientAccumulation.train_process under msrun: each rank's dataset of its own micro-batches, the windows'
    gradients reduced across the ranks, the large batch's steps on their union (a new user's trial found it so,
    where the docs said one device)."""
    assert_ranks_trained_their_union(load(worker_runs, DRIVER), 3, 3,
                                     "the driver on two ranks against one process on their union")


def test_the_driver_refuses_devices_given_another_n_before_training(worker_runs):
    ranks = load(worker_runs, DRIVER_UNEVEN_STEPS)
    for rank in ranks:
        assert "For 'GradientAccumulation.train_process', 'gradient_accumulation_steps' must be the same on every " \
               "device, but they take 2, 4 (by rank" in str(rank["refusal"]), str(rank["refusal"])
        assert rank["global_step"][0] == 0


def test_accumulation_graph_has_no_allreduce_and_no_optimizer(plain_graph_run):
    """The final IR MindSpore saved for the graphs compiled on rank 0: the accumulation graph, compiled first (the
    first call accumulates), then the window's end, which MindSpore splits into kernel graphs at the window's item
    check. Only the accumulation graph holds the network: a forward-backward in the window's end would hold a
    second arena of activations (benchmarks/memory.py)."""
    out, _ = plain_graph_run
    finals = sorted(glob.glob(str(out / "graphs_*" / "rank_0" / "hwopt_common_final_graph_*.ir")),
                    key=lambda f: int(re.search(r"final_graph_(\d+)_", f).group(1)))
    assert len(finals) >= 2, finals
    contents = [open(f, encoding="utf-8").read() for f in finals]
    holds = [(len(re.findall(r"\bAllReduce\b", c)) > 0, "ApplyMomentum" in c) for c in contents]
    assert holds[0] == (False, False), "the accumulation graph must hold no AllReduce and no optimizer"
    assert any(h[0] for h in holds[1:]) and any(h[1] for h in holds[1:]), "the update graph must hold both"
    forwards = ["SparseSoftmaxCrossEntropyWithLogits" in c for c in contents]
    assert forwards[0] and not any(forwards[1:]), "the network's forward must be in the accumulation graph only"


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_overflow_on_one_rank_makes_both_skip(worker_runs, mode):
    windows, steps = 2, 3
    ranks = load(worker_runs, OVERFLOW[mode])
    for r, arrays in enumerate(ranks):
        loss, overflow, scale = arrays["outputs"][0]
        assert overflow == 1.0 and scale == 512.0, f"rank {r} window 0: overflow {overflow}, scale {scale}"
        assert arrays["outputs"][1][1] == 0.0 and arrays["outputs"][1][2] == 512.0
        assert arrays["global_step"][0] == 1, f"rank {r} did not skip the overflowing window"
    assert_params_equal(params(ranks[1]), params(ranks[0]), context="rank 1 against rank 0")
    assert_equals_large_batch(params(ranks[0]), partial(reference_train, "momentum"),
                              union_windows(windows, steps)[1:], context="after the skipped window")


def test_token_counts_are_summed_over_ranks(worker_runs):
    """Each rank's micro-batches hold different numbers of real tokens: the window applies the token mean over
    both ranks' tokens, as one process on their union does."""
    windows, steps = 2, 3
    ranks = load(worker_runs, TOKENS)
    per_rank = [rank_token_batches(r, WORLD, windows, steps) for r in range(WORLD)]
    union = [[per_rank[r][w * steps + s] for r in range(WORLD) for s in range(steps)] for w in range(windows)]
    rank_tokens = [[float(b[2].sum()) for b in batches] for batches in per_rank]
    assert rank_tokens[0][:steps] != rank_tokens[1][:steps], "the ranks must hold different token counts"
    assert_params_equal(params(ranks[1]), params(ranks[0]), context="rank 1 against rank 0")
    assert_equals_large_batch(params(ranks[0]), partial(token_reference, "momentum"), union,
                              context="one process on the union's token mean")


def test_noise_scale_counts_every_micro_batch_of_both_ranks(worker_runs):
    """One micro-batch per rank and window: alone, a rank has no estimate (one micro-batch); the estimate sums
    both ranks' micro-batches: each window's (grad_sq, noise_trace) equals the estimator (helpers.noise_estimates,
    the formula test_noise_scale.py checks against per-sample truth) on the two micro-batches' value_and_grad
    gradients at the window's parameters of one process's large-batch run on their union, without ms_accum."""
    windows = union_windows(3, 1)
    ranks = load(worker_runs, NOISE)
    reference = noise_reference("momentum", windows)
    for r, arrays in enumerate(ranks):
        assert np.isfinite(arrays["outputs"]).all(), f"rank {r} has no estimate: {arrays['outputs']}"
        assert_noise_records_match(arrays["outputs"], reference, windows, context=f"rank {r}")


def test_the_window_is_the_large_batchs_mean_whatever_gradients_mean_says(worker_runs):
    """With gradients_mean=False MindSpore's reducer sums the devices' gradients: the window is still the mean over
    both ranks' samples (it was 2 times that), for TrainAccuStepsCell and for an Accumulator in a jit step."""
    ranks = load(worker_runs, MEAN_FALSE)
    for rank, arrays in enumerate(ranks):
        for prefix in ("param:", "accumulator:"):
            got = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
            assert_equals_large_batch(got, partial(reference_train, "momentum"), union_windows(2, 2),
                                      context=f"rank {rank}, {prefix[:-1]}")


def test_a_flush_with_the_open_window_on_one_device_only_applies_it_on_both(worker_runs):
    """Rank 0 holds one micro-batch more: its flush reduced alone and hung until MindSpore's collective timed out,
    rank 1's returned at once. Both now apply the last window, rank 0's micro-batch alone, as one process would."""
    ranks = load(worker_runs, UNEVEN_FLUSH)
    extra = rank_batches(0, WORLD, 3, 2)[4]
    for rank, arrays in enumerate(ranks):
        got = {k[len("accumulator:"):]: v for k, v in arrays.items() if k.startswith("accumulator:")}
        assert_equals_large_batch(got, partial(reference_train, "momentum"), union_windows(2, 2) + [[extra]],
                                  context=f"rank {rank}")


def test_model_accu_refuses_devices_with_unequal_epochs_before_training(worker_runs):
    """Rank 0's dataset holds one micro-batch more: its last window's reduction waited alone until MindSpore's
    collective timed out. Every rank now refuses before training, naming the sizes and the fix."""
    ranks = load(worker_runs, UNEVEN_EPOCHS)
    for rank, arrays in enumerate(ranks):
        assert "every device's dataset must hold as many micro-batches, but they hold [5, 4] (by rank)" in \
            str(arrays["refusal"]) and "num_shards=<devices>" in str(arrays["refusal"]), f"rank {rank}"
        assert arrays["global_step"][0] == 0, f"rank {rank} trained"


def test_model_accu_refuses_devices_given_another_n_before_training(worker_runs):
    """Rank 1 given twice rank 0's N: a new user's such run trained windows mixing both ranks' micro-batches, then
    one rank failed inside MindSpore's AllReduce. Every rank now refuses before training, naming each rank's N."""
    ranks = load(worker_runs, UNEVEN_STEPS)
    for rank, arrays in enumerate(ranks):
        assert "'accumulation_steps' (gradient_accumulation_steps) must be the same on every device, but they take " \
               f"2, 4 (by rank; this device {2 * (1 + rank)})" in str(arrays["refusal"]), f"rank {rank}"
        assert arrays["global_step"][0] == 0, f"rank {rank} trained"


def test_the_pages_data_parallel_example_runs_under_msrun(tmp_path):
    """docs/parallel.md's data-parallel example, as written, on 2 msrun workers: both train their 2 epochs (2 windows
    each: their shard is 8 micro-batches of 16) and print the same losses. A new user found it would not run (no
    mindspore import, no dataset)."""
    page = open(os.path.join(ROOT, "docs", "parallel.md"), encoding="utf-8").read()
    code = next(code for language, code in DOC_FENCE.findall(page) if "init()" in code)
    script = tmp_path / "train_dp.py"
    script.write_text(code, encoding="utf-8")
    logs = [re.findall(r"^(epoch: \d+ step: \d+), loss is ([0-9.]+)$", log, re.M)
            for log in run_local(tmp_path, str(script), per_worker=True)]
    assert [step for step, _ in logs[0]] == ["epoch: 1 step: 1", "epoch: 1 step: 2", "epoch: 2 step: 1",
                                             "epoch: 2 step: 2"], logs
    assert logs[0] == logs[1], "the two devices reported other losses"


def test_the_reduced_window_gradient_is_clipped_once(worker_runs):
    """Clipping sees the window's gradient averaged over both ranks, as one process on the union would."""
    ranks = load(worker_runs, CLIP)
    norms = functional_reference("momentum", union_windows(2, 3), clip_norm=CLIP_NORM)[1]
    assert min(norms) > 2 * CLIP_NORM, f"the windows' norms {norms} must be well above clip_norm"
    assert_params_equal(params(ranks[1]), params(ranks[0]), context="rank 1 against rank 0")
    assert_equals_large_batch(params(ranks[0]), large_batch("momentum", CLIP_NORM), union_windows(2, 3),
                              context="the clipped large batch on the union")


def msrun_train_py(out_dir, *args, node_timeout=None):
    """train.py on 2 msrun CPU workers; return the Popen (its own process group)."""
    return launch_local(out_dir, os.path.join(ZOO, "train.py"), *args, node_timeout=node_timeout)


def test_data_parallel_train_py_killed_on_one_rank_resumes_exactly(tmp_path):
    """A real SIGKILL of rank 1's worker; msrun ends the job; msrun --resume DIR continues every rank from its own
    state, and both ranks end with the parameters of an uninterrupted run."""
    common = ("--parallel_mode", "data_parallel", "--data_path", SAMPLE, "--num_samples", 640, "--batch_size", 16,
              "--accumulation_steps", 4, "--epoch_size", 4, "--log_every", 0, "--save_state_every", 1)
    full = msrun_train_py(tmp_path / "full_logs", "--ckpt_path", tmp_path / "full", *common)
    out, _ = full.communicate(timeout=600)
    assert full.returncode == 0, out[-3000:]

    cut = tmp_path / "cut"
    victim = msrun_train_py(tmp_path / "cut_logs", "--ckpt_path", cut, *common, node_timeout=KILL_NODE_TIMEOUT)
    deadline = time.time() + 300
    while not (cut / "rank_1" / "train_state.prev.ckpt").exists() and time.time() < deadline \
            and victim.poll() is None:
        time.sleep(0.05)
    worker = train_py_worker(victim, 1)
    assert worker is not None and victim.poll() is None, "the job ended before a worker could be killed"
    worker.send_signal(signal.SIGKILL)
    try:
        out, _ = victim.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(victim.pid, signal.SIGKILL)
        pytest.fail("msrun did not end the job after one worker was killed")
    assert victim.returncode != 0, "msrun reported success for a job with a killed worker"
    assert not (cut / "rank_0" / "checkpoint_lenet-4_10.ckpt").exists(), "the kill came after the end of training"

    resumed = msrun_train_py(tmp_path / "resume_logs", "--ckpt_path", cut, "--resume", cut, *common)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out[-3000:]
    for rank in range(WORLD):
        want = ms.load_checkpoint(str(tmp_path / "full" / f"rank_{rank}" / "checkpoint_lenet-4_10.ckpt"))
        got = ms.load_checkpoint(str(cut / f"rank_{rank}" / "checkpoint_lenet-4_10.ckpt"))
        for param in LeNet5().get_parameters():
            np.testing.assert_allclose(got[param.name].asnumpy(), want[param.name].asnumpy(), rtol=1e-6,
                                       atol=1e-7, err_msg=f"rank {rank}: {param.name}")


def test_lenet_data_parallel_checkpoint_evaluates_and_resumes_on_one_device(tmp_path):
    common = ("--data_path", SAMPLE, "--num_samples", 1024, "--batch_size", 32, "--accumulation_steps", 4,
              "--lr", 0.05, "--lr_schedule", "constant", "--log_every", 0)
    logs = run_local(tmp_path, os.path.join(ZOO, "train.py"), "--parallel_mode", "data_parallel", "--epoch_size", 1,
                     "--ckpt_path", tmp_path / "dp", "--save_state_every", 8, *common)
    assert "effective batch 256" in logs
    ckpts = [tmp_path / "dp" / f"rank_{r}" / "checkpoint_lenet-1_8.ckpt" for r in range(WORLD)]  # 32 x 32 each
    saved = [ms.load_checkpoint(str(c)) for c in ckpts]
    for param in LeNet5().get_parameters():
        np.testing.assert_array_equal(saved[0][param.name].asnumpy(), saved[1][param.name].asnumpy())
    assert int(saved[0]["global_step"].asnumpy()[0]) == 8 and int(saved[0]["epoch_num"].asnumpy()) == 1

    _, out, _ = run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path", ckpts[0])
    assert ACCURACY.search(out), out
    # its exact state on one process with the same --num_samples, each process's: half the data. A new user's trial
    # was refused for the learning-rate schedule's length, the flag that differs unnamed
    code, _, err = run_script("train.py", "--trainer", "model_accu", "--resume", tmp_path / "dp", "--epoch_size", 1,
                              "--ckpt_path", tmp_path / "half", *common, check=False)
    assert code == 2 and "continues a run whose epochs read 2048 samples over all its processes, but this run's " \
        "epochs would read 1024 samples over its 1 (its --num_samples counts each process's samples): pass " \
        "--num_samples 2048, or resume from an epoch checkpoint" in err, err

    run_script("train.py", "--trainer", "model_accu", "--resume", ckpts[0], "--epoch_size", 2,
               "--ckpt_path", tmp_path / "one", *common)
    resumed = ms.load_checkpoint(str(tmp_path / "one" / "checkpoint_lenet-2_8.ckpt"))
    assert int(resumed["global_step"].asnumpy()[0]) == 8 + 8, "optimizer state did not carry over"

    # The same epoch computed here from the data-parallel checkpoint: resuming lost nothing.
    net = LeNet5()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, accumulation_steps=4)
    ms_accum.load_network_checkpoint(cell, str(ckpts[0]), optional=ms_accum.is_accumulation_buffer)
    batches = create_dataset(SAMPLE, 32, "train", num_samples=1024, seed=1).create_tuple_iterator(num_epochs=2)
    for _ in batches:  # resuming after epoch 1 replays the data order of epoch 2 of an uninterrupted run
        pass
    for index, (images, labels) in enumerate(batches):
        cell.set_accumulation(index % 4 != 3)
        cell(images, labels)
    for name, want in params_of(net).items():
        err = np.abs(resumed[name].asnumpy() - want).max() / np.abs(want).max()
        assert err <= 1e-4, f"{name}: resumed run differs from the direct computation by {err:.3g}"


def test_every_rank_takes_the_same_plan_from_the_largest_peaks(worker_runs):
    """plan_micro_batch(world=2) on two real processes whose peaks differ: each rank alone would plan otherwise
    (rank 0: micro-batch 8, rank 1: 4); both take 4 x N 4 x 2 devices = 32, the plan of the larger peaks."""
    ranks = load(worker_runs, PLAN)
    alone = [ms_accum.plan_micro_batch(lambda b, f=f, s=s: ms_accum.Measurement(b, (f + s * b) * 2 ** 20), 32,
                                       "200MiB", devices=2, verbose=False).micro_batch
             for f, s in ((100, 10), (100, 14))]
    assert alone == [8, 4]
    for rank, arrays in enumerate(ranks):
        assert arrays["plan"].tolist() == [4, 4], f"rank {rank}: {arrays['plan'].tolist()}"


@pytest.mark.parametrize("rule", list(RULES))
def test_each_window_is_the_large_batch_step_at_the_rules_rate_on_two_ranks(worker_runs, rule):
    """N by test_lr_engine's schedule (1, 1, 3, 3 micro-batches), each micro-batch shared by the two ranks, and a
    learning-rate rule: each window's update on each rank equals MindSpore's own optimizer stepped on the window's
    concatenated batch over both ranks at the rule's rate, computed independently (G / G0 over both ranks'
    samples, its square root, or AdaScale's gain from numpy's noise estimates over the ranks' micro-batches); the
    control at factor 1 fails. Progress ends at G / G0 summed (1 + 1 + 3 + 3), or AdaScale's gains summed."""
    from test_lr_engine import check_updates, union_of_ranks  # pylint: disable=import-outside-toplevel
    ranks = load(worker_runs, RULES[rule])
    for rank, arrays in enumerate(ranks):
        def update(index, _, arrays=arrays):
            count = sum(1 for key in arrays if key.startswith("window:-1:"))
            return [arrays[f"window:{index}:{i}"].astype(np.float64) - arrays[f"window:{index - 1}:{i}"]
                    for i in range(count)]
        factors = check_updates(update, union_of_ranks(WORLD), rule, "momentum", f"rank {rank}")
        assert float(arrays["factor"]) == pytest.approx(factors[-1], rel=1e-5)
        # progress adds G / G0 per window (8 in all), AdaScale its gain r, which is also its factor with Momentum
        assert float(arrays["progress"]) == pytest.approx(sum(factors) if rule == "adascale" else 8.0, rel=1e-5)
