"""WindowTelemetry: per-update figures from the driver and Model_ACCU, the CSV, progress lines and the plot."""
import csv
import os
import re
import types

import numpy as np
import pytest

from mindspore import Tensor, nn, ops
from mindspore.train import Callback

import ms_accum
from ms_accum.trainers import telemetry as telemetry_module
from helpers import StopAt, build, concat, micro_batches, numpy_dataset, open_files, run_script
from test_model_accu import fake_device  # noqa: F401  (the sink tests' device seams)


def window_grad_norm(window, seed=0):
    """Global norm of the large-batch gradient of `window`, from the initial parameters."""
    net, loss, _ = build("sgd", seed)
    loss_net = nn.WithLossCell(net, loss)
    grads = ops.GradOperation(get_by_list=True)(loss_net, loss_net.trainable_params())(*map(Tensor, concat(window)))
    return float(np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads)))


def test_driver_records_every_window(tmp_path, exec_mode, capsys):
    batches = micro_batches([4, 4, 4, 3])
    net, loss, _ = build("sgd")
    trainer = ms_accum.GradientAccumulation(net, loss, nn.SGD(net.trainable_params(), [0.1, 0.05, 0.025, 0.0125]))
    telemetry = ms_accum.WindowTelemetry(csv_path=str(tmp_path / "t" / "telemetry.csv"), print_every=2)
    losses = trainer.train_process(2, numpy_dataset(batches), 2, callbacks=telemetry, ckpt_path=None, log_every=0)
    records = telemetry.records
    assert [(r.epoch, r.update, r.micro_batches, r.items) for r in records] == [
        (1, 1, 2, 8), (1, 2, 2, 7), (2, 3, 2, 8), (2, 4, 2, 7)]
    assert [r.loss for r in records] == pytest.approx(losses, rel=1e-6)
    assert [r.learning_rate for r in records] == pytest.approx([0.1, 0.05, 0.025, 0.0125])
    assert records[0].grad_norm == pytest.approx(window_grad_norm(batches[:2]), rel=1e-5)
    assert all(not r.overflow and r.loss_scale == 1.0 for r in records)
    with open(tmp_path / "t" / "telemetry.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ms_accum.WindowTelemetry.COLUMNS and len(rows) == 5
    assert [float(rows[i][rows[0].index("items")]) for i in range(1, 5)] == [8, 7, 8, 7]
    assert str(tmp_path / "t" / "telemetry.csv") not in open_files(), "the CSV is still open after training"
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("update ")]
    assert [line.split(" loss")[0] for line in printed] == ["update 2/4 (epoch 1/2)", "update 4/4 (epoch 2/2)"]
    assert "window: 2 micro-batches, 7 items" in printed[1] and "0 s left" in printed[1]
    assert all(re.search(r"\| [0-9]+ items/s, [0-9]+ s left$", line) for line in printed), printed


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_the_csv_is_closed_with_its_rows_when_training_raises(trainer, tmp_path):
    """A run that raises at update 2 leaves the CSV closed (the file held open until collected before) with the rows
    of the updates done: on_train_end is not called then, but MindSpore's callback manager exits each callback."""
    net, loss, opt = build("momentum")
    path = str(tmp_path / "telemetry.csv")
    telemetry = ms_accum.WindowTelemetry(csv_path=path, print_every=0)
    callbacks = [telemetry, StopAt(2, RuntimeError("a failure at update 2"))]
    data = numpy_dataset(micro_batches([4] * 8))
    with pytest.raises(RuntimeError, match="a failure at update 2"):
        if trainer == "driver":
            ms_accum.GradientAccumulation(net, loss, opt).train_process(1, data, 2, callbacks=callbacks,
                                                                       ckpt_path=None, log_every=0)
        else:
            cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, accumulation_steps=2)
            ms_accum.Model_ACCU(cell).train(1, data, callbacks=callbacks, dataset_sink_mode=False)
    assert os.path.realpath(path) not in open_files()
    with open(path, encoding="utf-8") as f:
        assert [int(row["update"]) for row in csv.DictReader(f)] == [1, 2]


def test_a_resumed_run_keeps_the_rows_of_the_updates_before_it(tmp_path):
    """A new user's trial: a run killed at update 69 and resumed with the same --telemetry_csv left rows 69-94 only,
    elapsed_s from zero again. The resumed run keeps the rows of the updates before its first (those of the update
    it trains again replaced), and its skipped and elapsed_s go on from them; a file that is no telemetry CSV is
    replaced."""
    path, state = str(tmp_path / "telemetry.csv"), str(tmp_path / "state.ckpt")
    data = numpy_dataset(micro_batches([4] * 8))

    def run(stop=None, resume=False):
        net, loss, opt = build("momentum")
        callbacks = [ms_accum.WindowTelemetry(csv_path=path)] + ([StopAt(stop, RuntimeError("killed"))] if stop else [])
        ms_accum.GradientAccumulation(net, loss, opt).train_process(
            1, data, 2, callbacks=callbacks, ckpt_path=None, log_every=0, state_path=state, save_state_every=2,
            resume_from=state if resume else None)

    def rows():
        with open(path, encoding="utf-8") as f:
            return list(csv.DictReader(f))

    with pytest.raises(RuntimeError, match="killed"):
        run(stop=3)  # the state holds updates 1-2; the CSV has a row for update 3 too
    first = rows()
    assert [int(row["update"]) for row in first] == [1, 2, 3]
    run(resume=True)
    resumed = rows()
    assert [int(row["update"]) for row in resumed] == [1, 2, 3, 4]
    assert resumed[:2] == first[:2], "the rows before the resumed run's first update are kept as written"
    assert float(resumed[2]["elapsed_s"]) >= float(resumed[1]["elapsed_s"]), "elapsed_s starts again from zero"
    with open(path, "w", encoding="utf-8") as f:
        f.write("update,note\n1,another file\n")
    run()
    assert [int(row["update"]) for row in rows()] == [1, 2, 3, 4] and "note" not in rows()[0]


def test_the_pace_leaves_out_the_first_update(capsys):
    """The first update compiles: its line gives its time, and the throughput and time left start after it."""
    net, loss, optimizer = build("sgd")
    trainer = ms_accum.GradientAccumulation(net, loss, optimizer)
    telemetry = ms_accum.WindowTelemetry(print_every=1)
    trainer.train_process(1, numpy_dataset(micro_batches([4] * 6)), 2, callbacks=telemetry, ckpt_path=None,
                          log_every=0)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("update ")]
    assert [line.split(" loss")[0] for line in printed] == [f"update {u}/3 (epoch 1/1)" for u in (1, 2, 3)]
    assert re.search(r"\| first update after [0-9.]+ s \(compiling included\)$", printed[0]), printed[0]
    assert all(re.search(r"\| [0-9]+ items/s, [0-9]+ s left$", line) for line in printed[1:]), printed


def test_the_time_left_is_one_estimate_read_by_the_lines_and_by_seconds_left(monkeypatch, capsys):
    """The progress lines and seconds_left() give one estimate (train.py's epoch line reads it, so that the two
    agree; they differed by several seconds for a new user): the time since the end of the first update over the
    micro-batches run since, times those still to run; None at the first update, whose graphs compile. A clock
    of the test's own: updates end at 10, 12 and 14 s, of 2 micro-batches each out of 6."""
    clock = iter([0.0, 10.0, 12.0, 14.0])
    monkeypatch.setattr(telemetry_module, "time", types.SimpleNamespace(time=lambda: next(clock)))
    net, loss, optimizer = build("sgd")
    telemetry = ms_accum.WindowTelemetry(print_every=1)
    seen = []

    class ReadTheTimeLeft(Callback):
        def on_train_step_end(self, run_context):
            seen.append(telemetry.seconds_left())

    ms_accum.GradientAccumulation(net, loss, optimizer).train_process(
        1, numpy_dataset(micro_batches([4] * 6)), 2, callbacks=[telemetry, ReadTheTimeLeft()], ckpt_path=None,
        log_every=0)
    assert seen == [None, pytest.approx(2.0), pytest.approx(0.0)]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("update ")]
    assert [line.rsplit(", ", 1)[-1] for line in printed[1:]] == ["2 s left", "0 s left"], printed


def test_a_window_of_one_micro_batch_reads_as_one(capsys):
    net, loss, optimizer = build("sgd")
    ms_accum.GradientAccumulation(net, loss, optimizer).train_process(
        1, numpy_dataset(micro_batches([4, 3])), 1, callbacks=ms_accum.WindowTelemetry(print_every=1),
        ckpt_path=None, log_every=0)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("update ")]
    assert "window: 1 micro-batch, 4 items |" in printed[0], printed
    assert "window: 1 micro-batch, 3 items |" in printed[1], printed


def test_a_flushed_partial_window_says_so(capsys):
    """Its line read like any window (a new user saw 'window: 4 micro-batches' under N = 12)."""
    net, loss, optimizer = build("sgd")
    ms_accum.GradientAccumulation(net, loss, optimizer).train_process(
        1, numpy_dataset(micro_batches([4] * 5)), 2, callbacks=ms_accum.WindowTelemetry(print_every=1),
        ckpt_path=None, log_every=0)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("update ")]
    assert ["window: 2 micro-batches, 8 items |" in line for line in printed] == [True, True, False], printed
    assert "window: 1 micro-batch of 2 (partial), 4 items |" in printed[2], printed


@pytest.mark.parametrize("sink", [False, True], ids=["no_sink", "sink"])
def test_model_accu_prints_progress(sink, capsys, fake_device):  # noqa: F811
    """Progress lines with Model_ACCU (they failed on the run's total), in sink mode too (through its seam)."""
    net, loss, opt = build("momentum")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, accumulation_steps=3)
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches([4] * 12)),
                                    callbacks=[ms_accum.WindowTelemetry(print_every=1)], dataset_sink_mode=sink)
    assert bool(fake_device.events) == sink
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("update ")]
    assert [line.split(" loss")[0] for line in printed] == [f"update {u}/4 (epoch 1/1)" for u in (1, 2, 3, 4)]
    assert all("window: 3 micro-batches, 12 items |" in line for line in printed), printed


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_under_an_adaptive_n_progress_lines_give_no_invented_total(trainer, capsys):
    """An adaptive N decides the run's updates as it goes: the lines count updates without a total (it printed the
    count at the first N, 'update 16/40' on a run of 16 updates), and the last line has nothing left to run."""
    net, loss, optimizer = build("momentum")
    policy = ms_accum.AdaptiveAccumulation(min_steps=2, max_steps=4, interval=2)
    telemetry = ms_accum.WindowTelemetry(print_every=1)
    data = numpy_dataset(micro_batches([4] * 24))
    if trainer == "driver":
        ms_accum.GradientAccumulation(net, loss, optimizer, noise_scale=True).train_process(
            1, data, policy, callbacks=[telemetry], ckpt_path=None, log_every=0)
    else:
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, accumulation_steps=policy,
                                           noise_scale=True)
        ms_accum.Model_ACCU(cell).train(1, data, callbacks=[telemetry], dataset_sink_mode=False)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("update ")]
    updates = len(telemetry.records)
    assert max(r.accumulation_steps for r in telemetry.records) > 2, "N never grew: the test shows nothing"
    assert [line.split(" loss")[0] for line in printed] == [f"update {u} (epoch 1/1)" for u in range(1, updates + 1)]
    assert printed[-1].endswith(" 0 s left"), printed[-1]


def test_model_accu_records_skipped_windows_and_the_loss_scale(exec_mode, capsys):
    batches = micro_batches([4] * 6)
    poisoned = [(x.copy(), y) for x, y in batches]
    poisoned[1][0][0, 0, 0, 0] = np.inf
    net, loss, opt = build("momentum")
    cell = ms_accum.TrainAccuStepsWithLossScaleCell(nn.WithLossCell(net, loss), opt,
                                                    nn.DynamicLossScaleUpdateCell(1024.0, 2, 100),
                                                    accumulation_steps=3)
    telemetry = ms_accum.WindowTelemetry(print_every=1)
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(poisoned), callbacks=[telemetry], dataset_sink_mode=False)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("update ")]
    assert "| loss scale 512, 1 skipped (this one) |" in printed[0], printed
    assert "| loss scale 512, 1 skipped |" in printed[1], printed
    first, second = telemetry.records
    assert (first.overflow, first.loss_scale, first.micro_batches, first.items) == (True, 512.0, 3, 12)
    assert (second.overflow, second.loss_scale) == (False, 512.0)
    assert not np.isfinite(first.grad_norm) and np.isfinite(second.grad_norm)
    assert telemetry.skipped == 1
    assert first.learning_rate == pytest.approx(0.1)


def test_telemetry_needs_an_ms_accum_trainer():
    from mindspore.train import Model
    net, loss, opt = build("sgd")
    with pytest.raises(RuntimeError, match="'WindowTelemetry', the trainer must provide window records"):
        Model(net, loss, opt).train(1, numpy_dataset(micro_batches([4] * 2)), callbacks=[ms_accum.WindowTelemetry()],
                                    dataset_sink_mode=False)


def test_a_csv_path_that_cannot_be_written_is_refused_when_built(tmp_path):
    """A new user got the system's FileExistsError at the start of training, naming neither the argument nor the
    callback."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("")
    for path in (a_file / "telemetry.csv", tmp_path):
        with pytest.raises(ValueError, match=rf"For 'WindowTelemetry', 'csv_path' must be a file that can be written, "
                                             rf"but '{re.escape(str(path))}' cannot: .+\. Pass a path in a directory "
                                             rf"you can write to\."):
            ms_accum.WindowTelemetry(csv_path=str(path))
    with pytest.raises(TypeError, match=r"'csv_path' must be a str path or None, but got int"):
        ms_accum.WindowTelemetry(csv_path=3)
    nested = tmp_path / "runs" / "a" / "telemetry.csv"
    ms_accum.WindowTelemetry(csv_path=str(nested))
    assert nested.exists(), "the directory is made and the file checked when the callback is built"


@pytest.mark.slow
def test_plot_script_writes_a_png(tmp_path):
    batches = micro_batches([4] * 6)
    net, loss, opt = build("sgd")
    path = str(tmp_path / "telemetry.csv")
    ms_accum.GradientAccumulation(net, loss, opt).train_process(
        3, numpy_dataset(batches), 2, callbacks=ms_accum.WindowTelemetry(csv_path=path), ckpt_path=None, log_every=0)
    run_script("plot_telemetry.py", "--csv", path, "--out", tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a name without a suffix (here an existing directory's): matplotlib writes it with .png, which is what is told
    (tmp_path / "plots").mkdir()
    _, out, _ = run_script("plot_telemetry.py", "--csv", path, "--out", tmp_path / "plots")
    assert out.strip() == f"wrote {tmp_path / 'plots.png'}" and (tmp_path / "plots.png").read_bytes()[:4] == b"\x89PNG"
    code, _, err = run_script("plot_telemetry.py", "--csv", tmp_path / "none.csv", "--out", tmp_path / "x.png",
                              check=False)
    assert code == 2 and "'--csv' must be a telemetry CSV file" in err and "Traceback" not in err


@pytest.mark.slow
def test_the_study_summary_tables_each_runs_updates_samples_and_accuracy(tmp_path):
    """model_zoo_lenet/summarize_study.py (scripts/noise_study.sh's table and figure): per run directory its updates,
    the mean, smallest and largest samples of its windows and eval.py's accuracy, from what the runs wrote."""
    batches = micro_batches([4] * 6 + [2])
    records = {}
    for name, steps in (("fixed_2", 2), ("scheduled", {0: 1, 2: 3})):
        (tmp_path / name).mkdir()
        telemetry = ms_accum.WindowTelemetry(csv_path=str(tmp_path / name / "telemetry.csv"))
        net, loss, opt = build("sgd")
        ms_accum.GradientAccumulation(net, loss, opt).train_process(1, numpy_dataset(batches), steps,
                                                                    callbacks=telemetry, ckpt_path=None, log_every=0)
        records[name] = [record.items for record in telemetry.records]
        (tmp_path / name / "eval.txt").write_text(f"{{'Accuracy': 0.{len(name)}}}\n")
    _, out, _ = run_script("summarize_study.py", "--runs", tmp_path, "--out", tmp_path / "study.png")
    assert "| run | updates | samples per update (mean, min-max) | test accuracy | B_simple after epoch 1 |" in out
    for name, items in records.items():
        row = (f"| {name} | {len(items)} | {sum(items) / len(items):.0f} ({min(items):.0f}-{max(items):.0f}) | "
               f"0.{len(name)}000 |")
        assert row in out, out
    assert records == {"fixed_2": [8, 8, 8, 2], "scheduled": [4, 4, 12, 6]}, records
    assert (tmp_path / "study.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "fixed_2" / "eval.txt").unlink()
    code, _, err = run_script("summarize_study.py", "--runs", tmp_path, "--out", tmp_path / "x.png", check=False)
    assert code == 2 and "'--runs' must hold run directories with eval.txt" in err and "Traceback" not in err, err


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_the_recorded_rate_is_the_updates_when_an_earlier_callback_sets_the_next(trainer, exec_mode):
    """MindSpore's LearningRateScheduler listed before WindowTelemetry halves the optimizer's constant rate after
    each update: each record still holds the rate its update ran at (0.1, 0.05, 0.025), not the next one, which
    the record read when it was made after the scheduler had run (found by a new user's trial); listed after it,
    the same. The rate is copied on the device when the window ends."""
    from mindspore.train import LearningRateScheduler  # pylint: disable=import-outside-toplevel
    for order in ("scheduler first", "telemetry first"):
        net, loss, optimizer = build("momentum")
        telemetry = ms_accum.WindowTelemetry()
        halve = LearningRateScheduler(lambda lr, step: lr * 0.5)
        callbacks = [halve, telemetry] if order == "scheduler first" else [telemetry, halve]
        dataset = numpy_dataset(micro_batches([4] * 6))
        if trainer == "driver":
            ms_accum.GradientAccumulation(net, loss, optimizer).train_process(
                1, dataset, 2, callbacks=callbacks, ckpt_path=None, log_every=0)
        else:
            cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=2)
            ms_accum.Model_ACCU(cell).train(1, dataset, callbacks=callbacks)
        assert [r.learning_rate for r in telemetry.records] == pytest.approx([0.1, 0.05, 0.025], rel=1e-6), \
            (order, exec_mode, telemetry.records)
        assert float(optimizer.learning_rate.asnumpy()) == pytest.approx(0.0125, rel=1e-6), order


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_learning_rate_scheduler_under_a_rule_is_refused_before_training(trainer):
    """Under lr_scaling the optimizer's rate is a ProgressLearningRate, which MindSpore's LearningRateScheduler
    cannot read or assign: refused before any update (it failed after the first one with an AttributeError from
    MindSpore's Cell; a new user's trial), saying what to give instead."""
    from mindspore.train import LearningRateScheduler  # pylint: disable=import-outside-toplevel
    net, loss, optimizer = build("momentum")
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    scheduler = LearningRateScheduler(lambda lr, step: lr * 0.5)
    dataset = numpy_dataset(micro_batches([4] * 4))
    owner = "GradientAccumulation.train_process" if trainer == "driver" else "Model_ACCU.train"
    with pytest.raises(ValueError, match=rf"For '{owner}', MindSpore's LearningRateScheduler in 'callbacks' sets "
                                         r"the optimizer's learning rate as a Parameter, but under "
                                         r"lr_scaling='linear' the rate is a ProgressLearningRate.* Give the "
                                         r"schedule as the optimizer's learning-rate list or LearningRateSchedule"):
        if trainer == "driver":
            ms_accum.GradientAccumulation(net, loss, optimizer, lr_scaling="linear").train_process(
                1, dataset, 2, callbacks=scheduler, ckpt_path=None, log_every=0)
        else:
            cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=2,
                                               lr_scaling="linear")
            ms_accum.Model_ACCU(cell).train(1, dataset, callbacks=[scheduler])
    for p in net.trainable_params():
        np.testing.assert_array_equal(p.asnumpy(), before[p.name], err_msg=f"{p.name} moved before the refusal")
