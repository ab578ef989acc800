"""helpers.computed_once: a reference is computed once a process for the same arguments, and again for any other;
it runs in PYNATIVE_MODE, as the large-batch check calls every reference."""
import functools

import numpy as np

import mindspore as ms

from helpers import assert_equals_large_batch, computed_once


def _counting():
    calls = []

    @computed_once
    def reference(windows, rate=0.1, make=None):
        calls.append(rate)
        return {"w": np.full(2, float(sum(float(x.sum()) for window in windows for x, _ in window)) * rate)}
    return reference, calls


def _windows(value):
    return [[(np.full((2, 3), value, np.float32), np.zeros(2, np.int32))]]


def make_module_level(optimizer, seed):  # a function whose name tells it apart
    return optimizer, seed


def test_the_same_data_in_new_arrays_is_computed_once_and_other_data_again():
    reference, calls = _counting()
    first = reference(_windows(1.0))
    assert reference(_windows(1.0), 0.1)["w"].tolist() == first["w"].tolist() and len(calls) == 1
    reference(_windows(2.0))  # other contents
    reference([[(np.full((3, 2), 1.0, np.float32), np.zeros(2, np.int32))]])  # the same bytes, another shape
    reference(_windows(1.0), rate=0.2)  # another argument
    reference(_windows(1.0), make=make_module_level)  # a named function: keyed by its name
    reference(_windows(1.0), make=make_module_level)
    assert len(calls) == 5


def test_a_partial_is_keyed_by_its_function_and_arguments():
    reference, calls = _counting()
    for _ in range(2):
        reference(_windows(1.0), make=functools.partial(make_module_level, "adamw"))
    reference(_windows(1.0), make=functools.partial(make_module_level, "momentum"))  # another argument
    reference(_windows(1.0), make=functools.partial(make_module_level, seed=1))  # given by another name
    reference(_windows(1.0), make=functools.partial(make_module_level, optimizer="adamw"))
    assert len(calls) == 4
    for _ in range(2):  # a partial of a function the key cannot tell apart, or with one as its argument
        reference(_windows(1.0), make=functools.partial(lambda optimizer, seed: None, "adamw"))
        reference(_windows(1.0), make=functools.partial(make_module_level, lambda: None))
    assert len(calls) == 8


def test_a_caller_changing_its_result_does_not_change_the_next():
    reference, _ = _counting()
    reference(_windows(1.0))["w"][:] = -1.0
    assert reference(_windows(1.0))["w"].tolist() == [6 * 0.1, 6 * 0.1]


def test_a_lambda_or_a_local_function_is_computed_every_time():
    reference, calls = _counting()

    def local(optimizer, seed):
        return optimizer, seed
    for _ in range(2):
        reference(_windows(1.0), make=lambda optimizer, seed: None)
        reference(_windows(1.0), make=local)
    assert len(calls) == 4


def test_a_reference_runs_in_pynative_and_both_modes_share_it():
    """A reference needs no compilation: it runs in PYNATIVE_MODE whatever the test's mode, which is restored after,
    and a test's GRAPH_MODE and PYNATIVE_MODE cases share its result."""
    reference, calls = _counting()
    modes = []

    @computed_once
    def noting_mode(windows):
        modes.append(ms.get_context("mode"))
        return reference(windows)
    for mode in (ms.GRAPH_MODE, ms.PYNATIVE_MODE, ms.GRAPH_MODE):
        ms.set_context(mode=mode)
        assert noting_mode(_windows(1.0))["w"].tolist() == [6 * 0.1, 6 * 0.1]
        assert ms.get_context("mode") == mode
    assert modes == [ms.PYNATIVE_MODE] and len(calls) == 1


def test_the_large_batch_check_calls_its_reference_in_pynative():
    """helpers.assert_equals_large_batch calls a reference that is not computed once (a test's own function) in
    PYNATIVE_MODE too, and the test's mode is restored after."""
    modes = []

    def reference(windows):
        modes.append(ms.get_context("mode"))
        total = sum(float(x.sum()) for window in windows for x, _ in window)
        return {"w": np.full(2, total, np.float32)}
    windows = [_windows(1.0)[0] + _windows(1.0)[0]]
    ms.set_context(mode=ms.GRAPH_MODE)
    assert_equals_large_batch(reference(windows), reference, windows, context="modes")
    assert ms.get_context("mode") == ms.GRAPH_MODE
    assert modes[1:] == [ms.PYNATIVE_MODE] * 3, modes
