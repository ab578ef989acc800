"""Exact resume: training interrupted at any micro-batch and resumed from its state file ends where an
uninterrupted run ends."""
import contextlib
import importlib.util
import io
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn
from mindspore.train import LossMonitor

import ms_accum
from conftest import ROOT, ZOO
from helpers import SAMPLE, StopAt, own_loop, params_of, run_script
from ms_accum.trainers.elastic import LAYOUT_KEYS
from src.dataset import create_dataset
from src.lenet import LeNet5

EPOCHS, N = 2, 4


def make_trainer(seed):
    ms.set_seed(seed)
    net = LeNet5()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return ms_accum.GradientAccumulation(net, loss, nn.Momentum(net.trainable_params(), 0.05, 0.9)), net


def data():
    """10 shuffled micro-batches per epoch: windows of 4, 4 and a flushed 2."""
    return create_dataset(SAMPLE, 16, "train", num_samples=160, seed=3)


def logged_steps(printed):
    """The 'epoch: E step: S' of every loss line printed."""
    return re.findall(r"^(epoch: \d+ step: \d+) loss is", printed, re.M)


@pytest.fixture(scope="module")
def uninterrupted():
    trainer, net = make_trainer(seed=1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        losses = trainer.train_process(EPOCHS, data(), N, ckpt_path=None)
    steps = logged_steps(printed.getvalue())
    assert steps == [f"epoch: {e} step: {s}" for e in (1, 2) for s in (1, 2, 3)], printed.getvalue()
    return params_of(net), losses, steps


class _Killed(Exception):
    pass


def die_after(monkeypatch, cell_class, calls_allowed):
    """Make every `cell_class` call after the first `calls_allowed` raise _Killed, as a crash would stop it."""
    real_call = cell_class.__call__
    calls = []

    def call(cell, *inputs):
        if len(calls) == calls_allowed:
            raise _Killed()
        calls.append(1)
        return real_call(cell, *inputs)

    monkeypatch.setattr(cell_class, "__call__", call)


@pytest.mark.parametrize("stop_after", [1, 6, 10, 13, 19])  # mid-window, epoch end, second epoch, last window
def test_resume_from_any_micro_batch_matches_an_uninterrupted_run(stop_after, uninterrupted, tmp_path,
                                                                   monkeypatch, capsys):
    expected, losses, steps = uninterrupted
    state = str(tmp_path / "state.ckpt")
    trainer, _ = make_trainer(seed=1)
    die_after(monkeypatch, ms_accum.TrainAccuStepsCell, stop_after)
    with pytest.raises(_Killed):
        trainer.train_process(EPOCHS, data(), N, ckpt_path=None, log_every=0, state_path=state, save_state_every=1)
    monkeypatch.undo()
    saved = ms.load_checkpoint(state)
    assert int(saved["ms_accum_micro_steps_done"].asnumpy()) == stop_after
    assert int(saved["grad_sum.micro_steps"].asnumpy()) == {1: 1, 6: 2, 10: 0, 13: 3, 19: 1}[stop_after]

    resumed, net = make_trainer(seed=99)  # different initial weights: everything must come from the file
    capsys.readouterr()
    resumed_losses = resumed.train_process(EPOCHS, data(), N, ckpt_path=None, resume_from=state)
    out = capsys.readouterr().out
    # the log numbers each update as the uninterrupted run did (a resume once restarted S at 1 mid-epoch)
    assert logged_steps(out) == steps[len(steps) - len(resumed_losses):]
    per_epoch = data().get_dataset_size()
    epoch, offset = divmod(stop_after, per_epoch)  # counted as done, not as a 0-based position (read as the next)
    assert f"at epoch {epoch + 1} with {offset} of its {per_epoch} micro-batches done ({stop_after} in all)" in out
    in_window = {1: 1, 6: 2, 10: 0, 13: 3, 19: 1}[stop_after]  # the open window's micro-batches, as saved
    opened = re.findall(r"windows? begun \(window \d+ open with (\d+) micro-batch(?:es)? in it, continued\)\.", out)
    assert opened == ([str(in_window)] if in_window else []), out
    for name, want in expected.items():
        np.testing.assert_allclose(params_of(net)[name], want, rtol=1e-6, atol=1e-7,
                                   err_msg=f"{name} after resuming at micro-batch {stop_after}")
    assert resumed_losses == pytest.approx(losses[len(losses) - len(resumed_losses):], rel=1e-5)
    assert int(resumed.optimizer.global_step.asnumpy()[0]) == len(losses)


@pytest.mark.parametrize("every", [100, 0])
@pytest.mark.parametrize("update", [4, 3])  # mid-epoch 2, and epoch 1's last window
def test_a_requested_stop_writes_the_state_so_that_a_resume_loses_nothing(update, every, uninterrupted, tmp_path):
    """save_state_every=100 would write nothing in this run, nor 0 (a state_path alone; a new user's trial found
    no file after the stop, in silence, until the resume was refused); the stop writes the state where it stops."""
    expected = uninterrupted[0]
    state = str(tmp_path / "state.ckpt")
    trainer, _ = make_trainer(seed=1)
    trainer.train_process(EPOCHS, data(), N, callbacks=[StopAt(update)], ckpt_path=None, log_every=0,
                          state_path=state, save_state_every=every)
    saved = ms.load_checkpoint(state)
    assert int(saved["ms_accum_updates_done"].asnumpy()) == update
    assert int(saved["ms_accum_micro_steps_done"].asnumpy()) == {4: 14, 3: 10}[update]
    trainer, net = make_trainer(seed=5)
    trainer.train_process(EPOCHS, data(), N, ckpt_path=None, log_every=0, resume_from=state)
    for name, want in expected.items():
        np.testing.assert_allclose(params_of(net)[name], want, rtol=1e-6, atol=1e-7, err_msg=name)


def test_a_resume_under_another_partial_window_is_refused_where_epochs_end_in_one(tmp_path):
    """Epochs of 10 micro-batches: with N = 4 the saved run flushed each epoch's last 2, which a resume under "drop"
    would discard from then on; with N = 5 there is no partial window, and any policy resumes alike."""
    state = str(tmp_path / "state.ckpt")
    trainer, _ = make_trainer(seed=1)
    trainer.train_process(EPOCHS, data(), N, callbacks=[StopAt(3)], ckpt_path=None, log_every=0, state_path=state,
                          save_state_every=100)
    for policy in ("drop", "carry"):
        with pytest.raises(ms_accum.CheckpointError,
                           match=rf"'resume_from' '.*state.ckpt' continues a run whose epochs' partial windows this "
                                 rf"run would treat otherwise: 'partial_window' must be the saved run's 'flush', but "
                                 rf"got '{policy}'. Pass partial_window='flush', or start a new run from an epoch "
                                 rf"checkpoint."):
            make_trainer(seed=1)[0].train_process(EPOCHS, data(), N, ckpt_path=None, log_every=0,
                                                  resume_from=state, partial_window=policy)
    whole = str(tmp_path / "whole.ckpt")
    make_trainer(seed=1)[0].train_process(EPOCHS, data(), 5, callbacks=[StopAt(3)], ckpt_path=None, log_every=0,
                                          state_path=whole, save_state_every=100)
    reference, reference_net = make_trainer(seed=1)
    reference.train_process(EPOCHS, data(), 5, ckpt_path=None, log_every=0)
    resumed, net = make_trainer(seed=7)
    resumed.train_process(EPOCHS, data(), 5, ckpt_path=None, log_every=0, resume_from=whole, partial_window="drop")
    for name, want in params_of(reference_net).items():
        np.testing.assert_allclose(params_of(net)[name], want, rtol=1e-6, atol=1e-7, err_msg=name)


def test_resume_refuses_a_network_only_checkpoint(tmp_path):
    trainer, _ = make_trainer(seed=1)
    path = str(tmp_path / "final.ckpt")
    trainer.train_process(1, data(), N, ckpt_path=path, log_every=0)
    with pytest.raises(ms_accum.CheckpointError, match="must be a training state file"):
        make_trainer(seed=1)[0].train_process(2, data(), N, ckpt_path=None, resume_from=path)


def test_resume_errors_name_resume_from(tmp_path):
    trainer, _ = make_trainer(seed=1)
    with pytest.raises(ms_accum.CheckpointError, match=r"'resume_from' must be an existing checkpoint file, but "
                                                       r"'.*missing.ckpt' does not exist"):
        trainer.train_process(1, data(), N, ckpt_path=None, resume_from=str(tmp_path / "missing.ckpt"))
    other = nn.Dense(2, 2)
    grad_sum = nn.SGD(other.trainable_params(), 0.1).parameters.clone(prefix="grad_sum", init="zeros")
    cell = ms_accum.TrainForwardBackward(nn.WithLossCell(other, nn.MSELoss()), nn.SGD(other.trainable_params(), 0.1),
                                         grad_sum)
    state = ms_accum.save_training_state(cell, str(tmp_path / "other_state.ckpt"), 3, 1)
    with pytest.raises(ms_accum.CheckpointError, match=r"'resume_from' must be a training state of this model, but "
                                                       r"'.*other_state.ckpt' belongs to another network"):
        trainer.train_process(1, data(), N, ckpt_path=None, resume_from=state)


class _CountCalls(ms.train.Callback):
    def __init__(self):
        super().__init__()
        self.windows = 0

    def on_train_step_end(self, run_context):
        self.windows += 1


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_paths_and_callbacks_are_refused_before_training(trainer, tmp_path):
    """A ckpt_path, state_path or resume_from that is not a '.ckpt' file's name, and callbacks that are not
    Callbacks, are refused naming the trainer before its first micro-batch: the ckpt_path after the whole run had
    trained (its losses lost), the state_path at the first save, resume_from=123 as "'int' object is not
    subscriptable", callbacks='x' in MindSpore's words (a new user's trial)."""
    counted = _CountCalls()
    txt = str(tmp_path / "state.txt")
    if trainer == "driver":
        owner, train = "GradientAccumulation.train_process", make_trainer(seed=1)[0].train_process
        cases = [(dict(ckpt_path=txt), ValueError, f"'ckpt_path' must be a str ending with '.ckpt', but got '{txt}'."),
                 (dict(ckpt_path=None, state_path=txt, save_state_every=5), ValueError,
                  f"'state_path' must be a str ending with '.ckpt', but got '{txt}'.")]
        cases = [(lambda kw=kw: train(1, data(), N, callbacks=[counted], log_every=0, **kw), error, message)
                 for kw, error, message in cases]
        run = lambda **kw: train(1, data(), N, ckpt_path=None, log_every=0, **kw)  # noqa: E731
    else:
        owner = "Model_ACCU.train"
        with pytest.raises(ValueError, match=r"^For 'Model_ACCU', 'state_path' must be a str ending with '.ckpt', "
                                             r"but got 123\.$"):
            make_model(seed=1, state_path=123, save_state_every=5)
        model = make_model(seed=1)[0]
        cases = []
        run = lambda **kw: model.train(1, data(), dataset_sink_mode=False, **kw)  # noqa: E731
    cases += [(lambda: run(resume_from=123, callbacks=[counted]), ValueError,
               "'resume_from' must be a str ending with '.ckpt', but got 123."),
              (lambda: run(callbacks="x"), TypeError,
               "'callbacks' must be a mindspore.train.Callback, or a list or tuple of them, but got str."),
              (lambda: run(callbacks=[counted, print]), TypeError,
               "'callbacks' must be a mindspore.train.Callback, or a list or tuple of them, but got a list holding "
               "builtin_function_or_method.")]
    for call, error, message in cases:
        with pytest.raises(error) as caught:
            call()
        assert str(caught.value) == f"For '{owner}', {message}"
    assert counted.windows == 0, "a refused run trained"


def test_a_resume_warns_when_it_puts_back_another_learning_rate_or_momentum(tmp_path, recwarn):
    """The state holds the optimizer's learning rate and momentum, and loading it puts them back over those the
    resumed run built its optimizer with: the run continues the saved one exactly, as it must, but a new user who
    rebuilt the optimizer with another rate or momentum was not told that the change was undone."""
    trainer, _ = make_trainer(seed=1)
    state = str(tmp_path / "state.ckpt")
    stop = StopAt(2)  # inside epoch 1, at an update boundary: the state is written there
    trainer.train_process(EPOCHS, data(), N, ckpt_path=None, log_every=0, state_path=state, save_state_every=3,
                          callbacks=[stop])
    ms.set_seed(1)
    net = LeNet5()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    changed = ms_accum.GradientAccumulation(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.5))
    with pytest.warns(UserWarning, match=r"'state_path' .*state.ckpt' holds the optimizer's learning_rate 0.05 \(built "
                                         r"with 0.01\), momentum 0.9 \(built with 0.5\), which loading it put back"):
        ms_accum.load_training_state(changed.train_state, state, 20)
    recwarn.clear()
    ms_accum.load_training_state(make_trainer(seed=1)[0].train_state, state, 20)
    assert not [w for w in recwarn if "holds the optimizer's" in str(w.message)]


def test_a_state_of_another_optimizer_is_refused_naming_the_optimizer(tmp_path):
    """The same network with another optimizer (Adam for Momentum) or one built otherwise (a rate list for a
    constant): the refusal said the state "belongs to another network" (a new user's trial)."""
    def cell(optimizer):
        ms.set_seed(0)
        net = nn.Dense(3, 2)
        return ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), optimizer(net.trainable_params()),
                                           gradient_accumulation_steps=2)

    written = cell(lambda params: nn.Momentum(params, 0.1, 0.9))
    written(Tensor(np.ones((2, 3), np.float32)), Tensor(np.ones((2, 2), np.float32)))
    state = ms_accum.save_training_state(written, str(tmp_path / "state.ckpt"), 1, 0)
    for optimizer, detail in ((lambda params: nn.Adam(params, 0.1), r"missing \['beta1_power', 'beta2_power'"),
                              (lambda params: nn.Momentum(params, [0.1, 0.2], 0.9),
                               r"shape mismatch \['learning_rate \(\) != \(2,\)'\]")):
        with pytest.raises(ms_accum.CheckpointError, match=r"'state_path' must be a training state of this model, "
                                                           r"but '.*state.ckpt' was written with another optimizer, "
                                                           r"or one built otherwise \(its state differs, the "
                                                           r"network's does not\): " + detail):
            ms_accum.load_training_state(cell(optimizer), state, 10)


def test_a_state_of_another_path_is_refused_naming_both_paths(tmp_path):
    """A state written by Model_ACCU resumed by the driver (or the reverse) was refused as "another network"
    (missing 'grad_sum.conv1.weight', ...), though the network was the same: it names the path that wrote it now."""
    state = str(tmp_path / "state.ckpt")
    model, _, _ = make_model(seed=1, state_path=state, save_state_every=1)
    model.train(1, data(), callbacks=[StopAt(1)], dataset_sink_mode=False)
    with pytest.raises(ms_accum.CheckpointError, match=r"'resume_from' '.*state.ckpt' is the exact state of a run "
                                                       r"trained with TrainAccuStepsCell \(Model_ACCU\) or "
                                                       r"Accumulator, but this run trains with GradientAccumulation "
                                                       r"\(the driver\).*resume it with the path that wrote it"):
        make_trainer(seed=1)[0].train_process(EPOCHS, data(), N, ckpt_path=None, resume_from=state)
    make_trainer(seed=1)[0].train_process(1, data(), N, callbacks=[StopAt(1)], ckpt_path=None, log_every=0,
                                          state_path=state, save_state_every=1)
    with pytest.raises(ms_accum.CheckpointError, match=r"trained with GradientAccumulation \(the driver\) or the "
                                                       r"three single-device cells, but this run trains with "
                                                       r"TrainAccuStepsCell"):
        make_model(seed=1)[0].train(EPOCHS, data(), dataset_sink_mode=False, resume_from=state)


def kill_once_written(victim, state, micro_batches, timeout=120):
    """SIGKILL `victim` as soon as its exact state file `state` records at least `micro_batches` micro-batches
    done (read whenever the file changes: it is replaced whole, never seen half written), or after `timeout` s;
    wait for its end."""
    deadline, seen = time.time() + timeout, None
    while victim.poll() is None and time.time() < deadline:
        stamp = state.stat().st_mtime_ns if state.exists() else None
        if stamp is not None and stamp != seen:
            seen = stamp
            if _positions_in(str(state))[0] >= micro_batches:
                break
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()


@pytest.mark.slow
def test_train_py_killed_after_a_known_micro_batch_resumes_exactly(tmp_path):
    """A real SIGKILL of train.py once its state file records micro-batch 23 (epoch 2, 3 into a window of 4),
    checked to have killed it before its end (no last epoch checkpoint); --resume with the state file starts at
    the position the file holds and ends with the uninterrupted run's parameters."""
    per_epoch, epochs, kill_after = 20, 3, 23
    common = ("--data_path", SAMPLE, "--num_samples", 16 * per_epoch, "--batch_size", 16, "--accumulation_steps", N,
              "--epoch_size", epochs, "--log_every", 0, "--save_state_every", 1)
    full_out = run_script("train.py", "--ckpt_path", tmp_path / "full", *common)[1]
    last = f"checkpoint_lenet-{epochs}_{per_epoch // N}.ckpt"
    assert (tmp_path / "full" / last).exists(), full_out
    env = dict(os.environ, PYTHONPATH=ROOT)
    victim = subprocess.Popen([sys.executable, os.path.join(ZOO, "train.py"), "--ckpt_path", tmp_path / "cut",
                               *map(str, common)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / "cut" / "train_state.ckpt"
    kill_once_written(victim, state, kill_after)
    assert victim.returncode == -signal.SIGKILL, f"train.py ended with {victim.returncode}, not by the kill"
    assert not (tmp_path / "cut" / last).exists(), "the kill came after the end of training"
    position = _positions_in(str(state))[0]
    assert kill_after <= position < epochs * per_epoch, f"the state the kill left records {position} micro-batches"
    cut_out = run_script("train.py", "--ckpt_path", tmp_path / "cut", "--resume", state, *common)[1]
    epoch, offset = divmod(position, per_epoch)
    assert f"at epoch {epoch + 1} with {offset} of its {per_epoch} micro-batches done ({position} in all)" in \
        cut_out, cut_out
    full, cut = (ms.load_checkpoint(out.strip().splitlines()[-1].split("last checkpoint: ")[1])
                 for out in (full_out, cut_out))
    for param in LeNet5().get_parameters():
        np.testing.assert_allclose(cut[param.name].asnumpy(), full[param.name].asnumpy(), rtol=1e-6, atol=1e-7,
                                   err_msg=param.name)


def make_model(seed, **kwargs):
    ms.set_seed(seed)
    net = LeNet5()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = ms_accum.TrainAccuStepsWithLossScaleCell(
        nn.WithLossCell(net, loss), nn.Momentum(net.trainable_params(), 0.05, 0.9),
        nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 2), accumulation_steps=N)  # the scale grows every 2 windows
    return ms_accum.Model_ACCU(cell, **kwargs), net, cell


@pytest.fixture(scope="module")
def uninterrupted_model():
    model, net, cell = make_model(seed=1)
    model.train(EPOCHS, data(), dataset_sink_mode=False)
    return params_of(net), float(cell.scale_sense.asnumpy())


@pytest.mark.parametrize("stop_after", [3, 10, 17])
def test_model_accu_resumes_from_any_micro_batch(stop_after, uninterrupted_model, tmp_path, monkeypatch):
    expected, scale = uninterrupted_model
    state = str(tmp_path / "state.ckpt")
    model, _, _ = make_model(seed=1, state_path=state, save_state_every=1)
    die_after(monkeypatch, ms_accum.TrainAccuStepsWithLossScaleCell, stop_after)
    with pytest.raises(_Killed):
        model.train(EPOCHS, data(), dataset_sink_mode=False)
    monkeypatch.undo()
    resumed, net, cell = make_model(seed=99)
    resumed.train(EPOCHS, data(), dataset_sink_mode=False, resume_from=state)
    for name, want in expected.items():
        np.testing.assert_allclose(params_of(net)[name], want, rtol=1e-6, atol=1e-7,
                                   err_msg=f"{name} after resuming Model_ACCU at micro-batch {stop_after}")
    assert float(cell.scale_sense.asnumpy()) == scale > 1024.0


def test_model_accu_checks_loss_monitor_once_the_resumed_position_is_known(tmp_path, recwarn):
    """Windows carried over epochs of 10 (2, then 3 updates) mislabel LossMonitor's steps from epoch 2: the run
    warns. A resume refused for its partial_window warned of a run that never started."""
    state = str(tmp_path / "state.ckpt")
    model, _, _ = make_model(seed=1, state_path=state, save_state_every=1)
    model.train(1, data(), callbacks=[StopAt(1)], dataset_sink_mode=False)
    with pytest.raises(ms_accum.CheckpointError, match=r"'partial_window' must be the saved run's 'flush'"):
        make_model(seed=1)[0].train(EPOCHS, data(), callbacks=[LossMonitor(1)], dataset_sink_mode=False,
                                    resume_from=state, partial_window="carry")
    assert not [w for w in recwarn if "LossMonitor" in str(w.message)], [str(w.message) for w in recwarn]
    with pytest.warns(UserWarning, match=r"For 'Model_ACCU.train', MindSpore's LossMonitor .* off from epoch 2"):
        make_model(seed=1)[0].train(EPOCHS, data(), callbacks=[LossMonitor(1)], dataset_sink_mode=False,
                                    partial_window="carry")


@pytest.mark.parametrize("old_format", [1, 3])
def test_a_state_file_of_an_older_format_resumes_and_a_newer_format_is_refused(uninterrupted_model, tmp_path,
                                                                               monkeypatch, old_format):
    """0.1.0 wrote no format number and its cells had no '<prefix>.steps', formats 1 to 3 no '<prefix>.items_unit':
    such a file (this one, stripped and its buffers converted as the older release wrote them) still resumes
    exactly; a file of a newer format is refused, naming the versions. (Inside a window:
    test_a_format_3_state_written_inside_a_window_resumes_exactly.)"""
    expected, _ = uninterrupted_model
    state = str(tmp_path / "state.ckpt")
    model, _, _ = make_model(seed=1, state_path=state, save_state_every=1)
    die_after(monkeypatch, ms_accum.TrainAccuStepsWithLossScaleCell, 10)
    with pytest.raises(_Killed):
        model.train(EPOCHS, data(), dataset_sink_mode=False)
    monkeypatch.undo()
    saved = ms.load_checkpoint(state)
    assert int(saved["ms_accum_state_format"].asnumpy()) == 5 and "accu_window.steps" in saved
    assert int(saved["ms_accum_layout_steps"].asnumpy()) == model.gradient_accumulation_steps  # its layout
    first = float(saved["accu_window.items_unit"].asnumpy())
    dropped = ("accu_window.items_unit",)
    if old_format == 1:
        dropped += ("ms_accum_state_format", "accu_window.steps", "accu_window.skipped_windows",
                    "accu_window.nonfinite_streak", "accu_window.skip_history") + LAYOUT_KEYS
    old = [{"name": name, "data": ms.Tensor(value.asnumpy() * first) if name.startswith("accu_grads.") else value}
           for name, value in saved.items() if name not in dropped]
    if old_format == 3:
        old = [entry if entry["name"] != "ms_accum_state_format" else
               {"name": "ms_accum_state_format", "data": ms.Tensor(3, ms.int32)} for entry in old]
    for path in (state, state.replace(".ckpt", ".prev.ckpt")):
        ms.save_checkpoint(old, path)
    resumed, net, _ = make_model(seed=99)
    resumed.train(EPOCHS, data(), dataset_sink_mode=False, resume_from=state)
    for name, want in expected.items():
        np.testing.assert_allclose(params_of(net)[name], want, rtol=1e-6, atol=1e-7, err_msg=name)
    newer = [entry for entry in old if entry["name"] != "ms_accum_state_format"]
    ms.save_checkpoint(newer + [{"name": "ms_accum_state_format", "data": ms.Tensor(6, ms.int32)}], state)
    with pytest.raises(ms_accum.CheckpointError, match=r"is a state file of format 6, written by a newer ms_accum "
                                                       r"than this one \(which reads formats 1 to 5\)"):
        make_model(seed=99)[0].train(EPOCHS, data(), dataset_sink_mode=False, resume_from=state)


def _own_loop_state_after_4(path, sizes, tmp_path):
    """A user's own loop on `path` over micro-batches of `sizes` (windows of 3): (the micro-batches as Tensors, the
    parameters the uninterrupted run ends with, a state file written after 4 of them)."""
    from helpers import micro_batches  # pylint: disable=import-outside-toplevel
    batches = [(ms.Tensor(x), ms.Tensor(y)) for x, y in micro_batches(sizes)]
    net, run, _, _ = own_loop(path, seed=0)
    for index, (x, y) in enumerate(batches):
        run(index, x, y)
    expected = params_of(net)
    _, run, saved, _ = own_loop(path, seed=0)
    for index, (x, y) in enumerate(batches[:4]):
        run(index, x, y)
    state = ms_accum.save_training_state(saved, str(tmp_path / "state.ckpt"), micro_batches_done=4, updates_done=2)
    return batches, expected, state


@pytest.mark.parametrize("path", ["cells", "parallel"])
def test_a_format_3_state_written_inside_a_window_resumes_exactly(path, tmp_path):
    """Up to format 3 (ms_accum 0.3.0) the buffers held each micro-batch's gradient weighted by its items; format 4
    holds them divided by the window's first micro-batch's items ('<prefix>.items_unit'). A format-3 state written after
    4 of 9 micro-batches (a window of 3 holding one), its buffers as 0.3.0 wrote them, resumes where the
    uninterrupted run ends: the rest of its window is added in 0.3.0's units."""
    batches, expected, state = _own_loop_state_after_4(path, [4, 2, 5, 3, 4, 6, 2, 3, 5], tmp_path)
    written = ms.load_checkpoint(state)
    first_name = next(name for name in written if name.endswith(".items_unit"))
    first = float(written[first_name].asnumpy())
    assert first == 3.0, first  # the window's first micro-batch, of 3 samples: the conversion tests something
    old = [{"name": name, "data": ms.Tensor(3, ms.int32) if name == "ms_accum_state_format" else
            ms.Tensor(value.asnumpy() * first) if value.ndim > 0 and name.split(".")[0] in ("grad_sum", "accu_grads")
            else value} for name, value in written.items() if name != first_name]
    ms.save_checkpoint(old, state)
    net, run, fresh, _ = own_loop(path, seed=7)
    for param in fresh.get_parameters():  # as after a window begun with 5 samples: the load must reset it
        if param.name.endswith(".items_unit"):
            param.set_data(ms.Tensor(5.0, ms.float32))
    done, _ = ms_accum.load_training_state(fresh, state, total_micro_batches=9)
    for index, (x, y) in enumerate(batches[done:], start=done):
        run(index, x, y)
    for name, want in expected.items():
        np.testing.assert_allclose(params_of(net)[name], want, rtol=1e-6, atol=1e-7, err_msg=f"{path}: {name}")


@pytest.mark.parametrize("path", ["cells", "parallel", "accumulator"])
def test_a_users_own_loop_resumes_mid_window_with_save_training_state(path, tmp_path):
    """The cell a user's loop trains holds the network, the optimizer and the open window: saved after 4 of 9
    micro-batches (a window of 3 half full) into a state file and loaded into freshly built objects, the rest
    of the run ends where the uninterrupted run ends."""
    batches, expected, state = _own_loop_state_after_4(path, [4] * 9, tmp_path)
    net, run, fresh, _ = own_loop(path, seed=7)
    done, _ = ms_accum.load_training_state(fresh, state, total_micro_batches=9)
    for index, (x, y) in enumerate(batches[done:], start=done):
        run(index, x, y)
    for name, want in expected.items():
        np.testing.assert_allclose(params_of(net)[name], want, rtol=1e-6, atol=1e-7, err_msg=f"{path}: {name}")


def test_a_users_own_loop_is_told_of_its_own_arguments(tmp_path):
    """save_training_state checks the position it records; load_training_state's errors name its 'state_path' and
    'total_micro_batches', not the trainers' 'resume_from' and 'epoch'."""
    _, _, cell, _ = own_loop("cells", seed=0)
    path = str(tmp_path / "state.ckpt")
    with pytest.raises(TypeError, match=r"For 'save_training_state', 'micro_batches_done' must be an int >= 0, but got "
                                        r"'3' of type str."):
        ms_accum.save_training_state(cell, path, "3", 1)
    for kwargs, message in ((dict(micro_batches_done=-1, updates_done=0), "'micro_batches_done' must be an int >= 0, "
                                                                         "but got -1."),
                            (dict(micro_batches_done=4, updates_done=1, rank=2, world=2),
                             r"'rank' must be < 'world' \(2\), but got 2."),
                            (dict(micro_batches_done=4, updates_done=1, world=0), "'world' must be an int >= 1"),
                            (dict(micro_batches_done=4, updates_done=5), r"'updates_done' must be <= "
                                                                         r"'micro_batches_done' \(4\): each window "
                                                                         r"begun holds at least one of this process's "
                                                                         r"micro-batches, but got 5."),
                            (dict(micro_batches_done=4, updates_done=2, open_window=6),
                             r"'open_window' must be <= 'micro_batches_done' \(4\)")):
        with pytest.raises(ValueError, match=rf"For 'save_training_state', {message}"):
            ms_accum.save_training_state(cell, path, **kwargs)
    assert not os.path.exists(path), "a refused state was written"
    with pytest.raises(ms_accum.CheckpointError, match=r"'state_path' must be an existing checkpoint file"):
        ms_accum.load_training_state(cell, path, total_micro_batches=9)
    ms_accum.save_training_state(cell, path, micro_batches_done=9, updates_done=3)
    with pytest.raises(ms_accum.CheckpointError, match=r"'state_path' '.*state.ckpt' was written after 9 "
                                                       r"micro-batches, but this run ends after 9, so nothing is left "
                                                       r"to train: pass a larger 'total_micro_batches' to continue "
                                                       r"it."):
        ms_accum.load_training_state(cell, path, total_micro_batches=9)


def _batchnorm_accumulator_loop(seed):
    """A user's jit step around an Accumulator, on a network with BatchNorm (moving statistics the optimizer does
    not train): (the network, the accumulator, the step)."""
    ms.set_seed(seed)
    net = nn.SequentialCell([nn.Dense(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dense(16, 3)])
    net.set_train(True)
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    accumulator = ms_accum.Accumulator(optimizer, gradient_accumulation_steps=3)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                                None, optimizer.parameters)

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        return loss, accumulator(grads, x.shape[0])
    return net, accumulator, step


def test_an_accumulator_saved_with_its_network_resumes_its_batchnorm_statistics_exactly(tmp_path):
    """An Accumulator holds the optimizer's parameters and the window, not the network: saved alone it warns
    (BatchNorm's moving statistics would be lost); saved as (network, accumulator) mid-window, every Parameter of
    the network ends where the uninterrupted run's does."""
    rng = np.random.default_rng(0)
    batches = [(ms.Tensor(rng.normal(size=(4, 8)).astype(np.float32) + 2),
                ms.Tensor(rng.integers(0, 3, 4).astype(np.int32))) for _ in range(9)]
    net, _, step = _batchnorm_accumulator_loop(0)
    for x, y in batches:
        step(x, y)
    expected = params_of(net)
    assert any("moving_mean" in name for name in expected)
    net, accumulator, step = _batchnorm_accumulator_loop(0)
    for x, y in batches[:4]:
        step(x, y)
    with pytest.warns(UserWarning, match=r"'cell' \(Accumulator\) holds the optimizer's parameters and the open "
                                         r"window but not the network.*as a tuple \(network, accumulator\)"):
        ms_accum.save_training_state(accumulator, str(tmp_path / "alone.ckpt"), 4, 2)
    state = ms_accum.save_training_state((net, accumulator), str(tmp_path / "state.ckpt"), 4, 2)
    net, accumulator, step = _batchnorm_accumulator_loop(7)
    done, _ = ms_accum.load_training_state([net, accumulator], state, total_micro_batches=9)
    for x, y in batches[done:]:
        step(x, y)
    for name, want in expected.items():
        np.testing.assert_allclose(params_of(net)[name], want, rtol=1e-6, atol=1e-7, err_msg=name)


def test_cells_saved_together_must_be_cells_with_distinct_parameter_names(tmp_path):
    with pytest.raises(TypeError, match=r"For 'save_training_state', 'cell' must be a Cell, or a tuple or list of "
                                        r"Cells \(such as \(network, accumulator\)\), but got tuple of "
                                        r"\['Dense', 'str'\]"):
        ms_accum.save_training_state((nn.Dense(2, 2), "net"), str(tmp_path / "state.ckpt"), 1, 1)
    with pytest.raises(ValueError, match=r"two different Parameters are named 'weight'.*one parent Cell"):
        ms_accum.load_training_state((nn.Dense(2, 2), nn.Dense(2, 2)), str(tmp_path / "state.ckpt"), 4)
    with pytest.raises(ValueError, match=r"For 'save_training_state', 'state_path' must be a str ending with "
                                         r"'.ckpt', but got '.*state.bin'"):
        ms_accum.save_training_state(nn.Dense(2, 2), str(tmp_path / "state.bin"), 1, 1)
    assert not os.listdir(tmp_path)  # nothing written


# ------------------------------------------------------------------ state generations and rank agreement
def _positions_in(state_path):
    from ms_accum.trainers.state import previous_generation
    return [int(ms.load_checkpoint(p)["ms_accum_micro_steps_done"].asnumpy())
            for p in (state_path, previous_generation(state_path)) if os.path.exists(p)]


def test_each_state_write_keeps_the_previous_generation(tmp_path):
    trainer, _ = make_trainer(seed=1)
    state = str(tmp_path / "state.ckpt")
    for position in (3, 7, 11):
        ms_accum.save_training_state(trainer.cell, state, position, position // 4)
    assert _positions_in(state) == [11, 7]
    assert os.path.exists(tmp_path / "state.prev.ckpt")


def test_one_process_resumes_from_its_state_file_not_an_older_runs_generation(tmp_path):
    """A run restarted afresh on the same path writes fewer micro-batches than the run before it: its state file,
    the newest, is the one resumed, not the previous generation the earlier run left (further on, older). That
    generation is not read on one process: one of another model refuses nothing."""
    trainer, _ = make_trainer(seed=1)
    state = str(tmp_path / "state.ckpt")
    for position in (12, 20):  # the first run, killed late
        ms_accum.save_training_state(trainer.cell, state, position, position // 4)
    ms_accum.save_training_state(trainer.cell, state, 4, 1)  # the run started afresh, killed early
    assert _positions_in(state) == [4, 20]
    assert ms_accum.load_training_state(make_trainer(seed=2)[0].cell, state, total_micro_batches=40) == (4, 1)
    ms.save_checkpoint(nn.Dense(3, 3), str(tmp_path / "state.prev.ckpt"))  # another model's file
    assert ms_accum.load_training_state(make_trainer(seed=2)[0].cell, state, total_micro_batches=40) == (4, 1)


def test_ranks_resume_from_the_newest_position_all_of_them_saved():
    from ms_accum.trainers.state import common_position
    assert common_position([[8, 4], [8, 4]]) == 8
    assert common_position([[12, 8], [8, 4]]) == 8  # rank 1 died before its write at 12
    assert common_position([[4, 20], [4, 20]]) == 4  # newest written first: a run restarted afresh, then an older one
    with pytest.raises(ms_accum.CheckpointError, match=r"the ranks must resume from the same position, but no "
                                                       r"position is saved by every rank \(rank 0: \[12, 8\]; "
                                                       r"rank 1: \[4\]\)"):
        common_position([[12, 8], [4]])


def test_a_state_file_belongs_to_its_rank_and_device_count(tmp_path):
    trainer, _ = make_trainer(seed=1)
    state = str(tmp_path / "state.ckpt")
    ms_accum.save_training_state(trainer.cell, state, 5, 1, rank=1, world=2)
    with pytest.raises(ms_accum.CheckpointError, match=r"is rank 1's state, but this is rank 0: every rank resumes "
                                                       r"from its own file"):
        ms_accum.load_training_state(trainer.cell, state, 100, rank=0, world=2)
    with pytest.raises(ms_accum.CheckpointError, match=r"was written by a run on 2 process\(es\), but this run has "
                                                       r"1"):
        ms_accum.load_training_state(trainer.cell, state, 100)


def test_data_parallel_state_is_written_at_update_boundaries_only(tmp_path):
    from ms_accum.trainers.state import StateWriter
    trainer, _ = make_trainer(seed=1)
    writer = StateWriter(trainer.cell, str(tmp_path / "s.ckpt"), every=3, total_micro_batches=40, start=0,
                         rank=0, world=2)
    written = [m for m in range(1, 40) if writer.after(m, m // 4, at_update_boundary=m % 4 == 0)]
    assert written == [4, 8, 12, 16, 20, 24, 28, 32, 36]  # every update boundary once 3 more have passed
    writer = StateWriter(trainer.cell, str(tmp_path / "s.ckpt"), every=6, total_micro_batches=40, start=0,
                         rank=0, world=2)
    # the first update boundary at or after each multiple of 6: 6 -> 8, 12, 18 -> 20, 24, 30 -> 32, 36
    assert [m for m in range(1, 40) if writer.after(m, m // 4, at_update_boundary=m % 4 == 0)] == [8, 12, 20, 24, 32,
                                                                                                   36]


@pytest.mark.parametrize("name", ["driver_schedule_format4.ckpt", "driver_adaptive_format4.ckpt"])
def test_a_driver_state_of_format_4_resumes_exactly(name, tmp_path):
    """Format 4 (before the driver drove one engine cell) kept the driver's N in 'ms_accum_window_steps' and its
    window count on the host. Its files (tests/data, written by that release inside a window of a schedule, and by an
    adaptive run after the policy chose N = 4) resume where an uninterrupted run of this release ends."""
    spec = importlib.util.spec_from_file_location("driver_states", os.path.join(ROOT, "tests", "data",
                                                                              "make_driver_states_format4.py"))
    made = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(made)
    built, run = made.RUNS[name]
    data, trainer = made.data, made.trainer
    net, fresh = trainer(**built)
    fresh.train_process(2, data(), ckpt_path=None, log_every=0, **run)
    expected = params_of(net)
    state = str(tmp_path / "state.ckpt")
    saved = ms.load_checkpoint(os.path.join(ROOT, "tests", "data", name))
    assert int(saved["ms_accum_state_format"].asnumpy()) == 4 and "ms_accum_window_steps" in saved
    assert "grad_sum.windows" not in saved and "grad_sum.steps" not in saved
    ms.save_checkpoint([{"name": key, "data": value} for key, value in saved.items()], state)
    net, resumed = trainer(**built)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        resumed.train_process(2, data(), ckpt_path=None, log_every=0, resume_from=state, **run)
    assert "resuming" in printed.getvalue() and "14 in all" in printed.getvalue(), printed.getvalue()
    for key, want in expected.items():
        np.testing.assert_allclose(params_of(net)[key], want, rtol=1e-6, atol=1e-7, err_msg=f"{name}: {key}")


def test_a_state_of_ms_accum_0_2_0_resumes_inside_its_window():
    """ms_accum 0.2.0 wrote state format 2, before the skip records (format 3). Its file (tests/data, a
    TrainAccuStepsCell of N = 2 after its first micro-batch) loads, the skip records starting from nothing, and the
    window it holds ends as the large batch's step: SGD on both micro-batches' 8 samples, computed here with
    MindSpore's own value_and_grad from the weights the file holds."""
    spec = importlib.util.spec_from_file_location("cell_state", os.path.join(ROOT, "tests", "data",
                                                                           "make_cell_state_format2.py"))
    made = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(made)
    path = os.path.join(ROOT, "tests", "data", "cell_format2.ckpt")
    saved = ms.load_checkpoint(path)
    assert int(saved["ms_accum_state_format"].asnumpy()) == 2 and "accu_window.skip_history" not in saved
    net = nn.Dense(4, 2)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                       gradient_accumulation_steps=2)
    with contextlib.redirect_stdout(io.StringIO()):
        assert ms_accum.load_training_state(cell, path, total_micro_batches=10) == (1, 1)
    assert int(cell.accu_skipped_windows.asnumpy()) == 0
    x, y = made.data()
    cell.set_train(True)
    before = params_of(net)
    cell(ms.Tensor(x[4:]), ms.Tensor(y[4:]))
    reference = nn.Dense(4, 2)
    ms.load_param_into_net(reference, {key: ms.Parameter(ms.Tensor(saved[key].asnumpy()), name=key)
                                       for key in ("weight", "bias")})
    grads = ms.value_and_grad(nn.WithLossCell(reference, nn.MSELoss()), None, reference.trainable_params())(
        ms.Tensor(x), ms.Tensor(y))[1]
    for (key, value), grad in zip(sorted(before.items()), [grads[1], grads[0]]):
        assert key in ("bias", "weight")
        np.testing.assert_allclose(params_of(net)[key] - value, -0.1 * grad.asnumpy(), rtol=1e-5, atol=1e-7,
                                   err_msg=key)


def test_the_older_names_of_the_state_functions_arguments_warn_of_their_removal(tmp_path):
    """micro_steps_done and total_micro_steps, the names before 0.4.0, still work, with a DeprecationWarning that
    names the release removing them; both names at once are refused."""
    net = nn.Dense(4, 2)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
    path = str(tmp_path / "state.ckpt")
    with pytest.warns(DeprecationWarning, match=r"'micro_steps_done' is renamed 'micro_batches_done'; the old name "
                                                r"goes in the next release, ms_accum 0\.5\.0"):
        ms_accum.save_training_state(cell, path, micro_steps_done=3, updates_done=1)
    with pytest.warns(DeprecationWarning, match=r"'total_micro_steps' is renamed 'total_micro_batches'"), \
            contextlib.redirect_stdout(io.StringIO()):
        assert ms_accum.load_training_state(cell, path, total_micro_steps=9) == (3, 1)
    with pytest.raises(TypeError, match=r"For 'save_training_state', pass 'micro_batches_done' only, but got both"):
        ms_accum.save_training_state(cell, path, 3, 1, micro_steps_done=3)
