"""Checks made while a graph runs, in a form MindSpore's compile cache can store when it is on.

A window's checks (every micro-batch had items, the weighting was not mixed, the gradient is finite under
``nonfinite="raise"``) look at values known only at run time. By default they raise a ``ValueError`` from inside
the graph, with the values in the message; MindSpore compiles such a ``raise`` into a ``PyExecute`` node, which
its compile cache cannot store: with ``MS_COMPILER_CACHE_ENABLE=1`` the first window's end failed with
``RuntimeError: Cannot export a PyExecute CNode in MindIR`` (MindSpore 2.10.0).

With the compile cache on (decided when a cell is built; ``compile_cache.py``), the same conditions are checked by
MindSpore's ``Assert`` operator instead, which the cache stores: a failed check stops the step before the
optimizer, as the ``raise`` does, with MindSpore's ``RuntimeError: assert failed`` after the line ``For 'Assert'
condition is false.`` and the offending values: the smallest num_items of the window (items check; -inf for a
NaN or an infinite one); in Accumulator, whose one check covers both, that value, the micro-batches without
num_items and the window's micro-batches; the gradient's norm (nonfinite='raise').
"""
from mindspore import ops


_assert = ops.Assert(summarize=3)


def assert_in_graph(ok, values):
    """Stop the graph, before whatever depends on the result, unless `ok` (a bool scalar Tensor); `values` (a
    list of Tensors) are printed. Returns a Tensor to depend on."""
    return _assert(ok, values)
