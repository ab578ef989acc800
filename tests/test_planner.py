"""plan_micro_batch: the memory model's fit, the plan's choice and its errors; the trainers taking a plan (on two
devices: test_planner_data_parallel.py; a window rerun with half the micro-batch after a device out-of-memory
error: test_out_of_memory.py)."""
import gc
import os
import sys
from functools import partial

import numpy as np
import pytest

import mindspore as ms

import ms_accum
from ms_accum.trainers.memory_probe import reset_peak_memory
from ms_accum.trainers.planner import MemoryModel, format_bytes, micro_batch_candidates, parse_memory
from helpers import assert_equals_large_batch, build, micro_batches, numpy_dataset, params_of, reference_train

MIB = 2 ** 20


def linear_measure(fixed_mib, per_sample_mib, noise_mib=0.0, seed=0, log=None):
    """A measure of peak = fixed + per_sample * b (+ normal noise), recording the sizes asked for in `log`."""
    rng = np.random.default_rng(seed)

    def measure(b):
        if log is not None:
            log.append(b)
        peak = (fixed_mib + per_sample_mib * b + rng.normal(0.0, noise_mib)) * MIB
        return ms_accum.Measurement(b, int(peak), 1000.0 * b / (b + 8))
    return measure


def test_the_fit_recovers_a_line_and_its_noise_within_its_standard_error():
    sizes = [1, 2, 4, 8, 16, 32]
    exact = MemoryModel.fit([ms_accum.Measurement(b, int((300 + 7.5 * b) * MIB)) for b in sizes])
    assert abs(exact.fixed / MIB - 300) < 1e-5 and abs(exact.per_sample / MIB - 7.5) < 1e-6
    # with noise of sigma 4 MiB, the slope's standard error is sigma / sqrt(sum((b - mean)^2))
    sigma = 4.0
    spread = np.sqrt(sum((b - np.mean(sizes)) ** 2 for b in sizes))
    measure = linear_measure(300, 7.5, noise_mib=sigma, seed=3)
    noisy = MemoryModel.fit([measure(b) for b in sizes])
    assert abs(noisy.per_sample / MIB - 7.5) <= 4 * sigma / spread, noisy


@pytest.mark.parametrize("devices", [1, 2, 4])
def test_the_plan_is_the_largest_exact_micro_batch_that_fits(devices):
    """G = 96: every b with b x N x devices = 96; peaks of 200 MiB + 10 MiB a sample under a 500 MiB budget fit
    b <= 30: the plan takes the largest divisor of 96 / devices up to 30."""
    asked = []
    plan = ms_accum.plan_micro_batch(linear_measure(200, 10, log=asked), 96, "500MiB", devices=devices,
                                     verbose=False)
    per_device = 96 // devices
    want = max(b for b in range(1, 31) if per_device % b == 0)
    assert (plan.micro_batch, plan.steps) == (want, per_device // want)
    assert plan.micro_batch * plan.steps * devices == 96
    assert asked == sorted(asked[:2]) + asked[2:] and asked[0] == 1 and len(asked) <= 4
    assert plan.measured(plan.micro_batch) is not None, "the chosen size is measured, not only predicted"
    assert plan.measured(plan.micro_batch).peak <= 500 * MIB
    assert str(plan).startswith(f"plan: micro-batch {want} x N {per_device // want} x {devices} device(s) = "
                                f"global batch 96; peak measured")
    table = plan.table()
    assert f"| {want} (chosen) | {per_device // want} |" in table
    assert table.count("\n") == len(micro_batch_candidates(96, devices)) + 1


def test_a_measured_peak_above_the_budget_moves_the_plan_down():
    """Memory that grows faster than the first two sizes say (a second arena from 24 samples on): the predicted
    fit is measured, found over, and the next size down is measured and taken."""
    def measure(b):
        return ms_accum.Measurement(b, int((200 + 10 * b + (400 if b >= 24 else 0)) * MIB))
    plan = ms_accum.plan_micro_batch(measure, 96, "500MiB", verbose=False)
    assert plan.micro_batch == 16 and plan.steps == 6
    assert [m.micro_batch for m in plan.measurements] == [1, 12, 24, 16]


def test_fastest_takes_the_best_speed_among_the_measured_sizes_that_fit():
    speeds = {1: 100.0, 12: 900.0, 24: 700.0}

    def measure(b):
        return ms_accum.Measurement(b, int((200 + 10 * b) * MIB), speeds.get(b, 500.0))
    assert ms_accum.plan_micro_batch(measure, 96, "500MiB", prefer="fastest", verbose=False).micro_batch == 12
    assert ms_accum.plan_micro_batch(measure, 96, "500MiB", verbose=False).micro_batch == 24


def test_the_plan_is_printed_as_a_table_and_one_line(capsys):
    ms_accum.plan_micro_batch(linear_measure(200, 10), 32, "1GiB")
    out = capsys.readouterr().out
    assert "plan: micro-batch 1: peak 210 MiB" in out
    assert "| b | N | predicted peak | measured peak | samples/s | fits |" in out
    assert out.strip().splitlines()[-1].startswith("plan: micro-batch 32 x N 1 x 1 device(s) = global batch 32")


def test_bad_input_is_refused_before_anything_is_measured_or_trained():
    asked = []
    measure = linear_measure(200, 10, log=asked)
    refusal = (r"For 'plan_micro_batch', 'max_memory' must hold the smallest micro-batch \(1\), which peaked at 210 "
               r"MiB, but got 100 MiB. Raise 'max_memory' to at least 210 MiB")
    with pytest.raises(ms_accum.MemoryBudgetError, match=refusal) as refused:
        ms_accum.plan_micro_batch(measure, 64, "100MiB", verbose=False)
    assert (refused.value.micro_batch, refused.value.peak, refused.value.budget) == (1, 210 * MIB, 100 * MIB)
    assert asked == [1], "after the smallest size does not fit, nothing more is measured"
    asked.clear()
    with pytest.raises(ValueError, match=r"'global_batch_size' must be a multiple of the 4 devices, .* but got 30. "
                                         r"The nearest valid values: 28 and 32."):
        ms_accum.plan_micro_batch(measure, 30, "1GiB", devices=4, verbose=False)
    with pytest.raises(ValueError, match=r"'global_batch_size' must be an int >= 1, but got 0"):
        ms_accum.plan_micro_batch(measure, 0, "1GiB", verbose=False)
    with pytest.raises(ValueError, match=r"'prefer' must be one of \['largest', 'fastest'\], but got 'small'"):
        ms_accum.plan_micro_batch(measure, 32, "1GiB", prefer="small", verbose=False)
    with pytest.raises(TypeError, match=r"'global_batch_size' must be an int >= 1, but got '256' of type str"):
        ms_accum.plan_micro_batch(measure, "256", "1GiB", verbose=False)
    with pytest.raises(TypeError, match=r"'measure' must return a Measurement, but returned int for micro-batch 1\. "
                                        r"Pass InProcessMeasure\(run_at\) or FreshProcessMeasure\(command\)"):
        ms_accum.plan_micro_batch(lambda b: 5, 32, "1GiB", verbose=False)
    # a new user's trial: a measure returning another size's Measurement had its peak filed under the size asked for
    with pytest.raises(ValueError, match=r"'measure' must return the Measurement of the micro-batch it was asked for, "
                                         r"but returned one of micro-batch 2 when asked for 1\. Run and measure at "
                                         r"the size it is called with"):
        ms_accum.plan_micro_batch(lambda b: ms_accum.Measurement(2 * b, 100 * MIB), 32, "1GiB", verbose=False)
    # a new user's trial: world=0 reached MindSpore's AllGather after the first measurement; measure=5 failed as
    # "'int' object is not callable"
    for world, error in ((0, ValueError), (2.5, TypeError), ("2", TypeError)):
        with pytest.raises(error, match=rf"For 'plan_micro_batch', 'world' must be an int >= 1, but got "
                                        rf"{world!r}"):
            ms_accum.plan_micro_batch(measure, 32, "1GiB", world=world, verbose=False)
    with pytest.raises(TypeError, match=r"'measure' must be a callable taking a micro-batch size and returning a "
                                        r"Measurement, but got int\. Pass InProcessMeasure\(run_at\) or "
                                        r"FreshProcessMeasure\(command\)\."):
        ms_accum.plan_micro_batch(5, 32, "1GiB", verbose=False)
    assert not asked


@pytest.mark.parametrize("text, size", [("3GiB", 3 * 2 ** 30), ("512MiB", 512 * MIB), ("2.5G", int(2.5 * 2 ** 30)),
                                        ("1GB", 10 ** 9), (4096, 4096), (" 64 mib ", 64 * MIB),
                                        ("3.3GB", 33 * 10 ** 8), ("0.1G", round(0.1 * 2 ** 30)),
                                        (np.int64(2 ** 30), 2 ** 30)])
def test_memory_sizes_are_read_as_written(text, size):
    assert parse_memory(text) == size


def test_a_budget_below_a_kibibyte_is_shown_in_bytes():
    """max_memory=100 was refused as "but got 0 KiB"."""
    assert [format_bytes(size) for size in (100, 2048, 5 * MIB, 3 * 2 ** 30)] == \
        ["100 bytes", "2 KiB", "5 MiB", "3.00 GiB"]


@pytest.mark.parametrize("value, error, message", [
    ("3 gigs", ValueError, r"'max_memory' must be a size such as '3GiB', '512MiB' or '2.5G' \(powers of 1024\), "
                           r"'3GB' \(of 1000\), or a whole number of bytes, but got '3 gigs'"),
    ("0MiB", ValueError, r"'max_memory' must be > 0, but got '0MiB'"),
    # a new user's trial: '-1GiB' was told as no size, and '1.5B' taken as 1 byte
    ("-1GiB", ValueError, r"'max_memory' must be > 0, but got '-1GiB'"),
    ("1.5B", ValueError, r"'max_memory' must be a whole number of bytes, but got '1.5B'\. Pass a size in a larger "
                         r"unit"),
    (3.5, TypeError, r"'max_memory' must be an int \(bytes\) or a str such as '3GiB', but got float"),
])
def test_bad_memory_sizes_are_refused(value, error, message):
    with pytest.raises(error, match=rf"For 'plan_micro_batch', {message}"):
        parse_memory(value)


def test_a_fresh_process_measure_reads_the_json_line_and_reports_a_failure():
    script = ("import json, sys; b = int(sys.argv[1]); print('compiling'); "
              "print(json.dumps({'peak': (100 + b) * 2 ** 20, 'samples_per_second': 10.0 * b}))")
    measure = ms_accum.FreshProcessMeasure([sys.executable, "-c", script, "{micro_batch}"])
    found = measure(8)
    assert (found.micro_batch, found.peak, found.samples_per_second) == (8, 108 * MIB, 80.0)
    failing = ms_accum.FreshProcessMeasure([sys.executable, "-c", "import sys; sys.exit('no memory {micro_batch}')"])
    with pytest.raises(RuntimeError, match=r"measuring micro-batch 4 failed \(exit code 1, no measurement printed\)"
                                           r"(.|\n)*no memory 4"):
        failing(4)
    with pytest.raises(ValueError, match=r"'command' must hold '\{micro_batch\}'"):
        ms_accum.FreshProcessMeasure([sys.executable, "-c", "pass"])


def test_a_fresh_process_measures_with_the_compile_cache_off(monkeypatch, tmp_path):
    """The compile cache hands its graphs out by their order: each size measured would run the graphs of the size
    before it (a new user's trial: micro-batch 32 peaked below micro-batch 1, then 256 was refused by ms_accum's
    check of the cache), and a graph loaded is not compiled, whose memory the peak must hold. Off in the process
    whatever the environment given, also in one started ahead."""
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    script = tmp_path / "measure.py"
    script.write_text("import json, os, sys\n"
                      "off = os.environ['MS_COMPILER_CACHE_ENABLE'] == '0'\n"
                      "print(json.dumps({'peak': int(sys.argv[1]) + off}))\n")
    for env in (None, dict(os.environ, MS_COMPILER_CACHE_ENABLE="1")):
        for preload in ((), ("json",)):
            with ms_accum.FreshProcessMeasure([sys.executable, str(script), "{micro_batch}"], env=env,
                                              preload=preload) as measure:
                assert measure(2).peak == 3, f"the cache was on with env={env is not None}, preload={preload}"


# ---------------------------------------------------------------- the trainers take a plan

def _plan(micro_batch, steps, devices=1):
    model = MemoryModel(100.0 * MIB, MIB)
    return ms_accum.MicroBatchPlan(micro_batch, steps, devices, micro_batch * steps * devices, 2 ** 30,
                                   model.predict(micro_batch), model)


def test_the_driver_and_model_accu_train_with_a_plan_and_refuse_a_dataset_batched_otherwise():
    batches = micro_batches([4] * 4)
    trainer, net, _ = build_driver()
    trainer.train_process(1, numpy_dataset(batches), plan=_plan(4, 2), ckpt_path=None, log_every=0)
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches[0:2], batches[2:4]],
                              context="the driver, plan")
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation.train_process', the dataset must be batched at "
                                         r"the plan's micro-batch \(8\), but it is batched at 4. Batch it with "
                                         r"plan.micro_batch"):
        build_driver()[0].train_process(1, numpy_dataset(batches), plan=_plan(8, 2), ckpt_path=None)
    with pytest.raises(TypeError, match=r"pass only one of 'gradient_accumulation_steps', 'global_batch_size' and "
                                        r"'plan'"):
        build_driver()[0].train_process(1, numpy_dataset(batches), 2, plan=_plan(4, 2), ckpt_path=None)
    net, loss, opt = build("momentum")
    cell = ms_accum.TrainAccuStepsCell(ms.nn.WithLossCell(net, loss), opt)
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(batches), dataset_sink_mode=False, plan=_plan(4, 2))
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches[0:2], batches[2:4]],
                              context="Model_ACCU, plan")
    net, loss, opt = build("momentum")
    model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(ms.nn.WithLossCell(net, loss), opt))
    with pytest.raises(ValueError, match=r"For 'Model_ACCU.train', the dataset must be batched at the plan's "
                                         r"micro-batch \(8\), but it is batched at 4"):
        model.train(1, numpy_dataset(batches), dataset_sink_mode=False, plan=_plan(8, 2))


def build_driver():
    net, loss, opt = build("momentum")
    return ms_accum.GradientAccumulation(net, loss, opt), net, opt


def test_a_peak_that_grows_in_steps_is_measured_above_the_choice_and_the_plan_is_tight():
    """Peaks grow with the memory pool's chunks as much as with the sample (ResNet18 on CPU: 726 MiB at 1, 817 at 8,
    818 at 16): the line through 1 and 8 predicts 16 over a 900 MiB budget. The plan measures 16 anyway, finds it
    fits, and takes it; 32, measured too, goes over: the plan is measured on both sides."""
    peaks = {1: 726, 2: 740, 4: 770, 8: 817, 16: 818, 32: 950, 64: 1300}
    asked = []

    def measure(b):
        asked.append(b)
        return ms_accum.Measurement(b, peaks[b] * MIB)
    plan = ms_accum.plan_micro_batch(measure, 64, "900MiB", verbose=False)
    assert (plan.micro_batch, plan.steps) == (16, 4), (plan, asked)
    assert asked[:2] == [1, 8] and 32 in asked and len(asked) <= 4, asked
    # a line that holds: the size above the choice is measured, over the budget, and the choice stays
    asked.clear()
    plan = ms_accum.plan_micro_batch(linear_measure(200, 10, log=asked), 64, "500MiB", verbose=False)
    assert plan.micro_batch == 16 and asked[-1] == 32 and plan.measured(32).peak > 500 * MIB, asked


def test_a_measure_started_ahead_runs_each_size_in_a_fresh_process_that_imported_first(tmp_path):
    """preload: the next measuring process starts while one measures and imports the modules named; each size
    still runs in its own process, the script as __main__ beside its own modules; close() ends the one waiting;
    a failing script's error names the size and ends with its standard error."""
    (tmp_path / "sibling.py").write_text("OFFSET = 7\n")
    script = tmp_path / "measure.py"
    script.write_text("import json, os, sys\nfrom sibling import OFFSET\nif sys.argv[1] == '13':\n"
                      "    sys.exit('no memory for 13')\nimported = 'decimal' in sys.modules\n"
                      "print(json.dumps({'peak': (int(sys.argv[1]) + OFFSET + 1000 * imported) * 2 ** 20, "
                      "'samples_per_second': float(os.getpid())}))\n")
    command = [sys.executable, str(script), "{micro_batch}"]
    assert ms_accum.FreshProcessMeasure(command)(3).peak == 10 * MIB, "decimal is imported without preload"
    with ms_accum.FreshProcessMeasure(command, preload=("decimal",)) as measure:
        first, second = measure(3), measure(5)
        waiting = measure._ahead[0]  # pylint: disable=protected-access
        assert waiting.poll() is None, "no process waits for the next measurement"
        with pytest.raises(RuntimeError, match=r"(?s)measuring micro-batch 13 failed \(exit code 1, no "
                                               r"measurement printed\).*no memory for 13"):
            measure(13)
    assert (first.peak, second.peak) == (1010 * MIB, 1012 * MIB)
    assert first.samples_per_second != second.samples_per_second, "two sizes measured in one process"
    assert waiting.poll() is not None and measure._ahead[0] is None  # pylint: disable=protected-access
    with pytest.raises(ValueError, match=r"'command' must be \[python, script.py, \*arguments\]"):
        ms_accum.FreshProcessMeasure([sys.executable, "-c", "pass", "{micro_batch}"], preload=("decimal",))
    with pytest.raises(TypeError, match="'preload' must be a list of module names"):
        ms_accum.FreshProcessMeasure(command, preload="decimal")


def test_a_measuring_process_reads_its_own_peak_not_its_parents():
    """Linux carries ru_maxrss across exec from the process that started the child: a measuring process started by
    a pytest worker of 4 GiB read 4.18 GiB for a small model. The peak a child reports must be its own, here well
    below the 600 MiB this process touches first."""
    import resource  # pylint: disable=import-outside-toplevel
    held = bytearray(600 * MIB)
    for index in range(0, len(held), 4096):
        held[index] = 1
    parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    script = ("import json\nfrom ms_accum.trainers.memory_probe import resident_peak\n"
              "print(json.dumps({'peak': resident_peak()}))\n")
    child = ms_accum.FreshProcessMeasure([sys.executable, "-c", script, "{micro_batch}"])(1).peak
    del held
    assert child < parent - 400 * MIB, (child / MIB, parent / MIB)


def allocating_run_at(mib_per_sample):
    """A `run_at` for InProcessMeasure that touches `mib_per_sample` MiB a sample, frees it, and returns the samples:
    its peak grows with b exactly, with nothing left behind."""
    def run_at(b):
        held = np.ones(b * mib_per_sample * MIB // 8)  # written: resident
        del held
        return b
    return run_at


def test_in_process_sizes_each_read_their_own_peak_and_plan_as_in_fresh_processes():
    """A new user's trial planned planning.md's MLP in this process at a tight budget and got micro-batch 1, 40 times
    slower than 32: the process's peak never fell, so every size measured after a larger one read that one's peak
    (486, 509, 531, 553 MiB in measuring order). Each size now reads its own peak: 8 MiB after 64 MiB here, and the
    plan under a budget between 32 and 64 samples of 2 MiB is 32, the largest that fits."""
    measure = ms_accum.InProcessMeasure(allocating_run_at(1))
    gc.collect()
    large, small = measure(64).peak, measure(8).peak
    assert small < large - 40 * MIB, (small / MIB, large / MIB)
    gc.collect()
    base = ms_accum.trainers.memory_probe.resident_peak() if reset_peak_memory() else None
    assert base is not None, "/proc/self/clear_refs could not be written: the peak cannot be reset here"
    plan = ms_accum.plan_micro_batch(ms_accum.InProcessMeasure(allocating_run_at(2)), 64, base + 100 * MIB,
                                     verbose=False)
    assert (plan.micro_batch, plan.steps) == (32, 2), plan
