"""TrainAccuStepsCell: accumulation for parallel training, one gradient reduction per window.

A call runs in one of two modes: accumulate (forward, backward, add into ``accu_grads``; no communication, no optimizer)
or update (add the last micro-batch, reduce once across devices, one optimizer step, reset). The network's forward and
backward are compiled once: an update call launches the accumulation graph, then the window's end (``UPDATE_PHASE``), a
graph of its own without the network. A graph that held a second forward and backward would keep a second arena of
activations (docs/performance_history.md, The network in one graph). Whichever way the mode is chosen (the
``accumulation`` attribute, :meth:`set_accumulation`, or left to the cell, which updates every ``accumulation_steps``-th
call), the cell selects the phases right before the call.
"""
from mindspore import nn

from ..core import window
from ..core.checks import (check_bool, check_call_inputs, check_cell, check_clip_norm, check_optimizer,
                           check_optimizer_trains, check_sens, warn_eval_mode, warn_steps_unset)
from ..core.engine import CellNaming, WindowEngine
from ..core.noise_scale import noise_state
from ..core.open_window import OpenWindow
from ..core.schedule import steps_argument, steps_given
from ..core.weighting import LossAndItems, forget_failed_forward, loss_sens, micro_batch_forward

ACCUMULATE_PHASE = "train_accumulate"
UPDATE_PHASE = "train_update"
# with noise_scale="first", the accumulation graphs of a window's first micro-batch (measured) and of the others
_MEASURED_PHASE, _UNMEASURED_PHASE = ACCUMULATE_PHASE + "_measured", ACCUMULATE_PHASE + "_unmeasured"


def check_cell_arguments(owner, network, optimizer):
    """The checks both parallel cells make before MindSpore's own constructor sees the arguments."""
    check_cell(owner, "network", network)
    check_optimizer_trains(owner, check_optimizer(owner, optimizer), network)


class AccumulationModes:
    """
    Mixin for the parallel cells: which calls accumulate and which update, and the compiled graph that goes with
    each.

    Contract: composed before :class:`WindowEngine` and a :class:`mindspore.nn.TrainOneStepCell` (``class
    Cell(AccumulationModes, WindowEngine, nn.TrainOneStepCell)``); the constructor calls ``_init_engine`` with
    ``window_end_in_python=True`` (:meth:`end_window` launches the window end's graph, raises after it and times
    it), then ``set_gradient_accumulation_steps`` and :meth:`_init_modes`. It reads what those set: the engine's
    ``accu_micro_steps``, ``accu_skip_history``, ``nonfinite``, ``scale_kind``, ``owner_name``,
    ``next_window_steps()`` and ``_device_policy``, and the TrainOneStepCell's ``network`` (a LossAndItems); it
    sets ``phase`` (MindSpore's graph phase) before every call, and with ``noise_scale="first"`` the engine's
    ``_measure_now`` with it.

    With ``noise_scale="first"`` the cell knows on the host whether a micro-batch opens its window (it ends and
    drops its windows itself; read from the device once after a construction, a failed call or a state load), and
    runs one of two accumulation graphs: one measures the micro-batch, the other has no pass over its gradient.
    A branch in one graph, taken at run time, cost as much as measuring every micro-batch on CPU
    (docs/noise_scale.md, Cost). Which micro-batches are measured only changes the noise records, never an update.
    """

    def _init_modes(self, n_given=True):
        self._steps_unset = not n_given  # N left at its default of 1 (warned of at the first run or call)
        self._mode = None            # None: automatic; True/False: chosen by the user or a trainer
        self._accumulate_now = False  # what the next call does; read by construct (frozen per graph phase)
        self._auto_window = None     # the open window as the automatic mode counts it (an OpenWindow; None: unknown)
        self._opens_window = None    # noise_scale="first": whether the next micro-batch opens its window (None:
        #                              unknown, read from the device when needed)

    @property
    def accumulation(self):
        """
        The mode of the next calls: ``True`` accumulates only, ``False`` accumulates and updates, ``None``
        (default) lets the cell decide: it accumulates ``accumulation_steps - 1`` calls and updates on the next.
        Setting it selects the matching compiled graph in GRAPH_MODE.
        """
        return self._mode

    @accumulation.setter
    def accumulation(self, value):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"For '{self.owner_name}', 'accumulation' must be a bool, or None to let the cell update "
                            f"every accumulation_steps-th call, but got {value!r} of type {type(value).__name__}.")
        self._mode = value
        self._auto_window = None
        self._select(self._decide())

    def set_accumulation(self, accumulation):
        """
        Choose the mode of the next calls, and the graph phase that goes with it.

        Args:
            accumulation (bool): ``True`` to accumulate only, ``False`` to accumulate and update, ``None`` to let
                the cell update every `accumulation_steps`-th call.

        Returns:
            The cell itself.

        Raises:
            TypeError: If `accumulation` is not a bool or None.
        """
        self.accumulation = accumulation
        return self

    def set_train(self, mode=True):
        """As :meth:`mindspore.nn.Cell.set_train`, keeping the graph phase of the chosen mode."""
        super().set_train(mode)
        if mode:
            self._select(self._accumulate_now)
        return self

    def _decide(self):
        """Whether the next call accumulates only. The automatic mode counts the open window on the host, read from
        the device once after an explicit mode or a resume, and asks the N of each window as it opens."""
        if self._mode is not None:
            return self._mode
        if self._auto_window is None:
            self._auto_window = OpenWindow.of_cell(self)
        if not self._auto_window.is_open:
            self._auto_window.open(self.next_window_steps())
        return self._auto_window.micro_batches + 1 < self._auto_window.steps

    def _holds_network(self):
        """The accumulation phase runs the network; the window's end does not (see ``compiled.py``)."""
        return self._accumulate_now

    def _select(self, accumulate):
        self._accumulate_now = accumulate
        self.phase = self._accumulate_phase() if accumulate else self._update_phase()

    def _accumulate_phase(self):
        """The accumulation graph's phase: with noise_scale="first", the measuring one for a window's first
        micro-batch and the other for the rest."""
        if not self.measure_noise or self.noise_every:
            return ACCUMULATE_PHASE
        if self._opens_window is None:
            self._opens_window = int(self.accu_micro_steps.asnumpy()) == 0
        self._measure_now = self._opens_window
        return _MEASURED_PHASE if self._opens_window else _UNMEASURED_PHASE

    def _select_sunk(self):
        """Select the accumulation graph sunk into the device loop (Model_ACCU's sink mode): its micro-batches run
        without the host, so with noise_scale="first" the graph decides at run time which one opens the window."""
        self._accumulate_now, self._measure_now = True, None
        self.phase = ACCUMULATE_PHASE

    def _forget_open_window(self):
        """The device's window counters were written from outside (a state load): read them again when needed."""
        self._auto_window = self._opens_window = None

    def _update_phase(self):
        """The window end's graph phase: an adaptive policy is part of that graph, so each policy (none, or its
        constants) has a phase of its own, and a policy given after the cell has run compiles its graph."""
        if self._device_policy is None:
            return UPDATE_PHASE
        return "_".join([UPDATE_PHASE, "adaptive", *(str(value).replace(".", "p") for value in self._device_policy)])

    def end_window(self, raise_skipped=True):
        """
        End the open window (what an update call does after adding its micro-batch): reduce, clip, step the
        optimizer (or skip the window), reset. Runs the window-end graph, which holds no forward or backward.

        Args:
            raise_skipped (bool): With ``nonfinite="raise"``, raise once the graph has skipped a window whose
                gradient was not finite. A trainer passes ``False`` and raises its own error, which names the
                window's micro-batches (the cell does not know them). Default: ``True``.

        Returns:
            The update call's outputs.

        Raises:
            NonFiniteWindowSkipped: (a ValueError) With ``nonfinite="raise"`` and `raise_skipped`, if the window's
                gradient was not finite: the graph skipped the window (parameters and optimizer state unchanged,
                buffers cleared, the skip counted), so the cell can go on.
        """
        self._select(False)
        micro_batches = self._window_micro_batches()
        try:
            outputs = super().__call__()
        except BaseException:
            self._opens_window = None
            raise
        self._opens_window = True
        self._time_window(micro_batches)
        if raise_skipped and self.nonfinite == "raise" and self.scale_kind is None:
            if int(float(self.accu_skip_history.asnumpy())) & 1:  # the newest window was skipped
                raise window.NonFiniteWindowSkipped(window.nonfinite_message(self.owner_name, skipped=True), outputs)
        return outputs

    def drop(self):
        """
        Discard the open window: buffers and counters cleared, no optimizer step, and the window not counted (the
        next window takes its place in a schedule). The next call opens a window.

        Returns:
            Tensor, int32 scalar: the micro-batches the discarded window held.
        """
        try:
            held = super().drop()
        except BaseException:
            self._auto_window = self._opens_window = None
            raise
        if self._auto_window is not None:
            self._auto_window.close()
        self._opens_window = True
        return held

    def __call__(self, *args, **kwargs):
        check_call_inputs(self, args, kwargs)
        warn_eval_mode(self)
        if self._mode is None:
            warn_steps_unset(self)
        accumulate = self._decide()
        try:
            self._select(True)
            out = super().__call__(*args, **kwargs)
            self._opens_window = False
            if not accumulate:
                out = self.end_window()
        except BaseException:
            self._auto_window = self._opens_window = None
            forget_failed_forward(self.network)
            raise
        if self._mode is None:
            self._auto_window.add()
            if not accumulate:
                self._auto_window.close()
        self._select(accumulate)
        return out


class TrainAccuStepsCell(AccumulationModes, WindowEngine, nn.TrainOneStepCell):
    r"""
    A :class:`mindspore.nn.TrainOneStepCell` that accumulates gradients over N micro-batches
    and communicates once per window.

    An accumulating call runs forward and backward and adds the micro-batch's gradient, weighted by its samples
    or items, into ``accu_grads`` (no gradient reduction, no optimizer). An updating call also adds its
    micro-batch, then divides by the window's items on all devices, reduces once across devices
    (``DistributedGradReducer`` in DATA_PARALLEL), takes one optimizer step and resets the buffers. The step
    equals one large-batch step on all samples (or items) of the window, on all devices.

    Which calls update: by default every N-th call (a plain loop ``for x, y in data: cell(x,
    y)`` is right); or the mode set with ``cell.accumulation = flag`` or :meth:`set_accumulation` (``None``
    returns to the default). In GRAPH_MODE each mode has its own compiled graph, selected before every call.
    The trainers set the mode themselves, and put the network in training mode; called from a loop of your own,
    call ``set_train(True)`` first, as for :class:`mindspore.nn.TrainOneStepCell` (the first call warns if every
    BatchNorm and dropout layer of the network is in inference mode, as MindSpore builds them).

    What a micro-batch weighs is decided as in :class:`TrainForwardBackward`: its samples (the inputs' common
    leading dimension), or ``num_items`` when the loss network returns ``(loss, num_items)``.

    Args:
        network (Cell): The loss network, returning the mean loss over its micro-batch or
            ``(loss, num_items)``.
        optimizer (Cell): The optimizer.
        sens (numbers.Number): Gradient seed, as in :class:`mindspore.nn.TrainOneStepCell`. Default: ``1.0``.
        gradient_accumulation_steps (Union[int, dict, str, AccumulationSchedule, AdaptiveAccumulation]): N, the
            micro-batches per update, >= 1; or a schedule ``{first_update: N}`` (see :class:`AccumulationSchedule`;
            windows counted in the ``accu_windows`` Parameter, so it survives a saved state); or an
            :class:`AdaptiveAccumulation` policy, decided on the device after each window (its N in the
            ``accu_steps`` Parameter; needs `noise_scale`), or a ``GoodputAccumulation`` policy
            (``ms_accum.core.goodput``: N for throughput x statistical efficiency; :meth:`end_window` times each
            window for its calibration, in data parallel as the slowest device measured it, so that every device
            freezes the same constants and chooses the same N; its constants and measurements are Parameters of
            the cell, ``accu_goodput_*``, in its state file). The automatic mode and the trainers without dataset
            sink mode follow them all; dataset sink mode takes an int. ``accumulation_steps``, ``mini_steps`` and
            ``accumulate_step`` are accepted in its place (keyword only). Default: ``1``, or what
            :class:`Model_ACCU` or its ``train`` is given; left at 1 with none given, the first call in the automatic
            mode (or the first ``train``) warns that nothing accumulates.
        clip_norm (float, optional): Clip the window's gradient (averaged, reduced across devices) to this global
            norm, once per window, as ``ops.clip_by_global_norm`` would clip the large batch's gradient; ``None``
            for no clipping. Default: ``None``.
        noise_scale (Union[bool, str]): Measure the gradient noise scale: the measured micro-batches' squared
            gradient norms are summed over every device, and each window yields unbiased estimates of |G|^2 and
            tr(Sigma), read through ``noise_records`` and :class:`WindowTelemetry` (see ``docs/noise_scale.md``).
            ``True`` measures every micro-batch, ``"first"`` only the first of each window on each device (one
            gradient pass per window instead of one per micro-batch; a noisier estimate). Default: ``False``.
        average (bool): ``True`` applies the mean gradient over the window's samples or items; ``False`` the raw
            sum of its micro-batch gradients (the tutorial's behaviour; reduced across devices as MindSpore's reducer
            does). ``False`` excludes `noise_scale`. Default: ``True``.
        nonfinite (str): A window whose gradient holds a NaN or an inf (without a loss scale) is skipped,
            parameters and optimizer state untouched, and counted in ``accu_skipped_windows`` and
            ``accu_nonfinite_streak``: ``"skip"`` goes on, ``"raise"`` then raises a ValueError (see
            :meth:`end_window`: the window is skipped and cleared first, so the cell can go on; a trainer that
            knows the data raises its own error instead, naming the window's micro-batches);
            ``"apply"`` checks nothing and applies it, as :class:`mindspore.nn.TrainOneStepCell` does.
            Default: ``"skip"``.
        lr_scaling (str): How the optimizer's learning rate follows the window's global batch G (its items over all
            devices) when N changes: ``"none"`` leaves the optimizer as it is; ``"linear"`` multiplies the rate by
            G / G0, ``"sqrt"`` by sqrt(G / G0), ``"adascale"`` by AdaScale's gain r from the window's noise
            estimates (sqrt(r) for an Adam-like optimizer; needs `noise_scale`; ``"adascale_sgd"`` and
            ``"adascale_adam"`` name the form). With a rule the optimizer reads its schedule (a number, a list per
            reference step or a ``LearningRateSchedule``) at the run's progress in reference steps (G / G0 per
            window, r for AdaScale) instead of its update count (``ms_accum.core.progress_lr``); progress, the
            factor and G0 are Parameters of the cell (``accu_lr_*``), in its state file. Default: ``"none"``.
        reference_batch (float, optional): G0, the reference global batch in items (samples, or the ``num_items``
            the loss reports), > 0; given with a rule only (refused without one). Default: ``None``: the first
            window's items.

    Inputs:
        - **\*inputs** (Tuple(Tensor)) - One micro-batch.

    Outputs:
        Tensor: the micro-batch's loss when accumulating; on the update call, the mean loss over the window's
        samples or items on this device.

    Raises:
        RuntimeError: If the parallel mode reduces gradients across devices (DATA_PARALLEL) but
            ``mindspore.communication.init()`` was not called.
        TypeError: If `network` is not a Cell, `optimizer` is not an optimizer, N is given twice or is not an
            integer, or `noise_scale` is neither a bool nor a str; when called, as listed for
            :class:`TrainForwardBackward`.
        ValueError: If none of the optimizer's parameters is a parameter of `network` (some not: a warning), one
            has ``requires_grad=False``, N is < 1, `clip_norm` is not a finite number > 0, or `sens` is zero or
            not finite, or `lr_scaling` or `reference_batch` is refused as listed for :class:`TrainOptim`; when
            called, as listed for :class:`TrainForwardBackward` and :class:`TrainOptim`.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import Tensor, nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), optimizer,
        ...                                    gradient_accumulation_steps=2)
        >>> x, y = Tensor(np.ones((8, 4), np.float32)), Tensor(np.zeros((8, 2), np.float32))
        >>> loss = cell(x, y)          # accumulates
        >>> mean_loss = cell(x, y)     # updates: the mean loss over both micro-batches
    """

    def __init__(self, network, optimizer, sens=1.0, gradient_accumulation_steps=None, clip_norm=None,
                 noise_scale=False, average=True, nonfinite="skip", lr_scaling="none", reference_batch=None,
                 *, accumulation_steps=None, mini_steps=None, accumulate_step=None, _naming=None):
        naming = _naming or CellNaming("TrainAccuStepsCell")  # a trainer building the cell names it its own way
        owner = naming.owner
        aliases = dict(accumulation_steps=accumulation_steps, mini_steps=mini_steps, accumulate_step=accumulate_step)
        steps = steps_argument(owner, gradient_accumulation_steps, aliases, 1)
        check_cell_arguments(owner, network, optimizer)
        super().__init__(LossAndItems(owner, network), optimizer, check_sens(owner, sens))
        self._init_engine(owner, naming.buffers(self.weights), window.WindowState(naming.window_prefix),
                          check_clip_norm(owner, clip_norm), check_bool(owner, "average", average),
                          noise=noise_state(owner, naming.window_prefix, noise_scale, average), nonfinite=nonfinite,
                          rebuild=naming.rebuild_hint, window_end_in_python=True)
        self.set_gradient_accumulation_steps(*steps)
        self._init_lr_scaling(self.optimizer, lr_scaling, reference_batch)  # last: it may rewire the optimizer
        self._init_modes(steps_given(gradient_accumulation_steps, aliases))

    def construct(self, *inputs):
        if not self._accumulate_now:  # the window's end (no inputs): see end_window
            return self._end_window(self.optimizer)[0]
        loss, items = micro_batch_forward(self.network, inputs, self._eager)
        ratio = self._item_ratio(items)
        seed = self.sens if ratio is None else ratio * self.sens
        grads = self.grad(self.network, self.weights)(*inputs, loss_sens(loss, items, seed, self._eager))
        return self._add_micro_batch(loss, items, grads, seed_ratio=ratio)
