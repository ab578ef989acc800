"""GradientAccumulation: epoch-end policies, loss reporting, callbacks, checkpoints and argument errors."""
import os
import re
import warnings
from functools import partial

import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Callback, CheckpointConfig, LossMonitor, ModelCheckpoint

import ms_accum
from helpers import (assert_equals_large_batch, assert_params_equal, build, concat, micro_batches, numpy_dataset,
                     params_of, reference_run, reference_train, rounding_rtol, windows_of_sizes)


def _trainer(optimizer="momentum"):
    net, loss, opt = build(optimizer)
    return ms_accum.GradientAccumulation(net, loss, opt), net, opt


@pytest.mark.parametrize("policy, epochs, window_sizes", [
    ("flush", 2, [4, 4, 2, 4, 4, 2]),
    ("drop", 2, [4, 4, 4, 4]),
    ("carry", 2, [4, 4, 4, 4, 4]),
])
def test_partial_window_policies(policy, epochs, window_sizes, exec_mode):
    batches = micro_batches([4] * 10)
    trainer, net, opt = _trainer()
    losses = trainer.train_process(epochs, numpy_dataset(batches), 4, partial_window=policy, ckpt_path=None,
                                   log_every=0)
    stream = batches * epochs
    if policy == "drop":
        stream = batches[:8] + batches[:8]
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"),
                              windows_of_sizes(stream, window_sizes), context=f"{policy}, {exec_mode}")
    assert len(losses) == len(window_sizes)
    assert opt.global_step.asnumpy()[0] == len(window_sizes)
    assert all(not p.asnumpy().any() for p in trainer.grad_sum), "buffers not empty after training"



def test_graph_mode_compiles_the_network_once_and_the_window_end_without_it():
    """In GRAPH_MODE the driver's engine cell compiles two graphs, once each: the accumulation graph every
    micro-batch runs (the network's forward and backward) and the window's end (without the network, so its
    activations are held once: test_every_path_holds_the_tutorials_memory_at_size measures it)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    batches = micro_batches([4] * 8)
    trainer, net, _ = _trainer()
    trainer.train_process(2, numpy_dataset(batches), 4, ckpt_path=None, log_every=0)
    phases = sorted(key.split(".")[0] for key in trainer.cell.compile_cache)
    assert phases == ["train_accumulate", "train_update"], trainer.cell.compile_cache
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"),
                              windows_of_sizes(batches * 2, [4] * 4), context="two graphs")


def test_carry_flushes_a_window_still_open_after_the_last_epoch():
    batches = micro_batches([4] * 3)
    trainer, net, _ = _trainer("sgd")
    losses = trainer.train_process(3, numpy_dataset(batches), 4, partial_window="carry", ckpt_path=None,
                                   log_every=0)
    assert len(losses) == 3  # 9 micro-batches: windows of 4, 4, then the last 1 flushed
    assert_equals_large_batch(params_of(net), partial(reference_train, "sgd"),
                              windows_of_sizes(batches * 3, [4, 4, 1]), context="carry across 3 epochs")


def test_unequal_last_batch_is_weighted_by_samples():
    batches = micro_batches([4, 4, 4, 3])
    trainer, net, _ = _trainer("adam")
    trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0)
    assert_equals_large_batch(params_of(net), partial(reference_train, "adam"), windows_of_sizes(batches, [2, 2]),
                              context="last batch 3")


def test_prints_the_window_mean_loss_over_samples(capsys):
    batches = micro_batches([4, 2, 4, 4])
    trainer, net, _ = _trainer("sgd")
    loss_net = trainer.loss_network
    first = sum(float(loss_net(ms.Tensor(x), ms.Tensor(y)).asnumpy()) * len(y) for x, y in batches[:2]) / 6
    losses = trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None)
    lines = capsys.readouterr().out.strip().splitlines()
    assert [re.sub(r"is .*", "", line) for line in lines] == ["epoch: 1 step: 1 loss ", "epoch: 1 step: 2 loss "]
    assert float(lines[0].split()[-1]) == pytest.approx(first, rel=1e-5)
    assert losses[0] == pytest.approx(first, rel=1e-6)
    assert net is trainer.network


def test_returns_every_window_mean_loss_read_at_the_end(exec_mode):
    """The losses stay on the device until the end: each must still be its own window's value, the mean loss over
    the window's samples at the parameters it started from, as the large batch's TrainOneStepCell returns it."""
    batches = micro_batches([4, 2, 4, 4, 4, 3])
    trainer, net, _ = _trainer("momentum")
    losses = trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0)
    windows = windows_of_sizes(batches, [2, 2, 2])
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), windows, context=exec_mode)
    assert losses == pytest.approx(reference_run("momentum", windows)[1], rel=rounding_rtol(windows)), exec_mode
    assert len(set(losses)) == 3


class _Recorder(Callback):
    def __init__(self, trainer=None):
        super().__init__()
        self.trainer = trainer
        self.events = []
        self.open_at_epoch_end = []
        self.open_at_step_end = set()

    def on_train_begin(self, run_context):
        self.events.append("begin")

    def on_train_step_begin(self, run_context):
        held = int(self.trainer.cell.accu_micro_steps.asnumpy()) if self.trainer else None
        self.events.append(("step_begin", run_context.original_args().cur_step_num, held))

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        self.events.append(("epoch_end", cb.cur_epoch_num, cb.cur_step_num))
        self.open_at_epoch_end.append(cb.open_micro_batches)

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        self.events.append(("step", cb.cur_epoch_num, cb.cur_step_num, cb.batch_num, cb.window_micro_batches,
                            float(cb.net_outputs.asnumpy())))
        self.open_at_step_end.add(cb.open_micro_batches)

    def on_train_end(self, run_context):
        self.events.append("end")


def test_callbacks_fire_once_per_update_with_update_counts(capsys):
    batches = micro_batches([4] * 5)
    trainer, _, _ = _trainer()
    recorder = _Recorder(trainer)
    losses = trainer.train_process(2, numpy_dataset(batches), 2, callbacks=[recorder, LossMonitor(1)],
                                   ckpt_path=None, log_every=0)
    begins = [e for e in recorder.events if isinstance(e, tuple) and e[0] == "step_begin"]
    assert begins == [("step_begin", step, 0) for step in range(1, 7)], "a step must begin before its window"
    steps = [e for e in recorder.events if isinstance(e, tuple) and e[0] == "step"]
    assert [(e[1], e[2], e[3], e[4]) for e in steps] == [
        (1, 1, 3, 2), (1, 2, 3, 2), (1, 3, 3, 1), (2, 4, 3, 2), (2, 5, 3, 2), (2, 6, 3, 1)]
    assert [e[5] for e in steps] == pytest.approx(losses)
    assert recorder.events[0] == "begin" and recorder.events[-1] == "end"
    assert ("epoch_end", 1, 3) in recorder.events and ("epoch_end", 2, 6) in recorder.events
    printed = capsys.readouterr().out
    assert "epoch: 2 step: 3, loss is" in printed and printed.count("loss is") == 6


@pytest.mark.parametrize("policy, steps, expected_ends, epoch_ends, open_at_ends", [
    ("drop", [(1, 1), (1, 2), (2, 3), (2, 4), (3, 5), (3, 6)], 6, [(1, 2), (2, 4), (3, 6)], [0, 0, 0]),
    ("carry", [(1, 1), (1, 2), (2, 3), (2, 4), (2, 5), (3, 6), (3, 7), (3, 8)], 8, [(1, 3), (2, 5), (3, 8)],
     [2, 0, 0]),
])
def test_update_numbers_follow_the_optimizer_steps(policy, steps, expected_ends, epoch_ends, open_at_ends, capsys):
    """10 micro-batches per epoch, windows of 4, 3 epochs: "drop" makes 2 updates an epoch and its dropped windows
    take no number; "carry" makes 30 // 4 + 1 = 8 updates (2, 3, 3 by epoch; an epoch that ends inside a window
    reports that window's number, and open_micro_batches its 2 micro-batches so far), and the progress lines count
    out of 8."""
    trainer, _, opt = _trainer("sgd")
    recorder = _Recorder()
    telemetry = ms_accum.WindowTelemetry(print_every=1)
    trainer.train_process(3, numpy_dataset(micro_batches([4] * 10)), 4, partial_window=policy,
                          callbacks=[recorder, telemetry], ckpt_path=None, log_every=0)
    ends = [(e[1], e[2]) for e in recorder.events if isinstance(e, tuple) and e[0] == "step"]
    assert ends == steps and opt.global_step.asnumpy()[0] == expected_ends
    assert [e[1:] for e in recorder.events if isinstance(e, tuple) and e[0] == "epoch_end"] == epoch_ends
    assert recorder.open_at_epoch_end == open_at_ends and recorder.open_at_step_end == {0}
    printed = re.findall(r"^update (\d+)/(\d+) ", capsys.readouterr().out, re.M)
    assert printed == [(str(k), str(expected_ends)) for k in range(1, expected_ends + 1)]


def test_stop_request_from_a_callback_ends_training():
    class StopAfterTwo(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 2:
                run_context.request_stop()

    trainer, _, opt = _trainer()
    losses = trainer.train_process(3, numpy_dataset(micro_batches([4] * 8)), 2, callbacks=StopAfterTwo(),
                                   ckpt_path=None, log_every=0)
    assert len(losses) == 2 and opt.global_step.asnumpy()[0] == 2


def test_model_checkpoint_saves_network_and_optimizer_without_buffers(tmp_path):
    trainer, net, _ = _trainer()
    saver = ModelCheckpoint(prefix="ckpt", directory=str(tmp_path), config=CheckpointConfig(save_checkpoint_steps=2))
    trainer.train_process(1, numpy_dataset(micro_batches([4] * 8)), 2, callbacks=saver, ckpt_path=None,
                          log_every=0)
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".ckpt")) == ["ckpt-1_2.ckpt", "ckpt-1_4.ckpt"]
    saved = ms.load_checkpoint(str(tmp_path / "ckpt-1_4.ckpt"))
    assert {p.name for p in net.get_parameters()} <= saved.keys()
    assert any(name.startswith("moments.") for name in saved)
    assert not any(name.startswith("grad_sum") for name in saved)


def test_final_checkpoint_round_trips(tmp_path):
    trainer, net, _ = _trainer()
    path = str(tmp_path / "sub" / "final.ckpt")
    trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=path, log_every=0)
    saved = ms.load_checkpoint(path)
    assert "global_step" in saved and not any(name.startswith("grad_sum") for name in saved)
    fresh, _, _ = build("momentum", seed=5)
    ms_accum.load_network_checkpoint(fresh, path)
    assert_params_equal(params_of(fresh), params_of(net), context="reloaded")
    assert os.listdir(tmp_path / "sub") == ["final.ckpt"]


def test_failed_checkpoint_write_keeps_the_previous_file(tmp_path, monkeypatch):
    trainer, net, _ = _trainer()
    path = str(tmp_path / "model.ckpt")
    ms_accum.save_checkpoint_atomic(trainer.train_state, path)
    before = params_of(net)
    real_save = ms.save_checkpoint

    def crash_midway(save_obj, ckpt_file_name, **kwargs):
        real_save(save_obj, ckpt_file_name, **kwargs)
        with open(ckpt_file_name, "r+b") as f:
            f.truncate(100)
        raise OSError("disk full")

    monkeypatch.setattr(ms, "save_checkpoint", crash_midway)
    trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=None, log_every=0)
    with pytest.raises(OSError, match="disk full"):
        ms_accum.save_checkpoint_atomic(trainer.train_state, path)
    assert os.listdir(tmp_path) == ["model.ckpt"], "a partial file was left behind"
    fresh, _, _ = build("momentum", seed=5)
    ms_accum.load_network_checkpoint(fresh, path)
    assert_params_equal(params_of(fresh), before, context="previous checkpoint")


TRAINERS = {"driver": "GradientAccumulation.train_process", "model_accu": "Model_ACCU.train"}


def train_one_epoch(trainer, parts, data, steps=2):
    """One epoch of `data` in windows of `steps` through the driver or Model_ACCU, on `parts` (net, loss, opt)."""
    net, loss, opt = parts
    if trainer == "driver":
        ms_accum.GradientAccumulation(net, loss, opt).train_process(1, data, steps, ckpt_path=None)
    else:
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=steps)
        ms_accum.Model_ACCU(cell).train(1, data)


class _LossNetwork(nn.Cell):
    """A loss network of the user's own (not a WithLossCell): the network and its loss on (data, label)."""

    def __init__(self, net, loss):
        super().__init__()
        self.net, self.loss = net, loss

    def construct(self, data, label):
        return self.loss(self.net(data), label)


class TestBadInput:
    @pytest.mark.parametrize("value, error", [(0, ValueError), (-2, ValueError), (2.5, TypeError),
                                              ("4", TypeError), (True, TypeError)])
    @pytest.mark.parametrize("name", ["gradient_accumulation_steps", "mini_steps"])
    def test_mini_steps(self, value, error, name):
        trainer, _, _ = _trainer()
        text = ", or a schedule such as '0:1,2:2' as text" if isinstance(value, str) else \
            ", a schedule {first_update: N} (or its text, '0:1,2:2') or an AdaptiveAccumulation or " \
            "GoodputAccumulation policy" if error is TypeError else ""
        shown = "'mini_steps' [(]gradient_accumulation_steps[)]" if name == "mini_steps" else f"'{name}'"
        with pytest.raises(error, match=rf"For 'GradientAccumulation.train_process', {shown} must be an int "
                                        rf">= 1{re.escape(text)}, but got {re.escape(repr(value))}"):
            trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), ckpt_path=None, **{name: value})
        if isinstance(value, str):  # the same words from the cells and Model_ACCU, which take N as text too
            net, loss, opt = build()
            with pytest.raises(TypeError, match=r"For 'TrainAccuStepsCell', 'gradient_accumulation_steps' must be an "
                                                r"int >= 1, or a schedule such as '0:1,2:2' as text, but got '4' of "
                                                r"type str\. Convert a number read from a command line: int\('4'\)"):
                ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=value)
            with pytest.raises(TypeError, match=r"but got 'four' of type str\. Pass the number of micro-batches per "
                                                r"update, such as 4\.$"):  # no int('four'), which cannot convert it
                ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps="four")
            cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt)
            with pytest.raises(TypeError, match=rf"For 'Model_ACCU', {shown} must be an int >= 1, or a schedule"):
                ms_accum.Model_ACCU(cell, **{name: value})

    def test_mini_steps_and_epoch_accept_numpy_integers(self):
        trainer, _, opt = _trainer()
        losses = trainer.train_process(np.int32(1), numpy_dataset(micro_batches([4] * 4)), np.int64(2),
                                       ckpt_path=None, log_every=0)
        assert len(losses) == 2 and opt.global_step.asnumpy()[0] == 2

    def test_optimizer_and_network_are_checked(self):
        net, loss, opt = build()
        with pytest.raises(TypeError, match=r"For 'GradientAccumulation', 'optimizer' must be a mindspore.nn "
                                            r"optimizer .*but got NoneType"):
            ms_accum.GradientAccumulation(net, loss, None)
        with pytest.raises(TypeError, match=r"For 'GradientAccumulation', 'loss_fn' must be a mindspore.nn.Cell, "
                                            r"but got str"):
            ms_accum.GradientAccumulation(net, "cross_entropy", opt)
        other, _, _ = build()
        with pytest.raises(ValueError, match=r"For 'GradientAccumulation', the optimizer's parameters must be "
                                             r"parameters of 'network', but none of its"):
            ms_accum.GradientAccumulation(other, loss, opt)

    def test_epoch(self):
        trainer, _, _ = _trainer()
        with pytest.raises(ValueError, match="'epoch' must be an int >= 1, but got 0"):
            trainer.train_process(0, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=None)

    @pytest.mark.parametrize("initial_epoch, error", [(1.0, TypeError), (1, ValueError)])
    def test_initial_epoch(self, initial_epoch, error):
        trainer, _, _ = _trainer()
        with pytest.raises(error, match=rf"For 'GradientAccumulation.train_process', 'initial_epoch' must be an int "
                                        rf"in \[0, 1\), but got {initial_epoch}"):
            trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=None,
                                  initial_epoch=initial_epoch)

    def test_partial_window(self):
        trainer, _, _ = _trainer()
        with pytest.raises(ValueError, match=r"'partial_window' must be one of \['flush', 'drop', 'carry'\], "
                                             r"but got 'keep'"):
            trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), 2, partial_window="keep")

    def test_mini_steps_larger_than_an_epoch(self):
        trainer, _, _ = _trainer()
        with pytest.raises(ValueError, match=r"'mini_steps' [(]gradient_accumulation_steps[)] must be <= the 4 "
                                             r"micro-batches in an epoch, but got 5.*partial_window='carry'"):
            trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), mini_steps=5, ckpt_path=None)

    def test_dataset_of_another_type(self):
        trainer, _, _ = _trainer()
        with pytest.raises(TypeError, match=r"'train_dataset' must be a batched mindspore.dataset.Dataset \(each row "
                                            r"one micro-batch\), but got list. Wrap arrays in "
                                            r"mindspore.dataset.NumpySlicesDataset"):
            trainer.train_process(1, micro_batches([4] * 4), 2, ckpt_path=None)

    def test_a_loss_class_instead_of_an_instance(self):
        net, _, opt = build()
        with pytest.raises(TypeError, match=r"For 'GradientAccumulation', 'loss_fn' must be a mindspore.nn.Cell, but "
                                            r"got the class MSELoss itself. Pass an instance: MSELoss\(...\)\."):
            ms_accum.GradientAccumulation(net, nn.MSELoss, opt)

    def test_network_and_loss_swapped(self):
        """GradientAccumulation(loss, network, optimizer) failed in the loss's construct with Python's "missing 1
        required positional argument" (a new user's trial): refused when built, naming both. A network without
        Parameters beside a parameter-free loss is not taken for a swap (the optimizer's check refuses it)."""
        net, loss, opt = build()
        with pytest.raises(ValueError, match=r"For 'GradientAccumulation', 'network' must be the network you train "
                                             r"and 'loss_fn' its loss, but 'network' \(SoftmaxCrossEntropyWithLogits\) "
                                             r"holds no Parameters while 'loss_fn' \(SmallConvNet\) holds \d+: they "
                                             r"look swapped\. Pass GradientAccumulation\(network, loss_fn, "
                                             r"optimizer\)"):
            ms_accum.GradientAccumulation(loss, net, opt)
        with pytest.raises(ValueError, match=r"the optimizer's parameters must be parameters of"):
            ms_accum.GradientAccumulation(nn.ReLU(), loss, opt)

    def test_a_loss_network_given_with_a_loss_fn(self):
        """A loss network with a loss_fn failed in MindSpore ("The parameters number of the function is 2, but the
        number of provided arguments is 1", a new user's trial): refused when built, naming its construct."""
        net, loss, opt = build()
        with pytest.raises(ValueError, match=r"For 'GradientAccumulation', with 'loss_fn' given, 'network' is called "
                                             r"with each row's data alone .* but _LossNetwork.construct\(data, "
                                             r"label\) needs 2 inputs. If 'network' computes the loss itself, pass "
                                             r"loss_fn=None"):
            ms_accum.GradientAccumulation(_LossNetwork(net, loss), loss, opt)

    @pytest.mark.parametrize("trainer", ["driver", "model_accu"])
    @pytest.mark.parametrize("columns", [("x", "y", "id"), ("x",)], ids=["one_more", "one_less"])
    def test_dataset_columns_the_loss_network_does_not_take(self, trainer, columns):
        """Each row's columns are the loss network's inputs: too many or too few are refused before training,
        naming the dataset's columns and the construct's inputs (MindSpore's error named neither)."""
        net, loss, opt = build()
        x, y = concat(micro_batches([4] * 4))
        data = ds.NumpySlicesDataset(dict(zip(columns, (x, y, np.arange(len(y))))), shuffle=False).batch(4)
        with pytest.raises(ValueError, match=rf"For '{TRAINERS[trainer]}', each row of 'train_dataset' is passed "
                                             rf"to WithLossCell.construct\(data, label\), which takes 2 inputs, but "
                                             rf"the dataset has {len(columns)} column{'s' * (len(columns) > 1)} "
                                             rf"\{list(columns)}\. Keep the "
                                             rf"columns"):
            train_one_epoch(trainer, (net, loss, opt), data)
        assert int(opt.global_step.asnumpy()[0]) == 0

    @pytest.mark.parametrize("trainer", ["driver", "model_accu"])
    def test_a_dataset_of_single_samples_is_warned_of_before_training(self, trainer):
        """Rows that are single samples (no batch operation, a scalar label beside an image) would each be a
        micro-batch weighed by the image's leading axis (a new user's trial: a rule's rate 7 times too large):
        warned of, naming the columns and .batch, before the first micro-batch. Batched rows, and a generator
        that yields whole micro-batches, are not warned of and train."""
        x, y = concat(micro_batches([4] * 4))
        message = rf"For '{TRAINERS[trainer]}', 'train_dataset' has no batch operation"
        samples = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False)
        net, loss, opt = build()
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=message)
            with pytest.raises(UserWarning, match=message + r", and its column\(s\) \['y'\] hold a scalar in "
                                                  r"each row beside \{'x': \[1, 6, 6\]\}: its rows look like "
                                                  r"single samples.* Batch the samples with "
                                                  r"train_dataset.batch\(micro_batch_size\)"):
                train_one_epoch(trainer, (net, loss, opt), samples)
        assert int(opt.global_step.asnumpy()[0]) == 0

        def whole_micro_batches():
            for index in range(4):
                yield x[4 * index:4 * index + 4], y[4 * index:4 * index + 4]
        for data in (samples.batch(4), ds.GeneratorDataset(whole_micro_batches, ["x", "y"], shuffle=False)):
            net, loss, opt = build()
            with warnings.catch_warnings():
                warnings.filterwarnings("error", message=message)
                train_one_epoch(trainer, (net, loss, opt), data)
            assert int(opt.global_step.asnumpy()[0]) == 2

    def test_a_bare_network_with_loss_fn_none_is_told_it_must_be_the_loss_network(self):
        net, _, opt = build()
        with pytest.raises(ValueError, match=r"construct\(x\), which takes 1 input, but the dataset has 2 columns "
                                             r".* With loss_fn=None, 'network' is the loss network: its construct "
                                             r"takes every column"):
            ms_accum.GradientAccumulation(net, None, opt).train_process(
                1, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=None)

    def test_empty_dataset(self):
        trainer, _, _ = _trainer()
        empty = numpy_dataset(micro_batches([4] * 2)).batch(8, drop_remainder=True)
        with pytest.raises(ValueError, match="'train_dataset' must yield at least one batch per epoch, but it is "
                                             "empty"):
            trainer.train_process(1, empty, 1, ckpt_path=None)

    def test_learning_rate_schedule_counted_in_micro_batches(self):
        net, loss, _ = build()
        trainer = ms_accum.GradientAccumulation(net, loss, nn.SGD(net.trainable_params(), [0.1, 0.1, 0.05, 0.05]))
        with pytest.warns(UserWarning, match=r"learning-rate list has 4 entries, one per micro-batch of this run, "
                                             r"but the optimizer reads one entry per update \(2 in this run\)"):
            trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=None)
        net, loss, _ = build()
        fitting = ms_accum.GradientAccumulation(net, loss, nn.SGD(net.trainable_params(), [0.1, 0.05]))
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*learning-rate list")  # one entry per update: no warning
            assert len(fitting.train_process(1, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=None)) == 2

    def test_checkpoint_name(self):
        trainer, _, _ = _trainer()
        with pytest.raises(ValueError, match="'ckpt_path' must be a str ending with '.ckpt', but got 'model.bin'"):
            ms_accum.save_checkpoint_atomic(trainer.train_state, "model.bin")


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_a_learning_rate_list_shorter_than_the_run_is_refused_before_training(trainer):
    """Two entries for three updates: refused before the first (the optimizer failed at the third, after two)."""
    net, loss, _ = build()
    opt = nn.SGD(net.trainable_params(), [0.1, 0.05])
    data = numpy_dataset(micro_batches([4] * 6))
    with pytest.raises(ValueError, match=rf"For '{TRAINERS[trainer]}', the optimizer's learning-rate list must have "
                                         r"an entry for every update, but it has 2 and this run needs 3 \(0 done "
                                         r"before it, 3 in it\): the optimizer would read past its end at update 3"):
        train_one_epoch(trainer, (net, loss, opt), data)
    assert int(opt.global_step.asnumpy()[0]) == 0


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_with_an_adaptive_n_the_list_must_cover_every_window_at_min_steps(trainer):
    """The updates of an adaptive run are decided as it goes: at most every window at min_steps (9 micro-batches
    in windows of 2, the last one flushed: 5). Found by a new-user trial, where the third update failed in
    MindSpore's words."""
    net, loss, _ = build()
    opt = nn.SGD(net.trainable_params(), [0.1, 0.1])
    policy = ms_accum.AdaptiveAccumulation(2, 4)
    data = numpy_dataset(micro_batches([4] * 9))
    with pytest.raises(ValueError, match=rf"For '{TRAINERS[trainer]}', the optimizer's learning-rate list must have "
                                         r"an entry for every update, but it has 2 and this run may need 5 \(0 done "
                                         r"before it, up to 5 in it, every window at the policy's min_steps\)"):
        if trainer == "driver":
            ms_accum.GradientAccumulation(net, loss, opt, noise_scale=True).train_process(1, data, policy,
                                                                                          ckpt_path=None)
        else:
            cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=policy,
                                               noise_scale=True)
            ms_accum.Model_ACCU(cell).train(1, data)
    assert int(opt.global_step.asnumpy()[0]) == 0


def test_a_per_update_learning_rate_list_trained_one_epoch_per_call_follows_the_list():
    """A list for the whole run (2 epochs of 2 updates) has as many entries as one call's micro-batches: the
    driver warns at the first call (it cannot tell), not at the second (the updates done and the call's fill the
    list), and each update reads the list's next entry, as one call would."""
    rates = [0.1, 0.06, 0.03, 0.01]
    whole_net, loss, _ = build()
    whole = ms_accum.GradientAccumulation(whole_net, loss, nn.SGD(whole_net.trainable_params(), rates))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*learning-rate list")
        whole.train_process(2, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=None)
    net, loss, _ = build()
    trainer = ms_accum.GradientAccumulation(net, loss, nn.SGD(net.trainable_params(), rates))
    with pytest.warns(UserWarning, match="learning-rate list has 4 entries"):
        trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=None)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*learning-rate list")
        trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=None)
    assert int(trainer.optimizer.global_step.asnumpy()[0]) == 4
    for name, value in params_of(whole_net).items():
        np.testing.assert_allclose(params_of(net)[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    with pytest.raises(ValueError, match=r"has 4 and this run needs 6 \(4 done before it, 2 in it\)"):
        trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), 2, ckpt_path=None)  # a third call


def test_a_loss_that_is_not_a_scalar_names_the_driver(exec_mode):
    """An error of the window's run names what the user built (GradientAccumulation), not the cells it holds."""
    net, _, opt = build("sgd")
    per_sample = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation', the loss network must return one scalar loss"
                       ) as raised:
        ms_accum.GradientAccumulation(net, per_sample, opt).train_process(1, numpy_dataset(micro_batches((4, 4))), 2,
                                                                        ckpt_path=None, log_every=0)
    # as ms_accum wrote it: not quoted, without MindSpore's C++ stack and graph traceback (GRAPH_MODE's compile)
    assert re.fullmatch(r"For 'GradientAccumulation', the loss .* but it returned shape \(4,?\)\.", str(raised.value))


def test_a_loss_network_given_with_a_loss_fn_is_refused():
    """A new user's trial: GradientAccumulation(loss_net, loss_fn, opt) failed at its first micro-batch in MindSpore
    (WithLossCell.construct() missing 'label'), naming neither the argument nor the fix."""
    net, loss, opt = build("sgd")
    with pytest.raises(TypeError, match=r"^For 'GradientAccumulation', 'network' must be the network without its "
                                        r"loss when 'loss_fn' is given, but got a WithLossCell, which holds a loss "
                                        r"already\. Pass the bare network with loss_fn"):
        ms_accum.GradientAccumulation(nn.WithLossCell(net, loss), loss, opt)


def test_the_cells_of_earlier_releases_read_the_engine_cell_with_a_deprecation_warning():
    """Before the driver drove one engine cell it held three cells; code reading them keeps working for a
    release: 'forward_backward' and 'optim' give the cell (which holds every counter and record they held) and
    'clear' its drop, each with a DeprecationWarning naming the new name."""
    trainer, _, _ = _trainer()
    for old in ("forward_backward", "optim"):
        with pytest.warns(DeprecationWarning, match=rf"For 'GradientAccumulation', '{old}' is now the engine cell "
                                                    rf"'cell'; the old name goes in the next release"):
            assert getattr(trainer, old).target is trainer.cell
        with pytest.warns(DeprecationWarning):
            assert getattr(trainer, old).accu_micro_steps is trainer.cell.accu_micro_steps
    x, y = micro_batches([4])[0]
    trainer.cell.set_accumulation(True)(ms.Tensor(x), ms.Tensor(y))  # a window opened by hand
    assert int(trainer.cell.accu_micro_steps.asnumpy()) == 1
    with pytest.warns(DeprecationWarning, match=r"'clear' is now the engine cell's 'cell.drop'"):
        clear = trainer.clear
    clear()
    assert int(trainer.cell.accu_micro_steps.asnumpy()) == 0


def test_a_loop_of_earlier_releases_calling_the_cells_trains_the_large_batch(exec_mode):
    """A loop written for 0.3 (forward_backward per micro-batch, then optim() and clear() once a window) makes one
    update a window, the large batch's: a new user's trial found each forward_backward call stepping the optimizer
    (the engine cell's own call, N 1), and optim() failing in MindSpore for want of inputs."""
    batches = micro_batches([4, 2, 3, 4, 4, 1])
    trainer, net, opt = _trainer()
    losses = []
    with pytest.warns(DeprecationWarning):
        for window in (batches[:3], batches[3:]):
            for x, y in window:
                trainer.forward_backward(ms.Tensor(x), ms.Tensor(y))
            losses.append(trainer.optim())
            trainer.clear()
    assert int(opt.global_step.asnumpy()[0]) == 2
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"),
                              [batches[:3], batches[3:]], context=exec_mode)
    _, reference_losses = reference_run("momentum", [batches[:3], batches[3:]])
    np.testing.assert_allclose([float(loss.asnumpy()) for loss in losses], reference_losses, rtol=1e-5)


def test_sens_with_a_loss_scale_is_refused_naming_both():
    net, loss, opt = build("momentum")
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation', 'sens' must be 1.0 with 'scale_sense', whose "
                                         r"loss scale is the gradient's seed, but got 2.0"):
        ms_accum.GradientAccumulation(net, loss, opt, sens=2.0, scale_sense=ms.Tensor(1024.0))


def test_a_second_run_takes_an_adaptive_policy_the_first_did_not_have(exec_mode):
    """The window-end graph holds an adaptive policy (it chooses N on the device), so each policy has a graph of
    its own: a trainer that has trained with a fixed N, then with a schedule, then with a policy, follows the
    policy (each window's N is the policy's answer to the records of the window before), and then another."""
    net, loss, opt = build("momentum")
    trainer = ms_accum.GradientAccumulation(net, loss, opt, noise_scale=True)
    data = numpy_dataset(micro_batches([4] * 24))
    seen = []
    trainer.train_process(1, data, 2, ckpt_path=None, log_every=0)
    trainer.train_process(1, data, {0: 2, 2: 4}, ckpt_path=None, log_every=0)
    for policy in (ms_accum.AdaptiveAccumulation(min_steps=2, max_steps=6, interval=1, max_factor=3.0),
                   ms_accum.AdaptiveAccumulation(min_steps=3, max_steps=3, interval=1)):
        telemetry = ms_accum.WindowTelemetry()
        trainer.train_process(1, data, policy, callbacks=[telemetry], ckpt_path=None, log_every=0)
        steps = [r.accumulation_steps for r in telemetry.records]
        assert steps[0] == policy.initial_steps, steps
        seen.append(steps)
        for index, record in enumerate(telemetry.records[:-1]):
            want = policy.next_steps(steps[index], index, record.noise_scale, record.items / record.micro_batches)
            assert steps[index + 1] == want, f"{policy}: after window {index}: N {steps[index + 1]}, not {want}"
    assert len(set(seen[0])) > 1, seen  # the first policy moved N: its graph ran
    assert set(seen[1]) == {3}, seen  # the second policy's graph, not the first's
