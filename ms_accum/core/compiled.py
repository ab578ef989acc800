"""PYNATIVE_MODE: a cell's call run as one compiled graph, as a user's own ``ms.jit`` step.

MindSpore 2.x's default mode runs a Cell's ``construct`` operator by operator from Python. A user who trains there
wraps the step in :func:`mindspore.jit`, and the MindSpore tutorials do. Every ms_accum cell does the same for
itself: in PYNATIVE_MODE a call runs the cell's ``construct`` through :func:`mindspore.jit` (a micro-batch's forward,
backward and addition in one graph; the window's end in another). In GRAPH_MODE nothing changes: the Cell is
compiled as always.

MindSpore 2.10 on CPU runs a jit graph that holds no control flow several times slower per call than the same
graph with one runtime branch, in both modes (docs/performance_history.md, PYNATIVE_MODE and the runtime branch).
A micro-step ms_accum compiles (the engine's addition, TrainClear) therefore passes its result through
:func:`through_a_branch`, which changes no value, wherever the cell is called from Python and compiled on CPU, and
in PYNATIVE_MODE on any device (``_branched``).

A graph holding the user's network can fail to compile (Python that MindSpore's graph syntax does not take). Such
a cell (:meth:`CompiledCall._holds_network`) then runs eagerly, after a one-line notice; that is decided at the
first call of each graph phase only, so an error of a later call is raised as it is. Graphs ms_accum writes
alone (the window's end) are always compiled. A network with hooks (``register_forward_hook`` and the like) on
any of its cells at that first call runs eagerly too, after a notice: a compiled graph would not call them.
``MS_JIT=0``, MindSpore's switch for running ``ms.jit`` functions as plain Python, makes every cell run eagerly.
A network with a sparse lookup (``nn.EmbeddingLookup(sparse=True)``) is refused a step run eagerly, by any of these
causes: MindSpore then hands back its gradient as the rows without their indices.

An ms_accum check that raises while MindSpore compiles a graph (a loss network that returns no scalar, say)
reaches the user as MindSpore passes it on: quoted, with MindSpore's C++ call stack and the graph's traceback,
which ends in ms_accum's own code. The cells raise such an error as ms_accum wrote it (:func:`own_graph_error`).
"""
import os
import re
import sys

import numpy as np

from mindspore import ParameterTuple, Tensor, context, jit, ops
from mindspore import dtype as mstype

from ..compat import get_mode
from .own_code import is_own


HOOKS = ("_forward_pre_hook", "_forward_hook", "_backward_pre_hook", "_backward_hook")


def hooked_cell(cell):
    """The name of a cell in `cell` (itself included) with a hook registered, or None."""
    for name, sub in cell.cells_and_names():
        if any(getattr(sub, hook, None) for hook in HOOKS):
            return name or type(sub).__name__
    return None


def sparse_lookup(cell):
    """The name (its attribute's, with its class) of a cell in `cell` (itself included) that looks rows up sparsely
    (a ``SparseGatherV2``, as ``nn.EmbeddingLookup(sparse=True)`` holds), or None. Its gradient is the rows with
    their indices (a RowTensor) only in a compiled graph: run eagerly, MindSpore hands back the rows alone."""
    for name, sub in cell.cells_and_names():
        if any(isinstance(prim, ops.SparseGatherV2) for prim in getattr(sub, "_primitives", {}).values()):
            return f"'{name.rsplit('.', 1)[-1] or type(sub).__name__}' ({type(sub).__name__})"
    return None


def through_a_branch(value):
    """`value` (a scalar Tensor, any number type) unchanged, through a runtime branch: see the module docstring.
    Its condition is read at run time (a NaN takes the other branch, which returns it as it is)."""
    if value == value:  # pylint: disable=comparison-with-itself
        value = value * 1
    return value


# The dtypes of MindSpore's Assert kernel (on CPU, 2.7.0 and 2.10.0, it refuses bfloat16: "assert kernel does not
# support BFloat16"): the optimizer's Parameters of these are read by one Assert, any other by a TensorShape.
_ASSERT_DTYPES = (mstype.bool_, mstype.int8, mstype.int16, mstype.int32, mstype.int64, mstype.uint8, mstype.uint16,
                  mstype.uint32, mstype.uint64, mstype.float16, mstype.float32, mstype.float64)


def branch_parameters(optimizer):
    """The Parameters of `optimizer` (the weights it updates, its state and its learning rate: ``get_parameters``
    yields each once) with an element, for :func:`read_before_branch`: a pair of ParameterTuples, those of a dtype
    ``Assert`` takes and the others (bfloat16), each None when it would be empty."""
    found = [param for param in optimizer.get_parameters() if param.size > 0]
    taken = [param for param in found if param.dtype in _ASSERT_DTYPES]
    others = [param for param in found if param.dtype not in _ASSERT_DTYPES]
    return ParameterTuple(taken) if taken else None, ParameterTuple(others) if others else None


# The one operator that reads the optimizer's Parameters before the branch (see read_before_branch): its condition
# is always true, so it stops nothing and reads no element of its inputs.
_READ = ops.Assert(summarize=1)
_TRUE = Tensor(True)
_SHAPE = ops.TensorShape()  # what reads a Parameter of a dtype the Assert refuses, one a Parameter


def _shape_of(param):
    return _SHAPE(param)


def read_before_branch(hyper_map, taken, others):
    """Each Parameter of `taken` and `others` (:func:`branch_parameters`; either may be None) taken as an input in
    the graph's own body, for a graph that reads or writes them only in a runtime branch (the optimizer step in the
    window end's skip branch). MindSpore (2.7.0 and 2.10.0, GRAPH_MODE) binds a Parameter that a graph reads only
    inside such a branch when the graph first runs: after the host replaces its data with ``set_data``
    (``load_param_into_net`` does; so does a callback that sets the learning rate), the branch went on with the old
    data, so 2.10.0 dropped the next update of weights loaded that way and 2.7.0 read a wrong value for a rate set
    that way (no step at all). Taken as an input outside the branch, every Parameter is bound at every run, as in a
    graph without control flow (:class:`mindspore.nn.TrainOneStepCell`'s). `taken` are the inputs of one ``Assert``
    whose condition is the constant True: one operator for all of them, which reads no element. A ``TensorShape``
    of each (one operator a Parameter; 160 on EdgeNeXt xx_small) binds them as well, and is what reads `others`,
    but compiled 0.7 s longer for all of them (the driver's first update on EdgeNeXt, four fresh processes of each
    in turn: a median 12.4 s against 13.2, 2026-12-05); a one-element slice of each cost 2.2 s more than that, and
    a reshape held a copy of the largest parameter in TrainOptim's graph. A bare ``ops.depend`` on a Parameter is
    optimized away and binds nothing. Returns what to depend on."""
    reads = ()
    if taken is not None:
        reads = reads + (_READ(_TRUE, taken),)
    if others is not None:
        reads = reads + (hyper_map(_shape_of, others),)
    return reads


_FRAME = re.compile(r"^# \d+ In file (.+?):\d+", re.M)
_BANNER = re.compile(r"- [^:]*:")  # a heading of MindSpore's message, between two lines of dashes


def first_line(error):
    """The first line of `error`'s message that says something (MindSpore's run to many lines, with its C++ call
    stack, and some open with a banner: a line of dashes, a heading such as '- Kernel select failed:', dashes
    again), or its type's name when it has none."""
    for line in str(error).splitlines():
        line = line.strip()
        if any(c.isalnum() for c in line) and not _BANNER.fullmatch(line):
            return line
    return type(error).__name__


def own_graph_error(error):
    """
    ms_accum's message, if `error` is one of its checks raised (a ``raise`` statement) while MindSpore compiled a
    graph, else None. MindSpore quotes such a message and appends its C++ call stack (``RaiseConstant``) and the
    graph's traceback, whose last frame is the ``raise``; errors of MindSpore's operators, or raised in the user's
    code, keep everything MindSpore gives.
    """
    text = str(error)
    frames = _FRAME.findall(text)
    if "RaiseConstant" not in text or not frames or not is_own(frames[-1]):
        return None
    message = text.split("\n\n---", 1)[0].strip()
    if len(message) > 1 and message[0] == message[-1] == "'":
        message = message[1:-1]
    return message if message.startswith("For '") else None


class CompiledCall:
    """
    Mixin for a Cell, placed before :class:`mindspore.nn.Cell` in the bases: in PYNATIVE_MODE its calls run
    ``construct`` compiled by :func:`mindspore.jit`, one graph per phase (``cell.phase``) and input signature.

    Sets ``_eager`` and ``_branched`` before every call, which ``construct`` may read (frozen into a compiled graph):
    ``_eager`` is True only where ``construct`` runs operator by operator (PYNATIVE_MODE, not compiled),
    ``_branched`` where its micro-steps pass through :func:`through_a_branch` (compiled in PYNATIVE_MODE, or in
    GRAPH_MODE on CPU). Called inside another graph (a user's jit step), the cell keeps the defaults (False).
    """

    _jit_construct = None  # the compiled construct, made at the first PYNATIVE call
    _compiled_phases = frozenset()  # phases whose first compiled call succeeded
    _eager_phases = frozenset()  # phases that run eagerly: their graph, holding the network, did not compile
    _eager = False
    _branched = False
    _called = False  # whether the first call's checks (_on_first_call) passed
    _on_cpu = None  # whether the device is the CPU, read once: MindSpore fixes the device at the first graph
    _sparse_lookup = False  # the name of the network's sparse lookup, or None; False: not looked for yet
    # with MindSpore's compile cache on, the calls (phase and inputs) this cell has checked against the graphs the
    # cache holds (a set, made by WindowEngine, which defines _check_cached_call(args)); None: not checked
    _cached_calls = None

    def _holds_network(self):
        """Whether the graph of the current phase holds the user's network (and may run eagerly if it cannot be
        compiled). Default: no; the cells whose graph runs the network say so."""
        return False

    def _on_first_call(self):
        """Before the cell's first call is compiled or run (and before a trainer runs it, which may call this
        first): every ms_accum window engine in its graph (itself, or the cells it calls) checks its settings
        against those of the graphs MindSpore's compile cache would load (compile_cache.py). Once passed, not
        again; a refusal leaves it to the next call."""
        if self._called:
            return
        for _, cell in self.cells_and_names():
            check = getattr(cell, "_check_compile_cache", None)
            if check is not None:
                check()
        self._called = True

    def __call__(self, *args, **kwargs):
        if not self._called:
            self._on_first_call()
        if self._cached_calls is not None:
            self._check_cached_call(args)
        for index, arg in enumerate(args):
            if isinstance(arg, np.ndarray):  # MindSpore's own error named its Shape primitive, not the input
                raise TypeError(f"For '{type(self).__name__}', input {index} must be a mindspore.Tensor, but got a "
                                f"numpy.ndarray of shape {arg.shape}. Wrap it: mindspore.Tensor(x).")
        pynative = get_mode() == context.PYNATIVE_MODE  # not get_context("mode"), slow: see compat.get_mode
        phase = self.phase
        if not pynative or os.getenv("MS_JIT") == "0" or phase in self._eager_phases:
            if not pynative and self._on_cpu is None:  # get_context is slow (compat.get_mode): read once
                self._on_cpu = context.get_context("device_target") == "CPU"
            self._eager, self._branched = pynative, not pynative and self._on_cpu
            if pynative and phase not in self._eager_phases and self._holds_network():
                self._refuse_eager_sparse("MS_JIT=0 is set")  # an eager phase was refused when it became one
            try:
                return super().__call__(*args, **kwargs)
            except (TypeError, ValueError) as error:
                message = own_graph_error(error)
                if message is None:
                    raise
                raise type(error)(message) from None
        self._eager, self._branched = False, True
        if self._jit_construct is None:
            self._jit_construct = jit(self)
        if phase in self._compiled_phases or not self._holds_network():
            return self._jit_construct(*args, **kwargs)
        hooked = hooked_cell(self)
        if hooked is not None:
            why = f"its network has hooks (on '{hooked}'), which a compiled graph would not call"
            self._refuse_eager_sparse(why)
            self._eager, self._branched = True, False
            self._eager_phase(phase, why)
            return super().__call__(*args, **kwargs)
        try:
            out = self._jit_construct(*args, **kwargs)
        except Exception as error:  # pylint: disable=broad-except
            why = f"it could not be compiled with mindspore.jit ({type(error).__name__}: {first_line(error)[:200]})"
            try:
                self._refuse_eager_sparse(why)
            except ValueError as refusal:
                raise refusal from error
            # Run the step eagerly: an error of the network itself is raised from there, with this one chained.
            self._eager, self._branched = True, False
            out = super().__call__(*args, **kwargs)
            self._eager_phase(phase, why)
            return out
        self._compiled_phases = self._compiled_phases | {phase}
        return out

    def _refuse_eager_sparse(self, why):
        """Raise before a step holding the network runs eagerly (`why`) if the network looks rows up sparsely: its
        gradient would arrive as the rows without their indices, which no check can tell from a dense gradient
        when as many ids are looked up as the table has rows (the buffer's shape), and would be added to the wrong
        rows. Read from the network once."""
        if self._sparse_lookup is False:
            self._sparse_lookup = sparse_lookup(getattr(self, "network", self))
        if self._sparse_lookup is not None:
            owner = getattr(self, "owner_name", type(self).__name__)
            raise ValueError(f"For '{owner}', the network's sparse lookup {self._sparse_lookup} must run in a "
                             f"compiled step, but the step would run eagerly: {why}. Run eagerly, MindSpore hands "
                             f"back the looked-up rows' gradient without their indices, to be added to the wrong "
                             f"rows. Let the step compile (unset MS_JIT=0, remove the hooks, or "
                             f"make the network compile), use GRAPH_MODE, or use a dense table.")

    def _eager_phase(self, phase, why):
        """Run `phase` eagerly from now on; the notice, `why`, is printed for the cell's first such phase only (a
        cell whose network cannot be compiled has it in several graphs: noise_scale="first"'s two accumulations)."""
        if not self._eager_phases:
            print(f"ms_accum: {type(self).__name__} runs its step eagerly in PYNATIVE_MODE (slower): {why}.",
                  file=sys.stderr)
        self._eager_phases = self._eager_phases | {phase}


def write_parameter(param, value):
    """Write `value` (a number or numpy array of the Parameter's shape) into `param` from the host, so that
    compiled graphs read it: an assign, not ``set_data``, which in PYNATIVE_MODE detaches a Parameter that an
    ``ms.jit`` graph has run with (MindSpore 2.10: the graph keeps reading the old value; 2.7.0: garbage)."""
    ops.assign(param, Tensor(np.asarray(value).reshape(param.shape), param.dtype))
