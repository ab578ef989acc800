"""Model_ACCU: training through mindspore.train.Model, the sink-mode orchestration, and argument errors."""
import os
import re
import subprocess
import sys
import warnings
from functools import partial

import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
import mindspore.train.dataset_helper as helper_module
import mindspore.train.model as model_module
from mindspore import Tensor, amp, nn
from mindspore.train import Callback, CheckpointConfig, LossMonitor, ModelCheckpoint

import ms_accum
from ms_accum.compat import cell_graph_executor
from ms_accum.core.global_batch import DERIVED_STEPS_NAME
from ms_accum.trainers.devices import check_devices_agree, check_sharding
from helpers import (FLOAT16_GAIN, FLOAT16_ROUNDING, FLOAT32_ROUNDING, ROUNDING_GAIN, assert_equals_large_batch,
                     assert_noise_records_match, assert_params_equal, build, large_batch, micro_batches,
                     noise_reference, numpy_dataset, params_of, reference_train, windows_of_sizes)
from test_accu_cells import CELLS, make_cell, optimizer_state


def windows_of(batches, n, epochs=1):
    """Per epoch, consecutive windows of n micro-batches; the last may be shorter."""
    out = []
    for _ in range(epochs):
        out += [batches[i:i + n] for i in range(0, len(batches), n)]
    return out


class StepLog(Callback):
    """Records (epoch, cur_step_num, batch_num) at every step end and epoch end."""

    def __init__(self):
        super().__init__()
        self.steps, self.epochs = [], []

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        self.steps.append((cb.cur_epoch_num, cb.cur_step_num, cb.batch_num))

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        self.epochs.append((cb.cur_epoch_num, cb.cur_step_num))


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_train_without_sink_equals_large_batch_training(kind, exec_mode):
    batches = micro_batches((4,) * 10)
    cell, net, opt = make_cell(kind, steps=4)
    log = StepLog()
    ms_accum.Model_ACCU(cell).train(2, numpy_dataset(batches), callbacks=[log], dataset_sink_mode=False)
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), windows_of(batches, 4, epochs=2),
                              context=f"{kind}, {exec_mode}")
    assert log.steps == [(1, 1, 3), (1, 2, 3), (1, 3, 3), (2, 4, 3), (2, 5, 3), (2, 6, 3)]
    assert log.epochs == [(1, 3), (2, 6)]
    assert opt.global_step.asnumpy()[0] == 6
    assert not any(p.asnumpy().any() for p in cell.accu_grads), "buffers not cleared at the last window's end"


class EvalLog(Callback):
    """Records the metrics of every evaluation run during training (Model's fit)."""

    def __init__(self):
        super().__init__()
        self.results = []

    def on_eval_end(self, run_context):
        self.results.append(dict(run_context.original_args().metrics))


@pytest.mark.parametrize("frequency, evaluations", [(1, 2), (2, 1)])
def test_fit_trains_as_train_and_evaluates_every_valid_frequency_epochs(frequency, evaluations):
    """Model_ACCU.fit: each update equals the large batch (the windows train() lays out), and the model is evaluated
    on the validation data at the end of every `frequency`-th epoch, with the metrics model.eval gives. (fit differs
    from train only on the host: the graphs, in either mode, are train's, tested in both.)"""
    batches, valid = micro_batches((4,) * 10), micro_batches((6,), seed=7)
    cell, net, opt = make_cell("plain", steps=4)
    _, loss, _ = build()
    model = ms_accum.Model_ACCU(cell, metrics={"loss": nn.Loss()}, eval_network=nn.WithEvalCell(net, loss),
                                eval_indexes=[0, 1, 2])
    log, evals = StepLog(), EvalLog()
    model.fit(2, numpy_dataset(batches), numpy_dataset(valid), valid_frequency=frequency, callbacks=[log, evals])
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), windows_of(batches, 4, epochs=2),
                              context=f"fit, valid_frequency {frequency}")
    assert log.steps == [(1, 1, 3), (1, 2, 3), (1, 3, 3), (2, 4, 3), (2, 5, 3), (2, 6, 3)]
    assert len(evals.results) == evaluations
    after = model.eval(numpy_dataset(valid), dataset_sink_mode=False)
    assert evals.results[-1]["loss"] == pytest.approx(after["loss"], rel=1e-6), (evals.results, after)


def test_fit_takes_trains_options_and_names_others():
    cell, _, opt = make_cell("plain", steps=4)
    ms_accum.Model_ACCU(cell).fit(1, numpy_dataset(micro_batches((4,) * 6)), partial_window="drop")
    assert opt.global_step.asnumpy()[0] == 1, "the last two micro-batches, an open window, were not dropped"
    with pytest.raises(TypeError, match=r"For 'Model_ACCU.fit', the keyword arguments beyond Model.fit's must be "
                                        r"those of Model_ACCU.train \(resume_from, .*\), but got 'partial'"):
        ms_accum.Model_ACCU(cell).fit(1, numpy_dataset(micro_batches((4,) * 6)), partial="drop")
    with pytest.raises(ValueError, match=r"For 'Model_ACCU.fit', 'epoch' must be an int >= 1, but got 0"):
        ms_accum.Model_ACCU(cell).fit(0, numpy_dataset(micro_batches((4,) * 6)))
    # refused before training (Model's fit trained an epoch, then failed on 0 with a ZeroDivisionError)
    for frequency in (0, [1, -1]):
        with pytest.raises(ValueError, match=r"For 'Model_ACCU.fit', 'valid_frequency' must be an int >= 1, but got "
                                             r"(0|-1)"):
            ms_accum.Model_ACCU(cell).fit(2, numpy_dataset(micro_batches((4,) * 6)),
                                          numpy_dataset(micro_batches((4,))), valid_frequency=frequency)
    with pytest.raises(TypeError, match=r"For 'Model_ACCU.fit', 'valid_dataset' must be a mindspore.dataset.Dataset "
                                        r"or None, but got ndarray"):
        ms_accum.Model_ACCU(cell).fit(1, numpy_dataset(micro_batches((4,) * 6)), np.zeros((4, 2)))
    assert opt.global_step.asnumpy()[0] == 1, "a refused fit trained"


def test_accumulation_steps_argument_replaces_the_cells():
    batches = micro_batches((4,) * 6)
    cell, net, _ = make_cell("plain", steps=4)
    model = ms_accum.Model_ACCU(cell, accumulation_steps=3)
    assert model.accumulation_steps == 3 == cell.accumulation_steps
    model.train(1, numpy_dataset(batches), dataset_sink_mode=False)
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), windows_of(batches, 3),
                              context="N=3")


UNSET_N = "N ('gradient_accumulation_steps') was not given to TrainAccuStepsCell or to any call, so it is 1"


def test_a_cell_left_at_n_1_without_being_given_it_warns_once_that_nothing_accumulates():
    """TrainAccuStepsCell defaults N to 1 (the seed's cell did): built without N and called directly in its automatic
    mode, or trained by a Model_ACCU given none, it updated at every call in silence. It warns once, at that first
    call or run, naming 'sens' where an int N went there (the third positional argument); N given anywhere (1 too:
    on purpose) or an explicit mode warns of nothing."""
    batches = micro_batches((4,) * 4)
    (x, y), after = batches[0], batches[1]

    def warnings_of(call):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        return [str(w.message) for w in caught if "was not given" in str(w.message)]

    net, loss, opt = build("sgd")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt)
    before = params_of(net)
    found = warnings_of(lambda: cell(Tensor(x), Tensor(y)))
    assert len(found) == 1 and found[0].startswith(f"For 'TrainAccuStepsCell', {UNSET_N}: every call updates"), found
    assert "Pass gradient_accumulation_steps=N to the cell" in found[0] and "'sens'" not in found[0], found[0]
    assert any(not np.array_equal(before[name], value) for name, value in params_of(net).items()), "N 1 updated"
    net, loss, opt = build("sgd")
    positional = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, 4)  # N meant, 'sens' given (a trial)
    found = warnings_of(lambda: positional(Tensor(x), Tensor(y)))
    assert len(found) == 1 and found[0].endswith(
        "Its 'sens' is 4, which multiplies every gradient: the third positional argument is 'sens', as in "
        "nn.TrainOneStepCell; for N = 4, pass gradient_accumulation_steps=4."), found
    assert warnings_of(lambda: cell(Tensor(after[0]), Tensor(after[1]))) == [], "once a cell"
    net, loss, opt = build("sgd")
    scaled = ms_accum.TrainAccuStepsWithLossScaleCell(nn.WithLossCell(net, loss), opt, Tensor(1024.0))
    found = warnings_of(lambda: scaled(Tensor(x), Tensor(y)))
    assert len(found) == 1 and "was not given to TrainAccuStepsWithLossScaleCell" in found[0], found
    for given in (dict(gradient_accumulation_steps=1), dict(mini_steps=2)):
        net, loss, opt = build("sgd")
        quiet = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, **given)
        assert warnings_of(lambda: quiet(Tensor(x), Tensor(y))) == [], given
    net, loss, opt = build("sgd")
    chosen = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt).set_accumulation(True)
    assert warnings_of(lambda: chosen(Tensor(x), Tensor(y))) == [], "an explicit mode decides itself"

    net, loss, opt = build("sgd")
    model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt))
    found = warnings_of(lambda: model.train(1, numpy_dataset(batches), dataset_sink_mode=False))
    assert len(found) == 1 and found[0].startswith(f"For 'Model_ACCU.train', {UNSET_N}"), found
    for given in (dict(model=dict(gradient_accumulation_steps=2)), dict(train=dict(gradient_accumulation_steps=2))):
        net, loss, opt = build("sgd")
        model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt),
                                    **given.get("model", {}))
        assert warnings_of(lambda: model.train(1, numpy_dataset(batches), dataset_sink_mode=False,
                                               **given.get("train", {}))) == [], given


@pytest.mark.parametrize("policy, epochs, window_sizes", [
    ("flush", 2, [4, 4, 2, 4, 4, 2]),
    ("drop", 2, [4, 4, 4, 4]),
    ("carry", 3, [4, 4, 4, 4, 4, 4, 4, 2]),
])
def test_partial_window_policies_without_sink(policy, epochs, window_sizes, exec_mode):
    """The driver's three policies through the shared loop: 10 micro-batches an epoch, windows of 4."""
    batches = micro_batches([4] * 10)
    cell, net, opt = make_cell("plain", steps=4)
    log = StepLog()
    ms_accum.Model_ACCU(cell).train(epochs, numpy_dataset(batches), callbacks=[log], partial_window=policy)
    stream = (batches[:8] if policy == "drop" else batches) * epochs
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"),
                              windows_of_sizes(stream, window_sizes), context=f"{policy}, {exec_mode}")
    assert opt.global_step.asnumpy()[0] == len(window_sizes) == log.steps[-1][1]
    assert not any(p.asnumpy().any() for p in cell.accu_grads), "buffers not empty after training"


@pytest.mark.parametrize("kind", list(CELLS))
def test_drop_discards_the_open_window(kind, exec_mode):
    """drop(): the buffers, counters and overflow flag cleared, no step, and the window not counted."""
    cell, net, opt = make_cell(kind, steps=4)
    before = params_of(net)
    x, y = micro_batches([4])[0]
    cell.set_accumulation(True)
    cell(ms.Tensor(x), ms.Tensor(y))
    assert int(cell.drop().asnumpy()) == 1
    assert_params_equal(params_of(net), before, context="drop")
    assert not any(p.asnumpy().any() for p in cell.accu_grads) and int(cell.accu_micro_steps.asnumpy()) == 0
    assert int(cell.accu_windows.asnumpy()) == 0 and opt.global_step.asnumpy()[0] == 0


@pytest.mark.parametrize("sink_size", [-1, 4])
def test_sink_mode_request_on_cpu_runs_the_same_alternation_and_says_so(sink_size, capsys):
    """MindSpore trains without sink on CPU and logs it at INFO level only; a user sees a warning, which says when
    the run differs from a device's (a sink_size smaller than the epoch is not applied)."""
    batches = micro_batches((4,) * 8)
    cell, net, _ = make_cell("plain", steps=2)
    cut = r"; 'sink_size' 4 is not applied: each epoch runs all 8 micro-batches, where a device sinks 4" \
        if sink_size == 4 else ""
    with pytest.warns(UserWarning, match=rf"For 'Model_ACCU.train', dataset sink mode needs a GPU or Ascend device: "
                                         rf"on CPU MindSpore trains without sink \(its notice is logged at INFO level "
                                         rf"only\){cut}\. The checks a device makes passed\. Pass "
                                         rf"dataset_sink_mode=False on CPU\.$"):
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(batches), callbacks=[LossMonitor(1)], dataset_sink_mode=True,
                                        sink_size=sink_size)
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), windows_of(batches, 2),
                              context="cpu sink")
    printed = capsys.readouterr().out
    assert printed.count("loss is") == 4 and "epoch: 1 step: 4, loss is" in printed


def test_on_cpu_a_sink_size_that_leaves_a_partial_window_says_it_is_applied():
    """A new user's trial: 10 micro-batches, N 4, sink_size 8 passes a device's checks (it sinks two windows an
    epoch); on CPU each epoch runs all 10 and flushes its last 2 as a smaller window, which the warning now says."""
    batches = micro_batches((4,) * 10)
    cell, net, _ = make_cell("plain", steps=4)
    with pytest.warns(UserWarning, match=r"'sink_size' 8 is not applied: each epoch runs all 10 micro-batches, its "
                                         r"last window of 2 applied as a smaller one, where a device sinks 8\."):
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(batches), dataset_sink_mode=True, sink_size=8)
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"),
                              [batches[:4], batches[4:8], batches[8:]], context="cpu sink, flushed")


@pytest.mark.parametrize("mode", ["yes", 1, None])
def test_a_sink_mode_that_is_not_a_bool_is_refused_naming_it(mode):
    """A new user's trial: 'yes' or 1 was warned of as sink mode on CPU, then refused in MindSpore's words, which
    do not name the argument."""
    cell, _, opt = make_cell("plain", steps=4)
    with pytest.raises(TypeError, match=rf"For 'Model_ACCU.train', 'dataset_sink_mode' must be a bool, but got "
                                        rf"{re.escape(repr(mode))} of type {type(mode).__name__}\."):
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 8)), dataset_sink_mode=mode)
    assert int(opt.global_step.asnumpy()[0]) == 0


@pytest.mark.parametrize("case", ["schedule", "partial_window", "sink_size", "state"])
def test_sink_mode_requests_on_cpu_are_refused_as_on_a_device(case, tmp_path):
    """On CPU MindSpore trains without sink when sink mode is asked; what sink mode cannot carry is refused all
    the same, so that a script tried on CPU does not fail for the first time on a GPU or Ascend."""
    net, loss, opt = build("momentum")
    steps = {0: 2, 2: 4} if case == "schedule" else 4
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=steps)
    model = ms_accum.Model_ACCU(cell, **({"state_path": str(tmp_path / "s.ckpt"), "save_state_every": 1}
                                        if case == "state" else {}))
    kwargs = {"partial_window": "drop"} if case == "partial_window" else {}
    sizes = (4,) * (10 if case == "sink_size" else 8)
    message = {"schedule": "must be one int in dataset sink mode",
               "partial_window": "'partial_window' must be 'flush' in dataset sink mode",
               "sink_size": r"'sink_size' must be a multiple of gradient_accumulation_steps 4 in dataset sink mode, "
                            r"but got -1, the dataset size 10",
               "state": "exact state saving and 'resume_from' work without dataset sink mode"}[case]
    with pytest.raises(ValueError, match=message):
        model.train(1, numpy_dataset(micro_batches(sizes)), dataset_sink_mode=True, **kwargs)
    assert int(opt.global_step.asnumpy()[0]) == 0


@pytest.mark.parametrize("sink", [True, False])
def test_a_rate_list_is_checked_on_cpu_in_sink_mode_as_without_it(sink):
    """A new user's trial: on CPU, where MindSpore trains without sink, a learning-rate list shorter than the run's
    updates was checked by neither path: warned "the checks a device makes passed", it failed in MindSpore's
    Gather after 4 of 6 updates. It is refused before training, with sink mode asked or not."""
    net, loss, _ = build("momentum")
    opt = nn.Momentum(net.trainable_params(), learning_rate=[0.1] * 4, momentum=0.9)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the CPU's sink-mode warning, tested above
        with pytest.raises(ValueError, match=r"learning-rate list.*has 4 .*needs 6"):
            ms_accum.Model_ACCU(cell).train(3, numpy_dataset(micro_batches((4,) * 8)), dataset_sink_mode=sink)
    assert int(opt.global_step.asnumpy()[0]) == 0


@pytest.mark.parametrize("sink", [True, False])
def test_a_call_refused_before_training_leaves_the_cells_n_as_it_was(sink):
    """A new user's trial: N given to a train call that was then refused stayed in the cell: the retry with
    another N was refused as "the cell has trained with N = 3", and a later call without N trained with N = 3 in
    silence. The cell keeps its N (here none given: 1, and the warning that says so) until a call trains."""
    net, loss, opt = build("momentum")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt)
    model = ms_accum.Model_ACCU(cell)
    data = numpy_dataset(micro_batches((4,) * 8))
    with warnings.catch_warnings():  # N = 3 does not divide the sunk epoch; N = 16 is longer than the epoch
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(ValueError, match="'sink_size' must be a multiple" if sink else "16"):
            model.train(1, data, dataset_sink_mode=sink, gradient_accumulation_steps=3 if sink else 16)
    assert cell.gradient_accumulation_steps == 1 and cell.steps_name == "gradient_accumulation_steps"
    with pytest.warns(UserWarning, match=r"N \('gradient_accumulation_steps'\) was not given"):
        model.train(1, data, dataset_sink_mode=False)
    assert int(opt.global_step.asnumpy()[0]) == 8


@pytest.mark.parametrize("sink_size, error, message", [
    ("4", TypeError, r"but got '4' of type str\. Convert a number read from a command line: int\('4'\)\."),
    (None, TypeError, r"but got None of type NoneType\."),
    (2.5, TypeError, r"but got 2\.5 of type float\."),
    (True, TypeError, r"but got True of type bool\."),
    (0, ValueError, r"but got 0\.$"),
    (-4, ValueError, r"but got -4\.$")])
@pytest.mark.parametrize("sink", [True, False])
def test_a_sink_size_that_is_not_a_size_is_refused_naming_it(sink_size, error, message, sink):
    """A new user's trial: '4' and None ended in Python's formatting errors, -2 and 2.5 were told to be a
    multiple of N, and 0, -4 and True passed ms_accum to fail in MindSpore's words without the argument's name."""
    cell, _, opt = make_cell("plain", steps=4)
    with pytest.raises(error, match=r"For 'Model_ACCU.train', 'sink_size' must be -1 \(the dataset size\) or an int "
                                    r">= 1, " + message):
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 8)), dataset_sink_mode=sink,
                                        sink_size=sink_size)
    assert int(opt.global_step.asnumpy()[0]) == 0


def test_a_numpy_sink_size_is_taken():
    """MindSpore's Model refuses a numpy int as sink_size; ms_accum takes it as it takes one for N or epoch."""
    cell, _, opt = make_cell("plain", steps=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 8)), dataset_sink_mode=True,
                                        sink_size=np.int64(8))
    assert int(opt.global_step.asnumpy()[0]) == 2


def test_checkpoints_are_taken_at_update_boundaries(tmp_path):
    cell, _, _ = make_cell("plain", steps=3)
    saver = ModelCheckpoint(prefix="accu", directory=str(tmp_path), config=CheckpointConfig(save_checkpoint_steps=1))
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 6)), callbacks=[saver],
                                    dataset_sink_mode=False)
    saved = sorted(f for f in os.listdir(tmp_path) if f.endswith(".ckpt"))
    assert saved == ["accu-1_1.ckpt", "accu-1_2.ckpt"]
    for name in saved:
        params = ms.load_checkpoint(str(tmp_path / name))
        buffers = [v.asnumpy() for k, v in params.items() if k.startswith("accu_grads.")]
        assert buffers and not any(b.any() for b in buffers), f"{name} holds a half-filled window"


class TestBadInput:
    def test_network_must_be_an_accumulation_cell(self):
        net, loss, opt = build()
        with pytest.raises(TypeError, match=r"For 'Model_ACCU', 'network' must be a TrainAccuStepsCell or "
                                            r"TrainAccuStepsWithLossScaleCell, but got TrainOneStepCell"):
            ms_accum.Model_ACCU(nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt))

    def test_loss_and_optimizer_belong_to_the_cell(self):
        cell, _, opt = make_cell("plain")
        with pytest.raises(TypeError, match="'loss_fn' and 'optimizer' must be None"):
            ms_accum.Model_ACCU(cell, optimizer=opt)

    def test_accumulation_steps(self):
        cell, _, _ = make_cell("plain")
        with pytest.raises(ValueError, match="For 'Model_ACCU', 'accumulation_steps' [(]gradient_accumulation_steps[)] "
                                                 "must be an int >= 1, but got 0"):
            ms_accum.Model_ACCU(cell, accumulation_steps=0)

    @pytest.mark.parametrize("name", ["gradient_accumulation_steps", "mini_steps"])
    def test_a_bad_n_to_train_is_refused_as_such_beside_the_cells_own(self, name):
        """Model_ACCU.train(..., N=0) over a cell built with N = 2 was told N must be given once, not that 0 is no N
        (a new user's trial): the value is checked first, naming the argument as written."""
        net, loss, opt = build()
        model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt,
                                                                gradient_accumulation_steps=2))
        shown = "'mini_steps' [(]gradient_accumulation_steps[)]" if name == "mini_steps" else f"'{name}'"
        with pytest.raises(ValueError, match=rf"For 'Model_ACCU.train', {shown} must be an int >= 1, but got 0\."):
            model.train(1, numpy_dataset(micro_batches([4] * 4)), dataset_sink_mode=False, **{name: 0})
        assert int(opt.global_step.asnumpy()[0]) == 0

    @pytest.mark.parametrize("epoch, error", [(0, ValueError), (1.0, TypeError), (True, TypeError)])
    def test_epoch(self, epoch, error):
        cell, _, _ = make_cell("plain", steps=2)
        with pytest.raises(error, match=rf"For 'Model_ACCU.train', 'epoch' must be an int >= 1, but got {epoch!r}"):
            ms_accum.Model_ACCU(cell).train(epoch, numpy_dataset(micro_batches((4,) * 4)), dataset_sink_mode=False)

    @pytest.mark.parametrize("initial_epoch, error, got", [
        (1.0, TypeError, r"1.0 of type float. Pass the int 1"), (True, TypeError, "True of type bool"),
        (np.int64(0), TypeError, r"0 of type int64. Pass int\(initial_epoch\)"), (-1, ValueError, "-1"),
        (2, ValueError, "2")])
    def test_initial_epoch(self, initial_epoch, error, got):
        """A wrong type is a TypeError, as for 'epoch' (a float was refused as a ValueError); MindSpore's Model
        takes a Python int, so a numpy integer is refused too; the range is [0, epoch)."""
        cell, _, _ = make_cell("plain", steps=2)
        with pytest.raises(error, match=rf"For 'Model_ACCU.train', 'initial_epoch' must be an int in \[0, 2\), but "
                                        rf"got {got}"):
            ms_accum.Model_ACCU(cell).train(2, numpy_dataset(micro_batches((4,) * 4)), dataset_sink_mode=False,
                                            initial_epoch=initial_epoch)

    def test_dataset(self):
        cell, _, _ = make_cell("plain", steps=2)
        with pytest.raises(TypeError, match=r"For 'Model_ACCU.train', 'train_dataset' must be a batched "
                                            r"mindspore.dataset.Dataset \(each row one micro-batch\), but got list"):
            ms_accum.Model_ACCU(cell).train(1, micro_batches((4,) * 4), dataset_sink_mode=False)
        empty = numpy_dataset(micro_batches((4,) * 2)).batch(8, drop_remainder=True)
        with pytest.raises(ValueError, match=r"For 'Model_ACCU.train', 'train_dataset' must yield at least one batch "
                                             r"per epoch, but it is empty"):
            ms_accum.Model_ACCU(cell).train(1, empty, dataset_sink_mode=False)

    def test_numpy_integers_are_accepted(self):
        cell, _, opt = make_cell("plain", steps=4)
        model = ms_accum.Model_ACCU(cell, accumulation_steps=np.int32(2))
        model.train(np.int64(1), numpy_dataset(micro_batches((4,) * 4)), dataset_sink_mode=False)
        assert model.accumulation_steps == 2 and opt.global_step.asnumpy()[0] == 2

    def test_more_steps_than_an_epoch(self):
        cell, _, _ = make_cell("plain", steps=8)
        with pytest.raises(ValueError, match="'accumulation_steps' [(]gradient_accumulation_steps[)] must be <= the 5 "
                                             "micro-batches in an epoch, "
                                             "but got 8"):
            ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 5)), dataset_sink_mode=False)

    def test_learning_rate_schedule_counted_in_micro_batches(self):
        net, loss, _ = build()
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), nn.SGD(net.trainable_params(), [0.1] * 6),
                                           accumulation_steps=3)
        with pytest.warns(UserWarning, match=r"For 'Model_ACCU.train', the optimizer's learning-rate list has 6 "
                                             r"entries, one per micro-batch of this run, but the optimizer reads one "
                                             r"entry per update \(2 in this run\): a schedule built per "
                                             r"micro-batch is stretched 3 times .* this run ends at update 2 of "
                                             r"its 6\)"):
            ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 6)), dataset_sink_mode=False)

    def test_models_training_settings_belong_to_the_cell(self):
        """Model's loss scale and mixed precision act on the optimizer it would wrap, which the cell holds: refused
        with what to do instead (MindSpore's own refusal asked for the optimizer)."""
        cell, _, _ = make_cell("plain")
        with pytest.raises(TypeError, match=r"For 'Model_ACCU', 'loss_scale_manager' must be None because the "
                                            r"accumulation cell scales the loss itself, but got "
                                            r"DynamicLossScaleManager. Build the cell as "
                                            r"TrainAccuStepsWithLossScaleCell"):
            ms_accum.Model_ACCU(cell, loss_scale_manager=ms.amp.DynamicLossScaleManager())
        with pytest.raises(ValueError, match=r"For 'Model_ACCU', 'amp_level' must be 'O0' because the accumulation "
                                             r"cell, built before Model sees it, is the training network, but got "
                                             r"'O2'. Convert the network first, net = "
                                             r"mindspore.amp.auto_mixed_precision\(net, 'O2'\)"):
            ms_accum.Model_ACCU(cell, amp_level="O2")
        with pytest.raises(ValueError, match=r"'boost_level' must be 'O0' .* but got 'O1'"):
            ms_accum.Model_ACCU(cell, boost_level="O1")

    def test_build_is_refused(self):
        cell, _, _ = make_cell("plain")
        with pytest.raises(RuntimeError, match="'build' is not supported"):
            ms_accum.Model_ACCU(cell).build()

    def test_predict_is_refused_and_trains_nothing(self):
        """Model predicts with the network it was given, here the accumulation cell: predict(x, y) added the batch to
        the open window in silence, and the next train() applied it with its own first window (a new user's trial:
        3 updates instead of 2, the weights 6e-2 off the large batch's)."""
        cell, net, opt = make_cell("plain")
        model = ms_accum.Model_ACCU(cell)
        (x, y), = micro_batches((4,))
        before = optimizer_state(opt)
        with pytest.raises(RuntimeError, match=r"For 'Model_ACCU.predict', Model would predict with the network it "
                                               r"was given, the accumulation cell, whose call trains: .* Predict "
                                               r"with your network instead: mindspore.train.Model\(net\)"):
            model.predict(ms.Tensor(x), ms.Tensor(y))
        assert all(not buffer.asnumpy().any() for buffer in cell.accu_grads)
        assert all(np.array_equal(value, before[name]) for name, value in optimizer_state(opt).items())
        assert int(cell.accu_micro_steps.asnumpy()) == 0

    def test_a_cell_trained_by_an_earlier_model_keeps_its_n(self):
        """N given to train() sets a cell built without N; a later Model_ACCU over the same cell given another N is
        told the cell has trained with its N (it was told to build the cell without N, which the user had done)."""
        cell, _, opt = make_cell("plain", steps=1)
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 4)), gradient_accumulation_steps=2)
        assert cell.gradient_accumulation_steps == 2 and opt.global_step.asnumpy()[0] == 2
        with pytest.raises(ValueError, match=r"For 'Model_ACCU.train', 'gradient_accumulation_steps' needs N = 4, "
                                             r"but the cell has trained with N = 2 and its graphs hold it. Build a "
                                             r"new cell and Model_ACCU for another N."):
            ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 4)), gradient_accumulation_steps=4)
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 4)), gradient_accumulation_steps=2)
        assert opt.global_step.asnumpy()[0] == 4
        # a cell built with N, given another to train(): the message named 'gradient_accumulation_steps' twice
        given, _, _ = make_cell("plain", steps=2)
        with pytest.raises(ValueError, match=r"N must be given once, but the cell's 'accumulation_steps' is 2 and "
                                             r"this call's 'gradient_accumulation_steps' gives N = 4\. Leave N "
                                             r"out of this call to train with the cell's, pass Model_ACCU\(cell, "
                                             r"gradient_accumulation_steps=N\) to replace the cell's"):
            ms_accum.Model_ACCU(given).train(1, numpy_dataset(micro_batches((4,) * 4)), gradient_accumulation_steps=4)


# ------------------------------------------------------------------ sink mode, as far as a CPU runs it
class _Backend:
    """What the device would hold: the loop size in force (the last one registered), the host's view of the data
    queue, and a trace of the calls."""

    def __init__(self):
        self.iter_num = 1
        self.host = None
        self.events = []
        self.loop_sizes = []  # (loop size, phase) as the executor's init_dataset received them


class _SinkNet(nn.Cell):
    """In place of the GetNext wrapper, whose GetNext has no CPU kernel: one launch runs the real cell `loop`
    times on the next micro-batches of the data queue's dataset, read on the host, `loop` the loop size registered
    when its phase first ran (a device reads it when it compiles the phase)."""

    def __init__(self, network, backend):
        super().__init__(auto_prefix=False)
        self.network = network
        self.backend = backend
        self.loops = {}

    def __call__(self):  # pylint: disable=invalid-overridden-method
        loop = self.loops.setdefault(self.phase, self.backend.iter_num)
        self.backend.events.append(("run", self.phase, loop, self.network.accumulation))
        for _ in range(loop):
            out = self.network(*next(self.backend.host))
        return out


class _DeviceContext:
    """mindspore.context as a module sees it, reporting a GPU: Model's _train then takes the sink branch, and
    DatasetHelper builds a device's loop-sink queue."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def get_context(self, key):
        return "GPU" if key == "device_target" else self._real.get_context(key)


@pytest.fixture
def fake_device(monkeypatch):
    """
    Model_ACCU's sink mode with what a CPU can run of it run for real: MindSpore's DatasetHelper makes the data
    queue (a TransferDataset, fed by its send thread on the host, continued, stopped and released as on a device),
    and the executor's init_dataset takes each loop size (the queue's 1, the accumulation phase's N), as
    Model_ACCU's seams call them. Faked, because a CPU has no kernel for them: the device target MindSpore's Model
    and DatasetHelper read (a GPU), InitDataSetQueue (init_dataset is told not to run its graph) and GetNext (the
    cell runs its sunk steps on the dataset read on the host, :class:`_SinkNet`). What only a device shows: the
    sunk graph's loop on the device, GetNext reading the queue, and the queue's timing (docs/parallel.md, What was
    run where). Returns the :class:`_Backend` holding the trace.
    """
    backend = _Backend()
    monkeypatch.setattr(model_module, "context", _DeviceContext(model_module.context))
    monkeypatch.setattr(helper_module, "context", _DeviceContext(helper_module.context))
    init_dataset = cell_graph_executor.init_dataset

    def register_without_running(*args, **kwargs):
        backend.loop_sizes.append((args[1], kwargs.get("phase")))
        return init_dataset(*args, **dict(kwargs, need_run=False))
    monkeypatch.setattr(cell_graph_executor, "init_dataset", register_without_running)
    make_helper = ms_accum.Model_ACCU._make_sink_helper  # pylint: disable=protected-access

    def make_and_trace_helper(self, dataset, sink_size, dataset_sink_num):
        backend.events.append(("helper", sink_size, dataset_sink_num))
        helper = make_helper(self, dataset, sink_size, dataset_sink_num)
        for name in ("continue_send", "stop_send", "release"):
            setattr(helper, name, _traced(getattr(helper, name), backend.events, name))
        backend.host = dataset.create_tuple_iterator(num_epochs=dataset_sink_num)
        return helper
    register = ms_accum.Model_ACCU._register_loop_size  # pylint: disable=protected-access

    def register_and_trace(dataset, loop, phase):
        backend.events.append(("register", phase, loop))
        backend.iter_num = loop
        register(dataset, loop, phase)

    monkeypatch.setattr(ms_accum.Model_ACCU, "_make_sink_helper", make_and_trace_helper)
    monkeypatch.setattr(ms_accum.Model_ACCU, "_connect", lambda self, helper: _SinkNet(self._train_network, backend))
    monkeypatch.setattr(ms_accum.Model_ACCU, "_register_loop_size", staticmethod(register_and_trace))
    real_end = ms_accum.Model_ACCU._end_window  # pylint: disable=protected-access

    def end_window(self):
        backend.events.append(("end",))
        return real_end(self)
    monkeypatch.setattr(ms_accum.Model_ACCU, "_end_window", end_window)
    return backend


def _traced(call, events, name):
    def traced():
        events.append((name,))
        return call()
    return traced


class _EvalInTrain(Callback):
    """Imitates eval during training: the backbone leaves train mode at each epoch end."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def on_train_epoch_end(self, run_context):
        self.model._backbone_is_train = False  # pylint: disable=protected-access


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_sink_mode_alternates_two_graphs_per_window(fake_device, mode, capsys):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    n, batches = 3, micro_batches((4,) * 12)
    cell, net, _ = make_cell("plain", steps=n)
    model = ms_accum.Model_ACCU(cell)
    log = StepLog()
    model.train(2, numpy_dataset(batches), callbacks=[log, LossMonitor(1), _EvalInTrain(model)],
                dataset_sink_mode=True, sink_size=6)
    events = fake_device.events
    assert events[0] == ("helper", 6, 1)
    runs = [e for e in events if e[0] in ("run", "end")]
    accumulate, update = ms_accum.ACCUMULATE_PHASE, ms_accum.UPDATE_PHASE
    assert runs == [("run", accumulate, n, True), ("end",)] * 4  # N sunk steps, then the window's end
    registrations = [i for i, e in enumerate(events) if e[0] == "register"]
    assert [events[i] for i in registrations] == [("register", accumulate, n)]
    assert registrations[0] < events.index(runs[0])
    assert fake_device.loop_sizes == [(1, "dataset"), (n, accumulate + "_dataset")]  # the queue's, then the phase's
    assert events[-2:] == [("stop_send",), ("release",)]
    assert events.count(("continue_send",)) == 2
    assert log.steps == [(1, 1, 2), (1, 2, 2), (2, 3, 2), (2, 4, 2)]
    assert log.epochs == [(1, 2), (2, 4)]
    assert "epoch: 2 step: 2, loss is" in capsys.readouterr().out
    if mode == "graph":
        assert {key.split(".")[0] for key in cell.compile_cache} == {accumulate, update}
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), windows_of(batches, n),
                              context="sink")


def test_sink_mode_takes_n_from_the_global_batch(fake_device):
    cell, _, _ = make_cell("plain", steps=1)
    model = ms_accum.Model_ACCU(cell)
    model.train(1, numpy_dataset(micro_batches((4,) * 12)), dataset_sink_mode=True, sink_size=6,
                global_batch_size=12)
    runs = [e for e in fake_device.events if e[0] in ("run", "end")]
    assert runs == [("run", ms_accum.ACCUMULATE_PHASE, 3, True), ("end",)] * 2


def test_sink_size_must_be_a_multiple_of_the_window(fake_device):
    cell, _, _ = make_cell("plain", steps=4)
    with pytest.raises(ValueError, match=r"'sink_size' must be a multiple of gradient_accumulation_steps 4 in "
                                         r"dataset sink mode, but got -1, the dataset size 10\. Pass sink_size=k\*4"):
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 10)), dataset_sink_mode=True)
    with pytest.raises(ValueError, match=r"'sink_size' must be a multiple of gradient_accumulation_steps 4 in "
                                         r"dataset sink mode, but got 6\. Pass sink_size=k\*4"):
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 10)), dataset_sink_mode=True,
                                        sink_size=6)
    assert not fake_device.events


def _amp_o2(optimizer, seed):
    """:func:`helpers.build`'s network converted by mindspore.amp at level O2 (float16, BatchNorm and loss in
    float32)."""
    net, loss, opt = build(optimizer, seed)
    return amp.auto_mixed_precision(net, "O2"), loss, opt


CLIP_NORM = 0.05  # a tenth of the windows' gradient norms: every window is clipped
SINK_FEATURES = {  # the cell's arguments, the large batch it must equal, the precision of its rounding
    "clip_norm": (dict(clip_norm=CLIP_NORM), large_batch("momentum", CLIP_NORM), FLOAT32_ROUNDING),
    "raw_sum": (dict(average=False), large_batch("momentum", average=False), FLOAT32_ROUNDING),
    "noise_scale": (dict(noise_scale=True), large_batch("momentum"), FLOAT32_ROUNDING),
    "loss_scale": (dict(scale_sense=ms.Tensor(2.0 ** 10, ms.float32)), large_batch("momentum"), FLOAT32_ROUNDING),
    "mixed_precision_o2": (dict(make=_amp_o2), partial(reference_train, "momentum", make=_amp_o2), FLOAT16_ROUNDING),
}
GAINS = {FLOAT32_ROUNDING: ROUNDING_GAIN, FLOAT16_ROUNDING: FLOAT16_GAIN}


@pytest.mark.parametrize("feature", sorted(SINK_FEATURES))
def test_sink_mode_carries_the_cells_features(fake_device, feature):
    """In GRAPH_MODE, sink mode as far as a CPU runs it (fixture fake_device: the data queue made and fed, the
    loop sizes registered) trains the cell with each feature to the large batch's update, built without ms_accum:
    clipped by ops.clip_by_global_norm, the raw sum of the micro-batches' gradients, a static loss scale that
    changes nothing, the same network converted to float16 by amp O2 (float16's rounding); with the noise scale,
    every window's estimates equal the estimator on the micro-batches' value_and_grad gradients."""
    ms.set_context(mode=ms.GRAPH_MODE)
    kwargs, reference, rounding = SINK_FEATURES[feature]
    batches = micro_batches((4,) * 12)  # the one shape a device queue holds
    windows = [batches[i:i + 4] for i in range(0, 12, 4)]
    kwargs = dict(kwargs)
    net, loss, opt = kwargs.pop("make", build)("momentum", 0)
    cls = ms_accum.TrainAccuStepsWithLossScaleCell if "scale_sense" in kwargs else ms_accum.TrainAccuStepsCell
    cell = cls(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=4, **kwargs)
    noise = []
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(batches), dataset_sink_mode=True,
                                    callbacks=[_NoiseRecords(cell, noise)] if cell.measure_noise else None)
    assert [e for e in fake_device.events if e[0] in ("run", "end")] == \
        [("run", ms_accum.ACCUMULATE_PHASE, 4, True), ("end",)] * 3, "the sink branch was not taken"
    assert int(opt.global_step.asnumpy()[0]) == 3
    assert not any(p.asnumpy().any() for p in cell.accu_grads), "buffers not cleared at the last window's end"
    assert_equals_large_batch(params_of(net), reference, windows, context=f"sink with {feature}", rounding=rounding,
                              gain=GAINS[rounding])
    if cell.measure_noise:
        assert_noise_records_match(noise, noise_reference("momentum", windows), windows, context="sink")


class _NoiseRecords(Callback):
    """Each update's noise records (grad_sq, noise_trace and their smoothed values), read into `records`."""

    def __init__(self, cell, records):
        super().__init__()
        self.cell, self.records = cell, records

    def on_train_step_end(self, run_context):
        self.records.append([float(value.asnumpy()) for value in self.cell.noise_records])


@pytest.mark.parametrize("changing", [{0: 1, 2: 2}, "adaptive"], ids=["schedule", "adaptive"])
def test_sink_mode_refuses_n_that_changes(fake_device, changing):
    """Sink mode compiles its accumulation graph for a loop of N: a schedule or a policy is refused, naming what to
    use instead (the same cell trains without sink: tests/test_schedule.py)."""
    net, loss, optimizer = build("momentum")
    steps = ms_accum.AdaptiveAccumulation(2, 4) if changing == "adaptive" else changing
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=steps,
                                       noise_scale=True)
    with pytest.raises(ValueError, match=r"For 'Model_ACCU.train', the cell's 'gradient_accumulation_steps' must be "
                                         r"one int in dataset sink mode: .* Train with dataset_sink_mode=False"):
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 8)), dataset_sink_mode=True)
    assert not fake_device.events


@pytest.mark.parametrize("kwargs", [dict(resume_from="state.ckpt"), dict(state_path="state.ckpt", every=1)],
                         ids=["resume_from", "state_path"])
def test_sink_mode_refuses_exact_state(fake_device, kwargs, tmp_path):
    """Exact state is written and read between micro-batches, which sink mode does not return to Python for."""
    cell, _, _ = make_cell("plain", steps=2)
    every = kwargs.pop("every", 0)
    if "state_path" in kwargs:
        model = ms_accum.Model_ACCU(cell, state_path=str(tmp_path / kwargs.pop("state_path")),
                                    save_state_every=every)
    else:
        model = ms_accum.Model_ACCU(cell)
        kwargs["resume_from"] = str(tmp_path / kwargs["resume_from"])
    with pytest.raises(ValueError, match=r"For 'Model_ACCU.train', exact state saving and 'resume_from' work "
                                         r"without dataset sink mode; pass dataset_sink_mode=False, or resume at an "
                                         r"epoch with 'initial_epoch'"):
        model.train(1, numpy_dataset(micro_batches((4,) * 4)), dataset_sink_mode=True, **kwargs)
    assert not fake_device.events


def _gpu_unavailable_reason():
    probe = subprocess.run([sys.executable, "-c", "import mindspore as ms; ms.set_device('GPU'); "
                            "print(ms.ops.ones((1,), ms.float32).asnumpy())"], capture_output=True, text=True,
                           timeout=300, check=False)
    if probe.returncode != 0:
        lines = [line for line in probe.stderr.splitlines() if "Error" in line or "Unsupported" in line]
        return "no GPU usable by MindSpore here: " + (lines[-1] if lines else f"exit {probe.returncode}")[:200]
    return None


@pytest.mark.slow
def test_real_sink_mode_on_gpu():
    reason = _gpu_unavailable_reason()
    if reason:
        pytest.skip(reason)
    script = os.path.join(os.path.dirname(__file__), "sink_worker.py")
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sink equivalence ok" in proc.stdout


def _two_device_cell(monkeypatch, rows=None):
    """A TrainAccuStepsCell that sees 2 devices (rank 0), its AllGather of the devices' checks answering `rows`
    (rank 1's row; rank 0's is its own): the checks' logic without msrun (test_data_parallel.py runs them on 2
    ranks)."""
    import ms_accum.trainers.devices as devices  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(devices, "rank_and_world", lambda cell: (0, 2))
    if rows is not None:
        monkeypatch.setattr(devices, "gather_ints", lambda values, world: [list(values), rows(list(values))])
    net = nn.Dense(3, 2)
    return ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                       gradient_accumulation_steps=2)


def test_data_parallel_devices_must_take_one_learning_rate_rule(monkeypatch):
    """A new user's trial on 2 msrun ranks built rank 0's cell with reference_batch 40 and rank 1's with 80: both
    trained to the end, their weights apart, in silence. Each rank's rule and G0 are gathered with N."""
    import ms_accum.trainers.devices as devices  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(devices, "rank_and_world", lambda cell: (0, 2))
    net = nn.Dense(3, 2)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                       gradient_accumulation_steps=2, lr_scaling="linear", reference_batch=40)
    rows = {}
    monkeypatch.setattr(devices, "gather_ints",
                        lambda values, world: [list(values), rows["rank 1"](list(values))])
    eighty = int(np.float32(80).view(np.int32))
    for rank_1, shown in (([1, eighty], "'linear' at reference_batch=40, 'linear' at reference_batch=80"),
                          ([2, eighty], "'linear' at reference_batch=40, 'sqrt' at reference_batch=80"),
                          ([0, 0], "'linear' at reference_batch=40, 'none' at reference_batch=None "
                                   "\\(the first window's items\\)")):
        rows["rank 1"] = lambda mine, rank_1=rank_1: mine[:4] + [1] + rank_1  # its own shard, another rule
        with pytest.raises(ValueError, match=rf"For 'Model_ACCU.train', the learning-rate rule \('lr_scaling' and "
                                             rf"'reference_batch'\) must be the same on every device, but they take "
                                             rf"{shown} \(by rank\): the devices would step the same reduced "
                                             rf"gradient at other rates.*Build every device's cell with the same "
                                             rf"'lr_scaling' and 'reference_batch'\."):
            check_devices_agree("Model_ACCU.train", cell, _sharded(2, 0))
    rows["rank 1"] = lambda mine: mine[:4] + [1] + mine[5:]  # the same rule and G0, its own shard: taken
    check_devices_agree("Model_ACCU.train", cell, _sharded(2, 0))


def test_data_parallel_devices_given_other_global_batches_are_told_each_ones(monkeypatch):
    """Ranks given global_batch_size 16 and 32 (micro-batches of 4 on 2 devices: N 2 and 4) were refused naming the
    N each derived, not the global batch each was given (the last stop's note)."""
    cell = _two_device_cell(monkeypatch, rows=lambda mine: mine[:1] + [4, mine[2] + 1, 4, 1] + mine[5:])
    cell.set_gradient_accumulation_steps(2, arg_name=DERIVED_STEPS_NAME)
    with pytest.raises(ValueError, match=r"For 'Model_ACCU.train', 'N = global_batch_size / \(devices x "
                                         r"micro-batch\)' must be the same on every device, but they take 2 "
                                         r"\(global_batch_size 16\), 4 \(global_batch_size 32\) \(by rank; this "
                                         r"device 2\)"):
        check_devices_agree("Model_ACCU.train", cell, _sharded(2, 0))


def _sharded(num_shards, shard_id, batch=4):
    return ds.NumpySlicesDataset({"x": np.zeros((32, 3), np.float32), "y": np.zeros((32, 2), np.float32)},
                                 num_shards=num_shards, shard_id=shard_id, shuffle=False).batch(batch)


@pytest.mark.parametrize("path", ["three_cells", "accu_steps", "accumulator", "driver"])
def test_a_data_parallel_context_without_init_is_refused_when_the_cell_is_built(path):
    """A new user's trial set DATA_PARALLEL but forgot mindspore.communication.init(): a segmentation fault at the
    first window's end, no message (MindSpore's TrainOneStepCell does the same). Every path refuses it when built."""
    net = nn.Dense(3, 2)
    opt = nn.SGD(net.trainable_params(), 0.1)
    build = {"three_cells": lambda: ms_accum.TrainForwardBackward(nn.WithLossCell(net, nn.MSELoss()), opt,
                                                                  opt.parameters.clone(prefix="grad_sum",
                                                                                       init="zeros")),
             "accu_steps": lambda: ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), opt,
                                                               gradient_accumulation_steps=2),
             "accumulator": lambda: ms_accum.Accumulator(opt, gradient_accumulation_steps=2),
             "driver": lambda: ms_accum.GradientAccumulation(net, nn.MSELoss(), opt)}[path]
    owner = {"three_cells": "TrainForwardBackward", "accu_steps": "TrainAccuStepsCell", "accumulator": "Accumulator",
             "driver": "GradientAccumulation"}[path]
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL)
    try:
        with pytest.raises(RuntimeError, match=rf"^For '{owner}', the parallel mode is 'data_parallel', which "
                                               r"reduces gradients across devices, but their communication is not "
                                               r"initialized\. Call mindspore.communication.init\(\) before"):
            build()
    finally:
        ms.reset_auto_parallel_context()
    build()  # on one device


def test_one_of_several_processes_training_alone_is_warned_of(monkeypatch, recwarn):
    """A new user's trial on 2 msrun ranks called init() (or not even that) but set no data-parallel context: both
    trainers trained each rank alone on its shard, no gradient reduced, the ranks' weights 0.04 apart after two
    updates, in silence. A cell on one device now warns of processes that called init() (a seam: 2 of them) and of
    a dataset sharded for several; a whole dataset on a lone process is taken quietly."""
    import mindspore.communication as communication  # pylint: disable=import-outside-toplevel
    from mindspore.communication.management import GlobalComm  # pylint: disable=import-outside-toplevel
    net = nn.Dense(3, 2)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                       gradient_accumulation_steps=2)
    with pytest.warns(UserWarning, match=r"For 'Model_ACCU.train', the dataset is sharded into 2 shards "
                                         r"\(num_shards\), but the cell trains on one device \(no "
                                         r"mindspore.communication.init\(\), parallel mode 'stand_alone'\): it reads "
                                         r"1/2 of the data, alone.*on one device, pass num_shards=1\."):
        check_sharding("Model_ACCU.train", cell, _sharded(2, 0))
    recwarn.clear()
    assert check_sharding("Model_ACCU.train", cell, _sharded(1, 0)) and not recwarn.list
    check_sharding("Model_ACCU.train", cell, _sharded(None, None))
    assert not recwarn.list
    monkeypatch.setattr(GlobalComm, "INITED", True)
    monkeypatch.setattr(communication, "get_group_size", lambda *args: 2)
    with pytest.warns(UserWarning, match=r"this process is one of 2 \(mindspore.communication.init\(\) was "
                                         r"called\), but the cell trains on one device \(parallel mode "
                                         r"'stand_alone'\): every process trains alone on its data, no gradient is "
                                         r"reduced across them, and their weights part.*DATA_PARALLEL"):
        check_sharding("Model_ACCU.train", cell, _sharded(2, 0))


def test_data_parallel_sharding_and_micro_batches_are_checked_as_they_are(monkeypatch):
    """A new user's trial on 2 msrun ranks: num_shards=4 on 2 devices was warned of as not sharded ("every device
    trains on every sample"), where half the data went unread; the same shard_id on both ranks passed silently
    (every sample twice in a window); micro-batches of 4 and 2 were refused as unequal dataset sizes, with advice
    that did not fit."""
    cell = _two_device_cell(monkeypatch)
    with pytest.warns(UserWarning, match=r"the dataset is sharded into 4 shards \(num_shards\), but there are 2 "
                                         r"devices: each device reads 1/4 of the data, so part of the data is never "
                                         r"trained on .* Pass num_shards=2, shard_id=<rank>\."):
        assert not check_sharding("Model_ACCU.train", cell, _sharded(4, 0))
    with pytest.warns(UserWarning, match=r"the dataset is not sharded over the 2 devices: unless each device reads "
                                         r"data of its own, every device trains on every sample"):
        check_sharding("Model_ACCU.train", cell, _sharded(None, None))
    cell = _two_device_cell(monkeypatch, rows=lambda mine: mine)  # rank 1 reads shard 0 too
    with pytest.raises(ValueError, match=r"For 'Model_ACCU.train', every device must read a shard of its own, but "
                                         r"their shard_ids are \[0, 0\] \(by rank\): a window would hold the same "
                                         r"samples on several devices\. Pass shard_id=<rank>"):
        check_devices_agree("Model_ACCU.train", cell, _sharded(2, 0))
    cell = _two_device_cell(monkeypatch, rows=lambda mine: [8] + mine[1:3] + [2, 1] + mine[5:])  # batched at 2
    with pytest.raises(ValueError, match=r"every device must run as many micro-batches an epoch and the same N, "
                                         r"but the devices batch their data at \[4, 2\] samples \(by rank\), which "
                                         r"gives them \[4, 8\] micro-batches.* Batch every device's data at one "
                                         r"size\."):
        check_devices_agree("Model_ACCU.train", cell, _sharded(2, 0))
    # other sizes in windows of the same count are weighed by their samples: taken
    cell = _two_device_cell(monkeypatch, rows=lambda mine: mine[:3] + [2, 1] + mine[5:])
    check_devices_agree("Model_ACCU.train", cell, _sharded(2, 0))
    cell = _two_device_cell(monkeypatch, rows=lambda mine: mine[:4] + [1] + mine[5:])
    check_devices_agree("Model_ACCU.train", cell, _sharded(2, 0))
