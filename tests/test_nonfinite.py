"""A bad batch: a window whose gradient holds a NaN or an inf is skipped on every path, reported, and limited.

Without a loss scale, a NaN in one micro-batch's input poisons its window: the window must be skipped with
parameters and optimizer state exactly as they were (so the learning-rate step does not advance either), every
other window must still equal value_and_grad's large batch on its own micro-batches, the trainers must warn
naming the window and its micro-batches' positions, and stop on `nonfinite="raise"` or after
`max_nonfinite_windows` skipped in a row with the last good state on disk.
"""
import os
import re
import warnings

import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn

import ms_accum
import paths
from helpers import assert_equals_large_batch, build, computed_once, micro_batches, numpy_dataset, params_of
from test_model_accu import fake_device  # noqa: F401  (the sink tests' device seams)

N = 3


def poisoned(sizes, bad, seed=11):
    """Micro-batches of `sizes` with a NaN in the inputs of each micro-batch in `bad`."""
    batches = [(x.copy(), y) for x, y in micro_batches(sizes, seed=seed)]
    for index in bad:
        batches[index][0][0, 0, 0, 0] = np.nan
    return batches


@computed_once
def reference(windows):
    """Momentum stepped once per clean window on its concatenated micro-batches (no ms_accum code)."""
    net, loss, opt = build("momentum")

    def forward(x, y):
        return loss(net(x), y)
    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    for window in windows:
        _, grads = grad_fn(Tensor(np.concatenate([x for x, _ in window])),
                           Tensor(np.concatenate([y for _, y in window])))
        opt(grads)
    return params_of(net), int(opt.global_step.asnumpy()[0])


def large_batch(windows):
    """The parameters after :func:`reference`."""
    return reference(windows)[0]


def saved_params(saved):
    """The network's parameters in a loaded state file."""
    return {name: saved[name].asnumpy() for name in large_batch([])}


PATHS = {"cells": "three_cells", "parallel": "accu_steps", "accumulator": "accumulator", "driver": "driver",
         "model_accu": "model_accu", "model_accu_sink": "model_accu_sink"}  # this file's names: tests/paths.py's


def run_path(path, batches, nonfinite="skip", parts=None):
    """Train `batches` in windows of N through `path` (on `parts`, a (net, loss, optimizer), or new ones), the
    trainers' warnings of skipped windows silenced; returns (net, optimizer, the engine's cell)."""
    net, loss, opt = parts or build("momentum")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ms_accum.NonFiniteWindowWarning)
        trained = paths.train(PATHS[path], nn.WithLossCell(net, loss), opt, batches, N, nonfinite=nonfinite)
    return net, opt, trained.engine


@pytest.mark.parametrize("path", ["cells", "parallel", "accumulator", "driver", "model_accu"])
def test_a_nan_micro_batch_skips_its_window_only_on_every_path(path, exec_mode):
    """Windows of 3 over 12 micro-batches, a NaN in micro-batch 4 (window 2): windows 1, 3 and 4 are applied, each
    equal to its large batch; window 2 leaves parameters and the optimizer's step as they were."""
    batches = poisoned((4, 3, 4, 4, 2, 4, 3, 4, 4, 2, 4, 3), bad=[4])
    net, opt, cell = run_path(path, batches)
    assert_equals_large_batch(params_of(net), large_batch, [batches[0:3], batches[6:9], batches[9:12]],
                              context=f"{path}, {exec_mode}")
    assert int(opt.global_step.asnumpy()[0]) == 3, "the skipped window advanced the optimizer's step"
    assert float(cell.accu_skipped_windows.asnumpy()) == 1.0 and float(cell.accu_nonfinite_streak.asnumpy()) == 0.0
    if path == "accumulator":
        assert not bool(cell.last_overflow.asnumpy())  # the last window was applied


def test_the_accumulator_says_its_window_was_skipped():
    batches = poisoned((4,) * 3, bad=[1])
    net, loss, opt = build("momentum")
    accumulator = ms_accum.Accumulator(opt, N)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
    done = [bool(accumulator(grad_fn(Tensor(x), Tensor(y))[1], x.shape[0]).asnumpy()) for x, y in batches]
    assert done == [False, False, True] and bool(accumulator.last_overflow.asnumpy())


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_a_trainers_warning_points_at_the_users_call(trainer):
    """The skipped window's warning arises deep in ms_accum (the driver's loop; for Model_ACCU, a callback that
    MindSpore's Model.train calls): it is attributed to the user's line that called the trainer (tests/paths.py
    here), not to ms_accum's or MindSpore's code."""
    batches = poisoned((4,) * 6, bad=[1])
    net, loss, opt = build("momentum")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths.train(PATHS[trainer], nn.WithLossCell(net, loss), opt, batches, N)
    [skipped] = [w for w in caught if w.category is ms_accum.NonFiniteWindowWarning]
    assert os.path.abspath(skipped.filename) == os.path.abspath(paths.__file__), (skipped.filename, skipped.lineno)


def test_sink_mode_skips_a_nan_window_too(fake_device):  # noqa: F811
    batches = poisoned((4, 3, 4, 4, 2, 4, 3, 4, 4, 2, 4, 3), bad=[4])
    net, opt, cell = run_path("model_accu_sink", batches)
    assert fake_device.events, "the sink branch was not taken"
    assert_equals_large_batch(params_of(net), large_batch, [batches[0:3], batches[6:9], batches[9:12]],
                              context="sink")
    assert float(cell.accu_skipped_windows.asnumpy()) == 1.0


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_the_warning_names_the_window_and_its_micro_batches_and_telemetry_counts_it(trainer, tmp_path):
    batches = poisoned((4,) * 9, bad=[4])  # windows of 3: the second holds micro-batches 3, 4, 5
    net, loss, opt = build("momentum")
    telemetry = ms_accum.WindowTelemetry()
    with pytest.warns(ms_accum.NonFiniteWindowWarning) as caught:
        if trainer == "driver":
            ms_accum.GradientAccumulation(net, loss, opt).train_process(
                1, numpy_dataset(batches), N, callbacks=[telemetry], ckpt_path=None, log_every=0)
        else:
            cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=N)
            ms_accum.Model_ACCU(cell).train(1, numpy_dataset(batches), callbacks=[telemetry])
    [warning] = caught.list
    message = str(warning.message)
    assert "window 2 had a non-finite gradient (a NaN or an inf) and was skipped" in message, message
    assert "positions 3 to 5 of epoch 1" in message and "1 window(s) skipped in a row" in message, message
    assert [r.overflow for r in telemetry.records] == [False, True, False] and telemetry.skipped == 1


def train_until_stopped(trainer, batches, state, max_windows):
    """Train `batches` in windows of N with `max_nonfinite_windows`; returns (the error's message, the
    non-finite warnings' messages)."""
    net, loss, opt = build("momentum")
    with pytest.raises(ms_accum.NonFiniteWindowError) as stopped, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ms_accum.NonFiniteWindowWarning)
        if trainer == "driver":
            ms_accum.GradientAccumulation(net, loss, opt).train_process(
                1, numpy_dataset(batches), N, ckpt_path=None, log_every=0, state_path=state, save_state_every=100,
                max_nonfinite_windows=max_windows)
        else:
            cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=N)
            ms_accum.Model_ACCU(cell, state_path=state, save_state_every=100).train(
                1, numpy_dataset(batches), max_nonfinite_windows=max_windows)
    return str(stopped.value), [str(w.message) for w in caught if w.category is ms_accum.NonFiniteWindowWarning]


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_a_nan_loss_with_a_finite_gradient_is_applied_and_warned_of(trainer):
    """A NaN target under L1Loss: its sample's gradient is zero, so the window's gradient is finite and the window
    is applied (the gradient decides a skip); the trainers warn, naming the window, as its loss is NaN."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(24, 5)).astype(np.float32), rng.normal(size=(24, 1)).astype(np.float32)
    y[13, 0] = np.nan  # micro-batch 3 of 4 samples: window 2 of windows of N = 3
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)
    net = nn.Dense(5, 1)
    opt = nn.SGD(net.trainable_params(), 0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ms_accum.NonFiniteWindowWarning)
        if trainer == "driver":
            ms_accum.GradientAccumulation(net, nn.L1Loss(), opt).train_process(1, data, N, ckpt_path=None,
                                                                              log_every=0)
        else:
            cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.L1Loss()), opt, gradient_accumulation_steps=N)
            ms_accum.Model_ACCU(cell).train(1, data, dataset_sink_mode=False)
    [warning] = [str(w.message) for w in caught if w.category is ms_accum.NonFiniteWindowWarning]
    assert "window 2's loss is nan but its gradient is finite, so the window was applied" in warning, warning
    assert "positions 3 to 5 of epoch 1" in warning, warning
    assert int(opt.global_step.asnumpy()[0]) == 2
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_windows_skipped_in_a_row_stop_the_run_with_the_last_good_state_on_disk(trainer, tmp_path):
    """max_nonfinite_windows=2: windows 2 and 3 skipped in a row stop the run. The trainer reads the skips every
    min(16, max_nonfinite_windows) windows (a read waits for the device), so it learns of window 3 after window 4;
    the state written then holds windows 1 and 4 applied, 2 and 3 not."""
    batches = poisoned((4,) * 12, bad=[3, 7])
    state = str(tmp_path / "state.ckpt")
    message, _ = train_until_stopped(trainer, batches, state, 2)
    assert "window 3 had a non-finite gradient" in message and "positions 6 to 8 of epoch 1" in message, message
    assert "max_nonfinite_windows=2 reached" in message and repr(state) in message, message
    assert "The state as of window 4, the last one run (parameters of the last good window)" in message, message
    assert "pass a larger max_nonfinite_windows." in message and "nonfinite='skip'" not in message, message
    saved = ms.load_checkpoint(state)
    assert_equals_large_batch(saved_params(saved), large_batch, [batches[0:3], batches[9:12]], context="state file")
    assert int(saved["ms_accum_micro_steps_done"].asnumpy()) == 12


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_a_skipped_window_read_with_the_one_that_stops_the_run_is_named(trainer, tmp_path):
    """Windows 2, 3 and 4 skipped, max_nonfinite_windows=2: the skips are read after windows 2 and 4, so window 3
    stops the run and window 4, run before that read, is named in the error (it was left out before)."""
    batches = poisoned((4,) * 12, bad=[3, 7, 10])
    state = str(tmp_path / "state.ckpt")
    message, warned = train_until_stopped(trainer, batches, state, 2)
    assert len(warned) == 1 and "window 2 had a non-finite gradient" in warned[0], warned
    assert "window 3 had a non-finite gradient" in message and "2 window(s) skipped in a row" in message, message
    assert "also skipped: window 4 (positions 9 to 11 of epoch 1)" in message, message
    assert "The state as of window 4, the last one run" in message, message
    saved = ms.load_checkpoint(state)
    assert_equals_large_batch(saved_params(saved), large_batch, [batches[0:3]], context="state file")
    assert int(saved["ms_accum_micro_steps_done"].asnumpy()) == 12


def test_with_raise_the_state_is_as_of_the_bad_window(tmp_path):
    """nonfinite='raise' reads every window, so the state written at the stop is as of the bad window itself."""
    batches = poisoned((4,) * 6, bad=[4])
    net, loss, opt = build("momentum")
    state = str(tmp_path / "state.ckpt")
    with pytest.raises(ms_accum.NonFiniteWindowError, match=r"window 2 had .*\(nonfinite='raise'\)\. The state as "
                                                           r"of this window \(parameters of the last good window\) "
                                                           r"is in .* or pass nonfinite='skip' to skip such windows"):
        ms_accum.GradientAccumulation(net, loss, opt, nonfinite="raise").train_process(
            1, numpy_dataset(batches), N, ckpt_path=None, log_every=0, state_path=state, save_state_every=100)
    assert int(ms.load_checkpoint(state)["ms_accum_micro_steps_done"].asnumpy()) == 6


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_nonfinite_raise_stops_at_the_first_bad_window(trainer):
    batches = poisoned((4,) * 6, bad=[4])
    net, loss, opt = build("momentum")
    before = params_of(net)
    with pytest.raises(ms_accum.NonFiniteWindowError, match=r"window 2 had a non-finite gradient .* positions 3 to "
                                                           r"5 of epoch 1 .*\(nonfinite='raise'\)\. No state_path"):
        if trainer == "driver":
            ms_accum.GradientAccumulation(net, loss, opt, nonfinite="raise").train_process(
                1, numpy_dataset(batches), N, ckpt_path=None, log_every=0)
        else:
            cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=N,
                                               nonfinite="raise")
            ms_accum.Model_ACCU(cell).train(1, numpy_dataset(batches))
    after = params_of(net)
    assert any(not np.array_equal(after[name], before[name]) for name in before), "window 1 was not applied"
    assert int(opt.global_step.asnumpy()[0]) == 1


OWNERS = {"cells": "TrainOptim", "parallel": "TrainAccuStepsCell", "accumulator": "Accumulator"}


def raise_at_the_third_window(path, error, match, exec_mode):
    """nonfinite="raise" on a cell: two clean windows are applied as their large batches, then a NaN in the
    third raises `error` from its window's end, before the optimizer: the weights and the optimizer's step stay
    those of the two windows."""
    batches = poisoned((4,) * 9, bad=[7])
    net, loss, opt = build("momentum")
    with pytest.raises(error, match=match):
        run_path(path, batches, nonfinite="raise", parts=(net, loss, opt))
    assert_equals_large_batch(params_of(net), large_batch, [batches[0:3], batches[3:6]], context=f"{path}, {exec_mode}")
    assert int(opt.global_step.asnumpy()[0]) == 2


@pytest.mark.parametrize("path", sorted(OWNERS))
def test_a_cell_with_nonfinite_raise_applies_clean_windows_and_refuses_the_bad_one(path, exec_mode):
    """Raised from the skip's runtime branch (a raise there that tested no run-time value would be raised by
    MindSpore while compiling, at the first window)."""
    raise_at_the_third_window(path, ValueError, rf"For '{OWNERS[path]}', the window's gradient must be finite, but "
                                                r"it holds a NaN or an inf \(nonfinite='raise'\)\. The window was "
                                                r"not applied", exec_mode)


@pytest.mark.parametrize("path", sorted(OWNERS))
@pytest.mark.filterwarnings("ignore:For 'Accumulator', MindSpore's compile cache is on")  # test_functional's
def test_with_the_compile_cache_nonfinite_raise_stops_before_the_update(path, monkeypatch, exec_mode):
    """With MindSpore's compile cache on, a check inside the graph is MindSpore's Assert (a raise cannot be cached);
    the parallel cells raise from Python after their window-end graph, so their message stays theirs."""
    monkeypatch.setattr(ms_accum.core.engine, "compile_cache_on", lambda: True)
    if path == "parallel":
        raise_at_the_third_window(path, ValueError, r"For 'TrainAccuStepsCell', the window's gradient must be finite",
                                  exec_mode)
    else:
        raise_at_the_third_window(path, RuntimeError, "assert failed", exec_mode)


def test_a_parallel_cell_that_raised_skipped_the_window_and_goes_on(exec_mode):
    """TrainAccuStepsCell(nonfinite="raise") skips the bad window in its graph, then raises: the window cleared and
    counted as skipped, the cell goes on, and its later windows equal their large batches. Model_ACCU leaves the
    cell's setting as it was built (it raises its own error, naming the micro-batches, from the same skip)."""
    batches = poisoned((4,) * 9, bad=[4])
    net, loss, opt = build("momentum")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=N,
                                       nonfinite="raise")
    with pytest.raises(ms_accum.NonFiniteWindowError, match=r"window 2 had a non-finite gradient"):
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(batches[:6]))
    assert cell.nonfinite == "raise"
    with pytest.raises(ValueError, match=r"For 'TrainAccuStepsCell', the window's gradient must be finite, but it "
                                         r"holds a NaN or an inf \(nonfinite='raise'\)\. The window was not applied: "
                                         r"it was skipped and its buffers cleared, so the cell can go on\."):
        for x, y in batches[3:6]:
            cell(Tensor(x), Tensor(y))
    assert int(cell.accu_micro_steps.asnumpy()) == 0 and not any(g.asnumpy().any() for g in cell.accu_grads)
    assert float(cell.accu_skipped_windows.asnumpy()) == 2.0
    for x, y in batches[6:]:
        cell(Tensor(x), Tensor(y))
    assert_equals_large_batch(params_of(net), large_batch, [batches[0:3], batches[6:9]], context=exec_mode)
    assert int(opt.global_step.asnumpy()[0]) == 2


def test_the_arguments_are_checked():
    net, loss, opt = build("momentum")
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation', 'nonfinite' must be one of \['skip', 'raise', "
                                         r"'apply'\], but got 'ignore'"):
        ms_accum.GradientAccumulation(net, loss, opt, nonfinite="ignore")
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation.train_process', 'max_nonfinite_windows' must be "
                                         r"an int >= 1, but got 0"):
        ms_accum.GradientAccumulation(net, loss, opt).train_process(1, numpy_dataset(micro_batches((4,) * 3)), N,
                                                                    ckpt_path=None, max_nonfinite_windows=0)
    with pytest.raises(ValueError, match=r"For 'TrainAccuStepsCell', 'nonfinite' must be one of"):
        ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, nonfinite="ignore")


@pytest.mark.parametrize("nonfinite", ["raise", "apply"])
@pytest.mark.parametrize("owner", ["GradientAccumulation", "TrainOptim", "Accumulator",
                                   "TrainAccuStepsWithLossScaleCell"])
def test_with_a_loss_scale_only_skip_is_taken(owner, nonfinite):
    """Under a loss scale its overflow skip decides what a non-finite window does: "raise" or "apply" would be
    ignored in silence (a user's nonfinite="raise" trained on past a NaN window), so they are refused when built."""
    net, loss, opt = build("momentum")
    scale = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0 ** 10, scale_factor=2, scale_window=50)
    build_it = {
        "GradientAccumulation": lambda: ms_accum.GradientAccumulation(net, loss, opt, scale_sense=scale,
                                                                      nonfinite=nonfinite),
        "TrainOptim": lambda: ms_accum.TrainOptim(opt, opt.parameters.clone(prefix="grad_sum", init="zeros"),
                                                  scale_sense=scale, nonfinite=nonfinite),
        "Accumulator": lambda: ms_accum.Accumulator(opt, 2, loss_scaler=ms.amp.DynamicLossScaler(2.0 ** 10, 2, 50),
                                                    nonfinite=nonfinite),
        "TrainAccuStepsWithLossScaleCell": lambda: ms_accum.TrainAccuStepsWithLossScaleCell(
            nn.WithLossCell(net, loss), opt, scale, gradient_accumulation_steps=2, nonfinite=nonfinite),
    }[owner]
    with pytest.raises(ValueError, match=rf"For '{owner}', 'nonfinite' must be 'skip' with a loss scale, whose "
                                         rf"overflow skip decides .* but got '{nonfinite}'\. Drop 'nonfinite' or the "
                                         rf"loss scale; to stop a run whose windows keep overflowing, lower "
                                         rf"'max_nonfinite_windows'"):
        build_it()


@pytest.mark.parametrize("path", ["cells", "parallel", "accumulator", "driver"])
def test_nonfinite_apply_checks_nothing_as_train_one_step_cell(path, exec_mode):
    """nonfinite='apply' (the comparison point of benchmarks/nonfinite_cost.py): the NaN reaches the weights."""
    batches = poisoned((4,) * 3, bad=[1])
    net, _, cell = run_path(path, batches, nonfinite="apply")
    assert float(cell.accu_skipped_windows.asnumpy()) == 0.0
    assert any(np.isnan(value).any() for value in params_of(net).values())


def test_positions_name_both_epochs_of_a_window_across_an_epoch_end():
    from ms_accum.trainers.nonfinite import micro_batch_positions
    assert micro_batch_positions(8, 4, 10) == "positions 8 to 9 of epoch 1 and positions 0 to 1 of epoch 2"
    assert micro_batch_positions(3, 1, 10) == "position 3 of epoch 1"
    assert re.fullmatch(r"positions 0 to 2 of epoch 3", micro_batch_positions(20, 3, 10))


@pytest.mark.parametrize("clip_norm", [None, 1.0])
def test_a_loss_scale_too_large_for_the_norm_skips_the_window_and_drops(clip_norm):
    """A float32 network at a loss scale of 2^70: every micro-batch's gradient is finite, but the window's squared
    sums are not (the norm is taken of the scaled sums), so there is no norm to clip by or to record. The window is
    an overflow: skipped, parameters unchanged, the scale halved, until a window's norm is finite again; from there
    the windows apply (before, each was applied with a clip factor of 0, or at 2^126 with a NaN norm)."""
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(8, 6)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32))
               for _ in range(2 * 12)]
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(6, 16), nn.Tanh(), nn.Dense(16, 1))
    before = params_of(net)
    telemetry = ms_accum.WindowTelemetry()
    trainer = ms_accum.GradientAccumulation(
        net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05), clip_norm=clip_norm,
        scale_sense=nn.DynamicLossScaleUpdateCell(2.0 ** 70, 2, 1000))
    trainer.train_process(1, numpy_dataset(batches), 2, callbacks=[telemetry], ckpt_path=None, log_every=0)
    skipped = [r.overflow for r in telemetry.records]
    assert skipped[0] and not skipped[-1], skipped
    first_applied = skipped.index(False)
    assert skipped == [True] * first_applied + [False] * (len(skipped) - first_applied), skipped
    assert all(not np.isfinite(r.grad_norm) for r in telemetry.records[:first_applied])
    assert all(np.isfinite(r.grad_norm) and r.grad_norm > 0 for r in telemetry.records[first_applied:])
    assert telemetry.records[first_applied].loss_scale < 2.0 ** 65, telemetry.records[first_applied].loss_scale
    assert any(np.abs(params_of(net)[name] - value).max() > 0 for name, value in before.items())
