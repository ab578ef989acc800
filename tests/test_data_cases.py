"""conftest.py's --data-cases=first, which .ci/run gives the oldest MindSpore release: one case of each test's data
parameters, every case of what it builds."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collected(*args):
    """The test ids pytest collects with `args` (in a fresh process: the option acts at collection)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_first_data_cases_keep_every_mode_and_feature_and_one_case_of_the_numbers():
    names = ("tests/test_single_device.py::test_window_equals_one_large_batch_step",
             "tests/test_model_accu.py::test_sink_mode_refuses_n_that_changes",
             "tests/test_schedule.py::test_bad_schedules_are_refused")
    every = collected(*(name.split("::")[0] for name in names), "-k",
                      "one_large_batch_step or sink_mode_refuses_n_that_changes or bad_schedules_are_refused")
    first = collected(*(name.split("::")[0] for name in names), "--data-cases=first", "-k",
                      "one_large_batch_step or sink_mode_refuses_n_that_changes or bad_schedules_are_refused")
    windows = [test for test in first if names[0] in test]
    # optimizer x sizes x N x mode: one optimizer, the equal sizes and N = 4, in both modes
    assert len([test for test in every if names[0] in test]) == 48
    assert windows == [f"{names[0]}[{mode}-4-equal-adam]" for mode in ("pynative", "graph")], windows
    # a parameter that names a feature (a schedule, a policy) is not a data parameter: both cases run
    assert [test for test in first if names[1] in test] == [f"{names[1]}[schedule]", f"{names[1]}[adaptive]"]
    # N listed with others ("steps, error, message"): each row is a case of its own, and every row runs
    rows = [test for test in every if names[2] in test]
    assert rows and [test for test in first if names[2] in test] == rows


def test_ci_runs_every_case_on_the_newest_release_and_the_first_data_cases_on_the_oldest():
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        legs = [line for line in f.read().splitlines() if "scripts/run_tests.sh" in line and not line.startswith("#")]
    assert len(legs) == 2, legs
    newest, oldest = legs
    assert "MINDSPORE=" not in newest and "--data-cases" not in newest and "-m" not in newest.split(), newest
    assert oldest.startswith("MINDSPORE=2.7.0 ") and oldest.endswith('-m "not slow" --data-cases=first'), oldest
