"""GradientAccumulation: the one-device trainer, one engine cell driven over a dataset by the shared window loop."""
from mindspore import nn

from ..cells.parallel import TrainAccuStepsCell
from ..cells.parallel_loss_scale import TrainAccuStepsWithLossScaleCell
from ..compat import CallbackManager, InternalCallbackParam
from ..core.engine import CellNaming
from ..core.schedule import AccumulationSchedule
from ..core.checks import check_ckpt_path, check_cell, construct_inputs
from ..core.deprecation import renamed
from .cell_front import CellFront
from .checkpoint import save_checkpoint_atomic
from .loop import WindowLoop
from .out_of_memory import MicroBatchHalving
from .run_plan import RunSettings, plan_run
from .state import dataset_starting_at
from .nonfinite import DEFAULT_MAX_NONFINITE_WINDOWS

OWNER = "GradientAccumulation"


class TrainState(nn.Cell):
    r"""
    What a checkpoint holds: the loss network, the optimizer and the loss scale with its update cell's counters
    (when there is one), not the transient gradient buffers. :class:`GradientAccumulation` saves its
    ``train_state`` at each epoch's end.

    Args:
        loss_network (Cell): The loss network.
        optimizer (Cell): Its optimizer (its moments and global step are saved with it).
        scale_sense (Parameter, optional): The loss scale. Default: ``None``.
        loss_scale_manager (Cell, optional): The loss-scale update cell, whose counters are saved. Default:
            ``None``.

    Inputs:
        - **\*inputs** (Tuple(Tensor)) - What the loss network takes.

    Outputs:
        The loss network's output.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> state = ms_accum.TrainState(nn.WithLossCell(net, nn.MSELoss()), optimizer)
        >>> path = ms_accum.save_checkpoint_atomic(state, "/tmp/train_state.ckpt")
        >>> sorted(ms_accum.read_checkpoint(path))[:3]
        ['bias', 'global_step', 'learning_rate']
    """

    def __init__(self, loss_network, optimizer, scale_sense=None, loss_scale_manager=None):
        super().__init__(auto_prefix=False)
        self.network = loss_network
        self.optimizer = optimizer
        self.scale_sense = scale_sense
        self.loss_scale_manager = loss_scale_manager

    def construct(self, *inputs):
        return self.network(*inputs)


class GradientAccumulation:
    r"""
    Trains a network with gradient accumulation on one device, or in data parallel on several (launched with msrun,
    each device its own micro-batches, each window's gradient reduced once): N micro-batches per optimizer step, a
    fixed number, a schedule over the updates, or chosen from the measured noise scale.

    Builds the loss network and one engine cell, ``cell`` (a :class:`TrainAccuStepsCell`, or a
    :class:`TrainAccuStepsWithLossScaleCell` with `scale_sense`, its buffers named ``grad_sum``), and runs it over a
    dataset through the window loop it shares with :class:`Model_ACCU`, with the network in training mode
    (``set_train(True)``, as :meth:`mindspore.train.Model.train` does: BatchNorm normalises with batch statistics
    and updates its moving statistics once per micro-batch, Dropout is active). The cell counts the windows and
    chooses N on the device. By default each update equals one large-batch step on exactly the samples of its
    window, or on its items when the loss network returns ``(loss, num_items)`` (see
    :class:`TrainForwardBackward`). Every micro-batch runs the cell's accumulation graph and each window's end one
    small graph without the network, so the network is compiled once and its activations are held once.

    Args:
        network (Cell): The network to train.
        loss_fn (Cell, optional): The loss; ``None`` if `network` already returns the loss (or
            ``(loss, num_items)``).
        optimizer (Cell): The optimizer over the network's trainable parameters.
        average (bool): ``True`` (default) applies the mean gradient over the window's samples or items;
            ``False`` applies the raw sum of micro-batch gradients, as the MindSpore tutorial does.
        sens (numbers.Number): Gradient seed, as in :class:`mindspore.nn.TrainOneStepCell`. Default: ``1.0``.
        clip_norm (float, optional): Clip each window's gradient to this global norm, once per update (see
            :class:`TrainOptim`). Default: ``None`` (no clipping).
        scale_sense (Union[Tensor, Cell, mindspore.amp.LossScaler], optional): Loss scaling: a scale Tensor, a
            loss-scale update cell (as in :class:`mindspore.nn.TrainOneStepWithLossScaleCell`) or an amp
            LossScaler, starting from a finite scale > 0. A window in which any micro-batch overflowed is skipped
            whole and the scale is updated once per window (see :class:`TrainOptim`); telemetry counts the skipped
            windows. Default: ``None``.
        noise_scale (Union[bool, str]): Measure the gradient noise scale of every window (see
            :class:`TrainForwardBackward`): :class:`WindowTelemetry` then records each window's unbiased estimates
            of |G|^2 and tr(Sigma) and the smoothed noise scale B_simple in samples or items (see
            ``docs/noise_scale.md``). ``True`` measures every micro-batch, ``"first"`` only the first of each
            window on each device (one gradient pass per window instead of one per micro-batch; a noisier
            estimate). Default: ``False``.
        nonfinite (str): A window whose gradient holds a NaN or an inf (without a loss scale) is skipped,
            parameters and optimizer state untouched; ``"skip"`` warns (:class:`NonFiniteWindowWarning`, naming
            the window and its micro-batches' positions in their epoch) and goes on, ``"raise"`` stops at the
            first such window (:class:`NonFiniteWindowError`); ``"apply"`` checks nothing and applies it, as
            :class:`mindspore.nn.TrainOneStepCell` does. With `scale_sense` only ``"skip"`` is taken: its
            overflow skip decides, counted by :class:`WindowTelemetry` and stopped by `max_nonfinite_windows`, not
            warned of one by one (a dynamic loss scale overflows by design). Default: ``"skip"``.
        lr_scaling (str): How the learning rate follows the window's global batch G when N changes, passed to the
            cell (see :class:`TrainAccuStepsCell`): ``"none"``, ``"linear"`` (G / G0), ``"sqrt"`` (sqrt(G / G0))
            or ``"adascale"`` (AdaScale's gain; needs `noise_scale`); with a rule the optimizer's schedule reads
            the run's progress in reference steps, not its update count. Default: ``"none"``.
        reference_batch (float, optional): G0 in samples or items, > 0; given with a rule only (refused without
            one). Default: ``None``: the first window's.

    Raises:
        RuntimeError: If the parallel mode reduces gradients across devices (DATA_PARALLEL) but
            ``mindspore.communication.init()`` was not called.
        TypeError: If `network` or `loss_fn` is not a Cell, `network` is a WithLossCell given with `loss_fn`,
            `optimizer` is not an optimizer, `average` is not a bool, `noise_scale` is neither a bool nor a str,
            or `scale_sense` is none of the loss-scale forms.
        ValueError: If `network` holds no Parameters while `loss_fn` does (the two swapped), or its construct
            needs more than the data with `loss_fn` given (a loss network), none of the
            optimizer's parameters is a parameter of the loss network (some not: a warning), one has
            ``requires_grad=False``, `sens` is zero or not finite, `clip_norm` is not a finite number > 0,
            `noise_scale` is a str other than ``"first"`` or is set with ``average=False``, or `nonfinite` is not
            ``"skip"`` (or `sens` not 1.0) with `scale_sense`, or its scale is not a finite number > 0, or
            `lr_scaling` or `reference_batch` is refused as listed for :class:`TrainOptim`.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> import mindspore.dataset as ds
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> data = ds.NumpySlicesDataset({"x": np.ones((64, 4), np.float32), "y": np.zeros((64, 2), np.float32)},
        ...                              shuffle=False).batch(8)
        >>> trainer = ms_accum.GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1))
        >>> losses = trainer.train_process(1, data, gradient_accumulation_steps=4, ckpt_path=None)
        epoch: 1 step: 1 loss is ...
        epoch: 1 step: 2 loss is ...
    """

    def __init__(self, network, loss_fn, optimizer, average=True, sens=1.0, clip_norm=None, scale_sense=None,
                 noise_scale=False, nonfinite="skip", lr_scaling="none", reference_batch=None):
        # The engine cell checks its own settings (the optimizer, average, clip_norm, noise_scale, nonfinite, the
        # learning-rate rule, loss scale), naming this trainer; only what the cell never sees is checked here.
        if loss_fn is not None:
            check_cell(OWNER, "network", network)
            check_cell(OWNER, "loss_fn", loss_fn)
            if isinstance(network, nn.WithLossCell):  # its construct would be given the data alone (a trial)
                raise TypeError(f"For '{OWNER}', 'network' must be the network without its loss when 'loss_fn' is "
                                f"given, but got a WithLossCell, which holds a loss already. Pass the bare network "
                                f"with loss_fn, GradientAccumulation(net, loss_fn, optimizer), or the loss network "
                                f"with loss_fn=None.")
            held = len(list(loss_fn.get_parameters()))
            if held and not list(network.get_parameters()):  # swapped (a new user's trial): they failed in
                # the loss's construct with Python's "missing 1 required positional argument"
                raise ValueError(f"For '{OWNER}', 'network' must be the network you train and 'loss_fn' its loss, "
                                 f"but 'network' ({type(network).__name__}) holds no Parameters while 'loss_fn' "
                                 f"({type(loss_fn).__name__}) holds {held}: they look swapped. Pass "
                                 f"GradientAccumulation(network, loss_fn, optimizer), or a loss network that holds "
                                 f"the trained Parameters with loss_fn=None.")
            taken = construct_inputs(network)
            if taken is not None and taken[0] > 1:  # a loss network given with a loss_fn (a new user's trial)
                raise ValueError(f"For '{OWNER}', with 'loss_fn' given, 'network' is called with each row's data "
                                 f"alone and its output goes to loss_fn with the label (nn.WithLossCell), but "
                                 f"{type(network).__name__}.construct({taken[2]}) needs {taken[0]} inputs. If "
                                 f"'network' computes the loss itself, pass loss_fn=None.")
        loss_network = network if loss_fn is None else nn.WithLossCell(network, loss_fn)
        if scale_sense is not None and sens != 1.0:
            raise ValueError(f"For '{OWNER}', 'sens' must be 1.0 with 'scale_sense', whose loss scale is the "
                             f"gradient's seed, but got {sens!r}. Multiply the loss by it instead, or drop "
                             f"'scale_sense'.")
        # The engine cell, its errors naming this trainer, its buffers and counters under the names of grad_sum
        # (those of the state files written before it drove one cell).
        naming = CellNaming(OWNER, "a new GradientAccumulation", "grad_sum", "grad_sum", float32_buffers=True)
        if scale_sense is None:
            self.cell = TrainAccuStepsCell(loss_network, optimizer, sens, clip_norm=clip_norm,
                                           noise_scale=noise_scale, average=average, nonfinite=nonfinite,
                                           lr_scaling=lr_scaling, reference_batch=reference_batch, _naming=naming)
        else:
            self.cell = TrainAccuStepsWithLossScaleCell(loss_network, optimizer, scale_sense, clip_norm=clip_norm,
                                                        noise_scale=noise_scale, average=average,
                                                        nonfinite=nonfinite, lr_scaling=lr_scaling,
                                                        reference_batch=reference_batch, _naming=naming)
        self.network = network
        self.optimizer = optimizer
        self.loss_network = loss_network
        self.grad_sum = self.cell.accu_grads
        self.train_state = TrainState(self.loss_network, optimizer, self.cell.accu_scale,
                                      self.cell.loss_scale_manager)

    @property
    def nonfinite(self):
        """What a window whose gradient is not finite does: the cell's ``nonfinite``."""
        return self.cell.nonfinite

    # what the driver held up to ms_accum 0.3: its three cells, whose counters and records the engine cell now holds;
    # called, each does what the cell it was did (a loop of 0.3 called them: one update a window, not one a call)
    forward_backward = renamed("forward_backward", "cell", "now the engine cell",
                               call=lambda trainer, *data: _old_forward_backward(trainer, data))
    optim = renamed("optim", "cell", "now the engine cell", call=lambda trainer: trainer.cell.end_window())
    clear = renamed("clear", "cell.drop", "now the engine cell's")

    def train_process(self, epoch, train_dataset, gradient_accumulation_steps=None, callbacks=None,
                      partial_window="flush", ckpt_path="gradient_accumulation.ckpt", log_every=1, initial_epoch=0,
                      state_path=None, save_state_every=0, resume_from=None,
                      max_nonfinite_windows=DEFAULT_MAX_NONFINITE_WINDOWS,
                      *, global_batch_size=None, plan=None, on_out_of_memory="raise", accumulation_steps=None,
                      mini_steps=None, accumulate_step=None):
        r"""
        Train for `epoch` epochs, one optimizer step every `gradient_accumulation_steps` micro-batches.

        N may change between windows: a schedule ``{first_update: N}`` (``{0: 1, 2: 2, 4: 3}``: updates
        0 and 1 hold one micro-batch, 2 and 3 two, then three), or an :class:`AdaptiveAccumulation` policy. Each
        window is still exactly the large-batch step of its own size, and the optimizer's step (hence a
        learning-rate schedule) still advances once per window, unless the trainer was built with a learning-rate
        rule (`lr_scaling`), which reads the schedule at the run's progress in reference steps of G0 samples
        instead (docs/batch_schedules.md); telemetry records each window's N, and an exact state file resumes at
        the same place in the schedule. In GRAPH_MODE a change of N compiles nothing.

        A window that is still open at the end of an epoch is handled by `partial_window`:

        - ``"flush"`` (default): apply it as a smaller window (weighted by its own samples), so every epoch ends
          with empty buffers;
        - ``"drop"``: discard its gradients;
        - ``"carry"``: keep it open into the next epoch; one still open after the last epoch is flushed.

        The network is put in training mode first and left in it.

        Callbacks see one step per window (``on_train_step_begin`` before its first micro-batch,
        ``on_train_step_end`` after its update): ``cur_step_num`` counts updates since the start (a dropped
        partial window is not one; an epoch that ends inside a window carried on counts that window, and
        ``open_micro_batches``, at an epoch's begin and end, gives its micro-batches so far: 0 when none is
        open, and at every update's end), ``batch_num`` the epoch's updates (the windows that end in it; under an
        adaptive N, an epoch's at its first N), ``total_updates`` the run's updates (None under an adaptive N),
        ``micro_batches_done`` and ``total_micro_batches`` the run's progress, ``net_outputs`` is the
        window's mean loss over its samples or items, and ``train_network`` holds the network and optimizer
        (what :class:`mindspore.train.ModelCheckpoint` saves, without the gradient buffers).
        ``window_micro_batches`` gives the micro-batches in the update's window, and ``window_record()`` its
        :class:`WindowRecord` (read by :class:`WindowTelemetry`).

        Args:
            epoch (int): Number of passes over `train_dataset`, >= 1.
            train_dataset (Dataset): Batched dataset; each row is one micro-batch, passed to the loss network
                as its inputs (the network's inputs followed by the label).
            gradient_accumulation_steps (Union[int, dict, str, AccumulationSchedule, AdaptiveAccumulation]): N, the
                micro-batches per update, >= 1; or a schedule ``{first_update: N}`` (see
                :class:`AccumulationSchedule`), also as text such as ``"0:1,2:2,4:3"``; or an
                :class:`AdaptiveAccumulation` policy (needs the trainer's ``noise_scale=True``). No window may exceed
                the micro-batches in an epoch unless `partial_window` is ``"carry"``.
            callbacks (Union[Callback, list[Callback]], optional): MindSpore callbacks. Default: ``None``.
            partial_window (str): ``"flush"``, ``"drop"`` or ``"carry"``. Default: ``"flush"``.
            ckpt_path (str, optional): Where to save the network and optimizer state at the end (written
                atomically; in data parallel by rank 0 alone, every device holding the same); ``None`` to skip.
                Default: ``"gradient_accumulation.ckpt"``.
            log_every (int): Print ``epoch: E step: S loss is L`` every this many updates, S counting the
                epoch's updates (as an uninterrupted run counts them after a resume, except in an
                :class:`AdaptiveAccumulation` run resumed inside an epoch, whose earlier N are not saved: S then
                counts the updates since the resume); 0 to stay quiet. Default: ``1``.
            initial_epoch (int): Epochs already done (when resuming from an epoch checkpoint that holds the
                network and optimizer): training runs epochs ``initial_epoch + 1 .. epoch``, seeing the data in the
                order an uninterrupted run would. Default: ``0``.
            state_path (str, optional): Where to keep the exact training state (network, optimizer, gradient
                buffers, window counters and the position in the data), written atomically. Default: ``None``.
            save_state_every (int): Write `state_path` every this many micro-batches; with 0, only where training
                stops early: on a callback's ``run_context.request_stop()`` and before :class:`NonFiniteWindowError`.
                Default: ``0``.
            resume_from (str, optional): A state file written through `state_path`: training continues at the
                exact micro-batch where it was written, and ends with the parameters of an uninterrupted run
                (given deterministic data order and kernels; dropout masks are not restored). Default: ``None``.
            max_nonfinite_windows (int): Stop once this many windows in a row were skipped (non-finite, or
                overflowing under a loss scale), with :class:`NonFiniteWindowError`; the state is written to
                `state_path` first. Default: ``50``.
            global_batch_size (int, optional): Samples per update, G, in place of `gradient_accumulation_steps`:
                N = G / the dataset's batch size (keyword only). State files record G, and a resume that would
                change it is refused. Default: ``None``.
            plan (MicroBatchPlan, optional): A plan from :func:`plan_micro_batch`, in place of
                `gradient_accumulation_steps` and `global_batch_size`: N is its ``steps``, and the dataset must be
                batched at its ``micro_batch`` (keyword only). Default: ``None``.
            on_out_of_memory (str): ``"raise"`` (default), or ``"halve"``: a window whose micro-batch fails with
                MindSpore's device out-of-memory error is discarded (nothing was applied) and run again from its
                start with every micro-batch split in two along its leading dimension, twice as many of them, and
                so on while the error comes back; the global batch and the update count stay the same, and the
                split is kept for the rest of the run. BatchNorm's moving statistics see the rerun micro-batches
                again. Not run on a GPU or Ascend device yet (tested on CPU through a seam) (keyword only).
            accumulation_steps, mini_steps, accumulate_step: Older names of `gradient_accumulation_steps`,
                accepted in its place (keyword only).

        Returns:
            list[float], the mean loss of every update's window this call made, in order (a resumed run's from the
            resume on; the telemetry CSV keeps the earlier ones). They are read from the device at the end (and
            when printed), so the loop does not wait for every update to finish.

        Raises:
            TypeError: If `epoch` or `initial_epoch` is not an int, `train_dataset` is not a mindspore.dataset.Dataset,
                `gradient_accumulation_steps` is none of the types above (see
                :class:`AccumulationSchedule` for a malformed schedule), or is given with `global_batch_size`, or
                `callbacks` is not a Callback or a list or tuple of them.
            CheckpointError: If `resume_from` is not a state file of this model (see :func:`load_training_state`).
            ValueError: If `ckpt_path`, `state_path` or `resume_from` is not a str ending with '.ckpt' (before
                training), `epoch` or N is < 1 (or a schedule is malformed), `initial_epoch` is not in [0, epoch),
                `partial_window` is unknown, the dataset is empty, N (a schedule's or policy's largest) exceeds
                the micro-batches in an epoch with `partial_window` other than ``"carry"``, N is an
                :class:`AdaptiveAccumulation` without ``noise_scale=True``, `global_batch_size` is not a multiple
                of the dataset's batch size, the dataset's columns are more or fewer than the loss network takes,
                the optimizer's learning-rate list is shorter than the run's updates (with `lr_scaling`, than
                the reference steps the run reaches), in data parallel if the devices' micro-batches an epoch,
                N, shards or learning-rate rule differ or `on_out_of_memory` is ``"halve"``, or, before the first
                step, with MindSpore's compile cache on, if its stored graphs were compiled with other settings.
        """
        owner = "GradientAccumulation.train_process"
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 0:
            raise ValueError(f"For '{owner}', 'log_every' must be an int >= 0, but got {log_every!r}.")
        if ckpt_path is not None:  # refused before training, not once it has ended
            check_ckpt_path(owner, "ckpt_path", ckpt_path)
        settings = RunSettings(epoch, train_dataset, gradient_accumulation_steps, dict(
            accumulation_steps=accumulation_steps, mini_steps=mini_steps, accumulate_step=accumulate_step),
            global_batch_size, plan, partial_window, initial_epoch, resume_from, state_path, save_state_every,
            max_nonfinite_windows, callbacks, on_out_of_memory)
        run_plan = plan_run(owner, self.cell, settings, required_steps=True,
                            columns_hint="" if self.loss_network is not self.network else (
                                " With loss_fn=None, 'network' is the loss network: its construct takes every column "
                                "(the data, the labels and any mask or weights) and returns the loss, or (loss, "
                                "num_items) (docs/weighting.md)."))
        self.cell._on_first_call()  # pylint: disable=protected-access  (the compile cache's settings, first)
        run_plan.start(self.cell)
        self.cell.set_train(True)
        run = _Run(self, run_plan, log_every)
        run.loop(train_dataset)
        if ckpt_path is not None and run_plan.rank == 0:
            save_checkpoint_atomic(self.train_state, ckpt_path)
        return [float(loss.asnumpy()) for loss in run.history]

    def _add_micro_batch(self, data):
        """Add one micro-batch (a tuple of Tensors) to the open window: the cell's accumulation graph."""
        self.cell.set_accumulation(True)
        return self.cell(*data)


def _old_forward_backward(trainer, data):
    """What 0.3's ``trainer.forward_backward(*data)`` did: add the micro-batch to the open window, never update
    (the driver's own :meth:`GradientAccumulation._add_micro_batch`); returns its loss. The cell's mode is given
    back afterwards."""
    mode = trainer.cell.accumulation
    try:
        return trainer._add_micro_batch(data)  # pylint: disable=protected-access
    finally:
        trainer.cell.set_accumulation(mode)


def updates_per_epoch(steps, gradient_accumulation_steps, partial_window):
    """
    Updates the driver makes in an epoch, the callbacks' ``batch_num``.

    Args:
        steps (int): Micro-batches per epoch.
        gradient_accumulation_steps (int): Micro-batches per update.
        partial_window (str): ``"flush"`` (a partial window is one more update), ``"drop"`` or ``"carry"``
            (windows that end inside the epoch, rounded down; with "carry" an epoch may end one more).

    Returns:
        int.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> ms_accum.updates_per_epoch(1875, 4, "flush"), ms_accum.updates_per_epoch(1875, 4, "drop")
        (469, 468)
    """
    before, _ = AccumulationSchedule(gradient_accumulation_steps).run_plan(steps, 2, partial_window)
    return before[1]  # the first of two epochs: a carried window is not yet an update


class _Run(CellFront):
    """The driver's side of one train_process call: its callback parameters, the history of losses, the printed
    lines and the micro-batch halving on out-of-memory."""

    def __init__(self, owner, plan, log_every):
        super().__init__(plan.owner, owner.cell, plan.settings.max_nonfinite_windows)
        self.trainer = owner
        self.plan = plan
        self.log_every = log_every
        self.history = []  # each update's mean-loss tensor, read from the device only when printed or at the end
        self.halving = None  # a MicroBatchHalving under on_out_of_memory="halve"
        self.updates_in_epoch = 0
        cb_params = InternalCallbackParam()
        cb_params.train_network = owner.train_state
        cb_params.network = owner.network
        cb_params.optimizer = owner.optimizer
        cb_params.epoch_num = plan.epochs
        cb_params.batch_num = plan.updates_per_epoch  # the loop sets each epoch's, when known
        cb_params.total_updates = plan.total_updates  # None when a policy decides as it goes
        cb_params.cur_epoch_num = plan.start_micro // plan.micro_batches_per_epoch
        cb_params.cur_step_num = plan.start_updates
        cb_params.dataset_sink_mode = False
        cb_params.mode = "train"
        cb_params.net_outputs = None
        cb_params.window_micro_batches = cb_params.window_micro_steps = 0
        self.cb_params = cb_params

    def loop(self, train_dataset):
        """Run every epoch through the shared window loop."""
        plan, settings = self.plan, self.plan.settings
        self.cb_params.train_dataset = train_dataset
        writer = plan.state_writer(self.cell)
        self.updates_in_epoch = self._updates_done_in_epoch(plan.open_micro_batches)  # a resumed window may be open
        with dataset_starting_at(train_dataset, plan.start_micro):
            iterator = train_dataset.create_tuple_iterator(num_epochs=plan.epochs)
        with CallbackManager(settings.callbacks) as callbacks:
            loop = WindowLoop(self, plan.epochs, plan.micro_batches_per_epoch, settings.partial_window, self.cb_params,
                              callbacks, plan.start_micro, plan.open_micro_batches, writer, plan.updates_before)
            if settings.on_out_of_memory == "halve":
                add = self.trainer._add_micro_batch  # pylint: disable=protected-access  (the tests' seam)
                self.halving = MicroBatchHalving(self.owner, add, self.end_window, self.cell.drop, loop.window)
            loop.run(lambda epoch: iterator)

    def _updates_done_in_epoch(self, pending):
        """The updates an uninterrupted run had applied in the current epoch at the start (a window carried into
        it counts in it): windows begun less the open one (`pending` micro-batches in it) and those of earlier
        epochs. 0 in an adaptive run, whose earlier N are not known."""
        plan = self.plan
        if plan.updates_before is None:
            return 0
        return plan.start_updates - (1 if pending else 0) - plan.updates_before[plan.start_micro //
                                                                               plan.micro_batches_per_epoch]

    def accumulate(self, data):
        if self.halving is not None:
            self.halving.accumulate(data)
        else:
            self.trainer._add_micro_batch(data)  # pylint: disable=protected-access

    def update(self, data):
        """Add the window's last micro-batch, step the optimizer once from the window and clear it; returns the
        window's outputs (its mean loss, or (mean loss, overflow, loss scale))."""
        if self.halving is not None:
            return self.halving.update(data)
        return super().update(data)

    def drop(self):
        if self.halving is not None:
            self.halving.drop()
        else:
            super().drop()

    def updated(self, cb_params, update, micro_batches, window_steps, outputs):
        self.updates_in_epoch += 1
        mean_loss = outputs[0] if isinstance(outputs, tuple) else outputs
        self.history.append(mean_loss)
        if self.log_every and self.updates_in_epoch % self.log_every == 0:
            print(f"epoch: {cb_params.cur_epoch_num} step: {self.updates_in_epoch} loss is "
                  f"{float(mean_loss.asnumpy()):.6f}", flush=True)

    def epoch_ends(self, cb_params, callbacks):
        self.updates_in_epoch = 0
