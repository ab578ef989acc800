"""on_out_of_memory="halve": a window that runs out of device memory is discarded and rerun from its start with half
the micro-batch, on every trainer that offers it (GradientAccumulation.train_process, and train.py
--on_out_of_memory halve, which trains with it). No device here runs out of memory: tests/oom_worker.py's seam
fails the driver's micro-batches above a size with MindSpore's message, before they run. Each run is checked
against the large batch trained without ms_accum, with BatchNorm and WindowTelemetry, and saved and resumed after
a halving."""
import csv
import os
import signal
import subprocess
import sys
from functools import partial

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

import ms_accum
from conftest import ROOT
from helpers import (OPTIMIZERS, SAMPLE, SmallConvNet, assert_equals_large_batch, build, grad_norm, micro_batches,
                     numpy_dataset, params_of, reference_train)
from oom_worker import out_of_memory_above
from src.dataset import create_dataset
from src.lenet import LeNet5

WORKER = os.path.join(ROOT, "tests", "oom_worker.py")
HALVED = ("a window ran out of device memory with micro-batches of {} sample(s): rerunning it from its start with "
          "{} and 2 times as many micro-batches (the global batch and the update count stay the same)")


def halving_driver(limit, seen, make=build, **crash):
    """The driver on `make`'s network, its micro-batches above `limit` samples failing as MindSpore's device memory
    pool fails; `crash`: out_of_memory_above's `stop_after` and `stop`."""
    net, loss, opt = make("momentum")
    trainer = ms_accum.GradientAccumulation(net, loss, opt)
    trainer._add_micro_batch = out_of_memory_above(  # pylint: disable=protected-access
        trainer._add_micro_batch, limit, seen, **crash)  # pylint: disable=protected-access
    return trainer, net, opt


def test_a_window_out_of_memory_is_rerun_with_half_the_micro_batch_and_equals_the_large_batch(capsys, exec_mode):
    """Micro-batches of 8, N = 2; the device holds 4 samples: the first window fails at its first micro-batch, is
    discarded and run again from its start as 4 micro-batches of 4, and every later window so; the parameters
    equal the large-batch steps on the same windows, and the optimizer stepped once per window."""
    batches = micro_batches([8] * 6)
    seen = []
    trainer, net, opt = halving_driver(4, seen)
    trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0, on_out_of_memory="halve")
    assert seen == [8] + [4] * 12, seen
    assert int(opt.global_step.asnumpy()[0]) == 3, "a window was applied twice, or not at all"
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"),
                              [batches[0:2], batches[2:4], batches[4:6]],
                              context=f"halved after out of memory, {exec_mode}")
    assert HALVED.format(8, 4) in capsys.readouterr().out


def test_out_of_memory_mid_window_discards_what_the_window_had_added():
    """The second micro-batch of each window is larger (12 against 4) and fails: the window's first, already
    added, is added again once, not twice."""
    batches = micro_batches([4, 12] * 2)
    seen = []
    trainer, net, opt = halving_driver(6, seen)
    trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0, on_out_of_memory="halve")
    assert seen == [4, 12, 2, 2, 6, 6, 2, 2, 6, 6], seen
    assert int(opt.global_step.asnumpy()[0]) == 2
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches[0:2], batches[2:4]],
                              context="out of memory mid-window")


def test_out_of_memory_is_raised_by_default_and_when_a_sample_alone_does_not_fit():
    batches = micro_batches([2] * 4)
    trainer, _, opt = halving_driver(0, [])
    with pytest.raises(RuntimeError, match="Out of Memory"):
        trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0)
    assert int(opt.global_step.asnumpy()[0]) == 0
    trainer, _, opt = halving_driver(0, [])
    with pytest.raises(RuntimeError, match=r"For 'GradientAccumulation.train_process', a window ran out of device "
                                           r"memory with micro-batches of 1 sample\(s\), which cannot be halved"):
        trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0, on_out_of_memory="halve")
    assert int(opt.global_step.asnumpy()[0]) == 0


def test_other_errors_are_not_taken_for_out_of_memory():
    net, loss, opt = build("momentum")
    trainer = ms_accum.GradientAccumulation(net, loss, opt)

    def fail(data):
        raise RuntimeError("For 'Conv2D', the input must be 4-D")
    trainer._add_micro_batch = fail  # pylint: disable=protected-access
    with pytest.raises(RuntimeError, match="the input must be 4-D"):
        trainer.train_process(1, numpy_dataset(micro_batches([2] * 2)), 2, ckpt_path=None, log_every=0,
                              on_out_of_memory="halve")
    with pytest.raises(ValueError, match=r"'on_out_of_memory' must be one of \['raise', 'halve'\], but got 'retry'"):
        trainer.train_process(1, numpy_dataset(micro_batches([2] * 2)), 2, ckpt_path=None, on_out_of_memory="retry")


# ---------------------------------------------------------------- with BatchNorm, telemetry, a save and a resume

HALF, N, EPOCHS = 4, 4, 2  # the device holds 4 samples of micro-batches of 8; two epochs of two windows of 4
MOMENTUM = 0.9  # BatchNorm's: moving statistic = MOMENTUM x moving statistic + (1 - MOMENTUM) x the micro-batch's


class InputNormNet(nn.Cell):
    """BatchNorm on the input, whose statistics are then the data's alone, before SmallConvNet's layers."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(1, momentum=MOMENTUM)
        self.body = SmallConvNet()

    def construct(self, x):
        return self.body(self.bn(x))


def build_norm_net(optimizer="momentum", seed=0):
    """A fresh InputNormNet in training mode, its loss and optimizer, identical for the same seed."""
    ms.set_seed(seed)
    net = InputNormNet()
    net.set_train(True)
    return net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), OPTIMIZERS[optimizer](
        net.trainable_params())


def equal_statistics_batches(seed=3):
    """An epoch of 8 micro-batches of 2 x HALF samples, each half a permutation of one set of HALF samples (`base`,
    returned too) with labels of its own: every half, micro-batch and window has `base`'s mean and variance, so
    BatchNorm in training mode normalises a halved micro-batch, a whole one and a window's large batch alike."""
    rng = np.random.default_rng(seed)
    base = rng.normal(loc=1.0, size=(HALF, 1, 6, 6)).astype(np.float32)
    batches = [(np.concatenate([base[rng.permutation(HALF)] for _ in range(2)]),
                rng.integers(0, 4, size=2 * HALF).astype(np.int32)) for _ in range(2 * N)]
    return batches, base


def windows_of(batches):
    """The run's windows: N micro-batches each, the epoch's order every epoch."""
    return [batches[start:start + N] for start in range(0, len(batches), N)] * EPOCHS


def large_batch_reference(make, windows):
    """Training written without ms_accum: per window, value_and_grad of the mean loss over its concatenated
    micro-batches (the network as `make` leaves it: in training mode), one optimizer step. Returns (parameters,
    each window's (loss, gradient norm))."""
    net, loss, opt = make()
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
    figures = []
    for window in windows:
        value, grads = grad_fn(*(Tensor(np.concatenate(parts)) for parts in zip(*window)))
        figures.append((float(value.asnumpy()), grad_norm(grads)))
        opt(grads)
    return params_of(net), figures


def assert_weights_equal_large_batch(net, make, windows, context):
    """The trained weights' update (BatchNorm's moving statistics apart) equals :func:`large_batch_reference`'s on
    `windows` (tests/helpers.py assert_equals_large_batch: the float32 rounding bound, and a failing control)."""
    trainable = {param.name for param in net.trainable_params()}

    def reference(some_windows):
        return {k: v for k, v in large_batch_reference(make, some_windows)[0].items() if k in trainable}
    assert_equals_large_batch({k: v for k, v in params_of(net).items() if k in trainable}, reference, windows,
                              context=context)


def assert_moving_statistics(net, base, forwards):
    """BatchNorm's moving mean and variance after `forwards` micro-batches with `base`'s statistics, from their
    initial 0 and 1: each forward that ran moved them once (the variance unbiased over the micro-batch's
    elements), the rerun micro-batches' included."""
    decay = MOMENTUM ** forwards
    np.testing.assert_allclose(net.bn.moving_mean.asnumpy(), [(1 - decay) * base.mean()], rtol=1e-5)
    np.testing.assert_allclose(net.bn.moving_variance.asnumpy(), [decay + (1 - decay) * base.var(ddof=1)],
                               rtol=1e-5)


def assert_records(records, figures, updates):
    """Telemetry's records of `updates` (from 1): N micro-batches as the dataset cut them, 2 x HALF x N samples,
    and the loss and gradient norm of the large batch's window."""
    assert [(r.update, r.micro_batches, r.items) for r in records] == [(u, N, 2.0 * HALF * N) for u in updates]
    for record, update in zip(records, updates):
        loss, norm = figures[update - 1]
        assert record.loss == pytest.approx(loss, rel=1e-5) and record.grad_norm == pytest.approx(norm, rel=1e-5), \
            (update, record, loss, norm)


class _Crash(Exception):
    pass


def crash():
    raise _Crash()


def crash_after(batches, state, micro_batches_asked):
    """Train halving on the device of HALF samples, writing the exact state every micro-batch, and crash when the
    driver asks for micro-batch `micro_batches_asked` + 1 (halves counted, the failed micro-batch too); the
    position the state file holds."""
    trainer, _, _ = halving_driver(HALF, [], make=build_norm_net, stop_after=micro_batches_asked, stop=crash)
    with pytest.raises(_Crash):
        trainer.train_process(EPOCHS, numpy_dataset(batches), N, callbacks=[ms_accum.WindowTelemetry()],
                              ckpt_path=None, log_every=0, on_out_of_memory="halve", state_path=state,
                              save_state_every=1)
    return int(ms.load_checkpoint(state)["ms_accum_micro_steps_done"].asnumpy())


def test_a_halved_run_with_batchnorm_and_telemetry_equals_the_large_batch(exec_mode):
    """The first window fails at its first micro-batch and every window runs as 8 micro-batches of 4: the trained
    weights equal the large batch's in training mode, and telemetry reports each window's samples, loss and
    gradient norm as the large batch's. BatchNorm's moving statistics moved once per forward that ran (the 32
    halves; the seam fails a micro-batch before its forward, where a device may have run part of it), not once per
    window as the large batch's."""
    batches, base = equal_statistics_batches()
    seen = []
    trainer, net, opt = halving_driver(HALF, seen, make=build_norm_net)
    telemetry = ms_accum.WindowTelemetry()
    trainer.train_process(EPOCHS, numpy_dataset(batches), N, callbacks=[telemetry], ckpt_path=None, log_every=0,
                          on_out_of_memory="halve")
    assert seen == [2 * HALF] + [HALF] * 32, seen
    assert int(opt.global_step.asnumpy()[0]) == 4
    _, figures = large_batch_reference(build_norm_net, windows_of(batches))
    assert_weights_equal_large_batch(net, build_norm_net, windows_of(batches), f"halved with BatchNorm, {exec_mode}")
    assert_records(telemetry.records, figures, [1, 2, 3, 4])
    assert_moving_statistics(net, base, 32)


def test_a_run_saved_after_a_halving_resumes_at_a_window_boundary_as_the_large_batch(tmp_path, capsys):
    """Crashed as its fourth window begins (epoch 2, 4 of its 8 micro-batches done), the state written every
    micro-batch; resumed on the same device, the first window fails again (the split is not saved: it is the
    device's), is halved, and the run ends with the large batch's weights; telemetry's last record is the large
    batch's fourth window; the moving statistics carried in the state and moved by the resumed run's 8 halves
    are those of the uninterrupted run's 32."""
    batches, base = equal_statistics_batches()
    state = str(tmp_path / "state.ckpt")
    assert crash_after(batches, state, 1 + 3 * 2 * N) == 3 * N  # the failed micro-batch, then 3 windows of halves
    seen = []
    resumed, net, opt = halving_driver(HALF, seen, make=lambda optimizer: build_norm_net(optimizer, seed=7))
    telemetry = ms_accum.WindowTelemetry()
    capsys.readouterr()
    resumed.train_process(EPOCHS, numpy_dataset(batches), N, callbacks=[telemetry], ckpt_path=None, log_every=0,
                          on_out_of_memory="halve", resume_from=state)
    assert HALVED.format(2 * HALF, HALF) in capsys.readouterr().out
    assert seen == [2 * HALF] + [HALF] * 2 * N, seen
    assert int(opt.global_step.asnumpy()[0]) == 4
    _, figures = large_batch_reference(build_norm_net, windows_of(batches))
    assert_weights_equal_large_batch(net, build_norm_net, windows_of(batches), "resumed after a halving")
    assert_records(telemetry.records, figures, [4])
    assert_moving_statistics(net, base, 32)


def test_a_window_opened_before_a_resume_is_not_rerun_with_a_smaller_micro_batch(tmp_path):
    """Crashed inside the second window (2 of its micro-batches added, as 4 halves) and resumed on the same device:
    the window's first micro-batches are not held, so it cannot be rerun; the run stops, saying what to do, the
    optimizer where the state left it. Done as it says (the dataset batched at the half, the global batch kept),
    the run ends with the large batch's weights."""
    batches, _ = equal_statistics_batches()
    state = str(tmp_path / "state.ckpt")
    assert crash_after(batches, state, 1 + 2 * N + 2 * 2) == N + 2
    resumed, _, opt = halving_driver(HALF, [], make=build_norm_net)
    with pytest.raises(RuntimeError, match=r"For 'GradientAccumulation.train_process', a window ran out of device "
                                           r"memory, but it was opened before this run resumed, so its first "
                                           r"micro-batches are not held to rerun it with a smaller micro-batch. "
                                           r"Resume with the dataset batched smaller and the same global batch "
                                           r"\('global_batch_size'\), or from an epoch checkpoint."):
        resumed.train_process(EPOCHS, numpy_dataset(batches), N, ckpt_path=None, log_every=0,
                              on_out_of_memory="halve", resume_from=state)
    assert int(opt.global_step.asnumpy()[0]) == 1
    halves = [(x[at:at + HALF], y[at:at + HALF]) for x, y in batches for at in (0, HALF)]
    resumed, net, opt = halving_driver(HALF, [], make=build_norm_net)
    resumed.train_process(EPOCHS, numpy_dataset(halves), global_batch_size=N * 2 * HALF, ckpt_path=None,
                          log_every=0, on_out_of_memory="halve", resume_from=state)
    assert int(opt.global_step.asnumpy()[0]) == 4
    assert_weights_equal_large_batch(net, build_norm_net, windows_of(batches), "resumed batched at the half")


def test_a_state_written_inside_a_halved_window_resumes_on_a_device_that_fits(tmp_path):
    """Crashed inside the second window after a halving, resumed on a device that holds the whole micro-batch:
    the run continues the open window with whole micro-batches and ends with the large batch's weights. (The
    state file's count of the open window is the dataset's micro-batches; the cell's counter, the 4 halves added,
    once resumed a window of N = 4 as full.)"""
    batches, _ = equal_statistics_batches()
    state = str(tmp_path / "state.ckpt")
    assert crash_after(batches, state, 1 + 2 * N + 2 * 2) == N + 2
    resumed, net, opt = halving_driver(2 * HALF, [], make=build_norm_net)
    resumed.train_process(EPOCHS, numpy_dataset(batches), N, ckpt_path=None, log_every=0, on_out_of_memory="halve",
                          resume_from=state)
    assert int(opt.global_step.asnumpy()[0]) == 4
    assert_weights_equal_large_batch(net, build_norm_net, windows_of(batches), "resumed inside a halved window")


# ---------------------------------------------------------------- train.py --on_out_of_memory halve

LENET = dict(samples=128, batch=16, lr=0.05)  # 8 micro-batches of 16 an epoch; the device holds 8 samples


def run_on_small_device(stop_after, *args):
    """train.py on a device holding 8 samples (tests/oom_worker.py), SIGKILLing itself after `stop_after`
    micro-batches asked for (0: never)."""
    return subprocess.run([sys.executable, WORKER, "8", str(stop_after), *map(str, args)], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=600, check=False)


def lenet_windows():
    """The windows train.py sees: its data (create_dataset, seed 1) epoch after epoch, N micro-batches each."""
    data = create_dataset(SAMPLE, LENET["batch"], "train", num_samples=LENET["samples"], seed=1)
    iterator = data.create_tuple_iterator(num_epochs=EPOCHS)
    batches = [(x.asnumpy(), y.asnumpy()) for _ in range(EPOCHS) for x, y in iterator]
    return [batches[start:start + N] for start in range(0, len(batches), N)]


def build_lenet():
    """LeNet5 as train.py builds it (seed 1), with its loss and Momentum at a constant rate."""
    ms.set_seed(1)
    net = LeNet5()
    return net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.Momentum(
        net.trainable_params(), LENET["lr"], 0.9)


def read_rows(path):
    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_train_py_halves_reports_and_resumes_after_a_halving_as_the_large_batch(tmp_path):
    """train.py --on_out_of_memory halve, micro-batches of 16 on a device of 8: its first window is rerun halved,
    and the telemetry CSV reports each window's 64 samples, loss and gradient norm as the large batch's. SIGKILLed
    as its fourth window begins (its state written at that window's boundary) and resumed with --resume on the same
    device, it halves again and ends with the parameters of LeNet5 trained on each window's 64 samples at once,
    without ms_accum."""
    common = ("--data_path", SAMPLE, "--num_samples", LENET["samples"], "--batch_size", LENET["batch"],
              "--accumulation_steps", N, "--epoch_size", EPOCHS, "--lr", LENET["lr"], "--lr_schedule", "constant",
              "--log_every", 0, "--save_state_every", 1, "--on_out_of_memory", "halve", "--ckpt_path", tmp_path)
    cut = run_on_small_device(1 + 3 * 2 * N, *common, "--telemetry_csv", tmp_path / "cut.csv")
    assert cut.returncode == -signal.SIGKILL, cut.stdout[-3000:] + cut.stderr[-3000:]
    assert HALVED.format(16, 8) in cut.stdout, cut.stdout
    state = tmp_path / "train_state.ckpt"
    assert int(ms.load_checkpoint(str(state))["ms_accum_micro_steps_done"].asnumpy()) == 3 * N
    resumed = run_on_small_device(0, *common, "--resume", state, "--telemetry_csv", tmp_path / "resumed.csv")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert HALVED.format(16, 8) in resumed.stdout, resumed.stdout
    windows = lenet_windows()
    expected, figures = large_batch_reference(build_lenet, windows)
    rows = read_rows(tmp_path / "cut.csv") + read_rows(tmp_path / "resumed.csv")
    assert [(int(r["update"]), float(r["items"])) for r in rows] == [(u, 64.0) for u in (1, 2, 3, 4)], rows
    for row, (loss, norm) in zip(rows, figures):
        assert float(row["loss"]) == pytest.approx(loss, rel=1e-5), (row, loss)
        assert float(row["grad_norm"]) == pytest.approx(norm, rel=1e-5), (row, norm)
    last = resumed.stdout.strip().splitlines()[-1].split("last checkpoint: ")[1]
    trained = ms.load_checkpoint(last)
    assert_equals_large_batch({name: trained[name].asnumpy() for name in expected},
                              lambda some_windows: large_batch_reference(build_lenet, some_windows)[0], windows,
                              context="train.py resumed after a halving")
