"""Model_ACCU: a mindspore.train.Model that alternates an accumulation graph and the window's end.

In dataset sink mode (GPU, Ascend; GRAPH_MODE) each window runs the accumulation graph sunk for N steps (its loop
size registered once), then the window's end, a graph of the cell without the network and without data. Elsewhere
(CPU, PYNATIVE, dataset_sink_mode=False) the same alternation runs micro-batch by micro-batch. Only the
accumulation graph holds the network's forward and backward, so its activations are held once.
Written against the Model internals of MindSpore 2.7 to 2.10 (train/model.py `_train`, `_train_process`,
`_train_dataset_sink_process`; train/dataset_helper.py `DatasetHelper`, `connect_network_with_dataset`); the
private names and the methods it overrides are checked in ``_compat.py`` when ms_accum is imported.
"""
import math

from mindspore.dataset import Dataset
from mindspore.train.callback import Callback, RunContext
from mindspore.train.dataset_helper import DatasetHelper, connect_network_with_dataset
from mindspore.train import model as _ms_model
from mindspore.train.model import Model

from ..compat import (callbacks_of, check_model_internals, check_network_mode, eval_during_train,
                      exec_train_preprocess, flush_from_cache, mark_backbone_training, needs_dataset_reset,
                      register_sink_loop, reset_op_ids, set_current_position, set_sink_loop_size, set_sink_total,
                      set_training_dataset, store_training_step_info, train_network, transfer_tensor_to_tuple)
from ..core.checks import check_bool, check_int_at_least, check_positive_int
from ..core.schedule import STEPS_ALIASES, STEPS_NAME, steps_argument, steps_given
from ..core.user_warning import warn
from ..cells.parallel import ACCUMULATE_PHASE, AccumulationModes
from .cell_front import CellFront
from .loop import WindowLoop, callback_list
from .run_checks import check_lr_schedule, check_state_saving
from .run_plan import RunSettings, plan_run
from .nonfinite import DEFAULT_MAX_NONFINITE_WINDOWS
from .state import dataset_starting_at

check_model_internals(Model)

# Model_ACCU.train's keyword arguments beyond Model.train's (N under its names last), which Model_ACCU.fit takes too
_RUN_OPTIONS = ("resume_from", "partial_window", "max_nonfinite_windows", "global_batch_size", "plan")
_TRAIN_OPTIONS = _RUN_OPTIONS + (STEPS_NAME,) + STEPS_ALIASES


def _sink_falls_back():
    """Whether MindSpore's Model trains without sink when asked for sink mode: on CPU (``Model._train``)."""
    return _ms_model.context.get_context("device_target") == "CPU"


def _check_fixed_steps(owner, cell):
    """Dataset sink mode compiles its two graphs for one loop size each: it runs one N, not a schedule or a
    policy; a learning-rate rule is warned of (one N gives it one G: nothing to follow)."""
    if not isinstance(cell.gradient_accumulation_steps, int):
        raise ValueError(f"For '{owner}', the cell's 'gradient_accumulation_steps' must be one int in dataset sink "
                         f"mode: its accumulation graph is compiled for a sink loop of N steps, but got "
                         f"{cell.gradient_accumulation_steps!r}. Train with dataset_sink_mode=False, which follows a "
                         f"schedule or an AdaptiveAccumulation window by window, or pass one int N.")
    if cell.lr_scaling != "none":  # the rule still runs at each window's end: with one G it has nothing to follow
        warn(f"For '{owner}', dataset sink mode runs one N ({cell.gradient_accumulation_steps}), so the "
             f"learning-rate rule lr_scaling={cell.lr_scaling!r} has no batch change to follow: its factor "
             f"is 1 in every window when G0 is the first window's items (G / G0 throughout with a "
             f"reference_batch of other items; AdaScale's gain 1 likewise), and the schedule reads the "
             f"update count. Train with dataset_sink_mode=False to change N (a schedule, a policy) with "
             f"the learning rate following it.", UserWarning)


class _Carrier(Callback):
    """Carries a run's :class:`RunPlan` from :meth:`Model_ACCU.train` to the training process that
    :class:`mindspore.train.Model` calls, inside the callback list it hands that process (the plan travels with
    the call, not on the model). It does nothing as a callback."""

    def __init__(self, run):
        super().__init__()
        self.run = run


def _check_model_training_settings(amp_level, boost_level, loss_scale_manager):
    """Model's own training settings, which it applies to the optimizer it builds a training network with: refused,
    as the accumulation cell is that network (MindSpore's own refusal names the optimizer, which Model_ACCU must
    not be given)."""
    if loss_scale_manager is not None:
        raise TypeError(f"For 'Model_ACCU', 'loss_scale_manager' must be None because the accumulation cell scales "
                        f"the loss itself, but got {type(loss_scale_manager).__name__}. Build the cell as "
                        f"TrainAccuStepsWithLossScaleCell(loss_net, optimizer, scale_sense=...), with "
                        f"nn.DynamicLossScaleUpdateCell(2**12, 2, 1000) for a DynamicLossScaleManager or "
                        f"nn.FixedLossScaleUpdateCell(2**12) for a FixedLossScaleManager.")
    for name, level in (("amp_level", amp_level), ("boost_level", boost_level)):
        if level not in (None, "O0"):
            hint = ("Convert the network first, net = mindspore.amp.auto_mixed_precision(net, " + repr(level) +
                    "), then build the accumulation cell on it" if name == "amp_level" else
                    "MindSpore's boost wraps its own training network, which accumulation replaces: leave it 'O0'")
            raise ValueError(f"For 'Model_ACCU', '{name}' must be 'O0' because the accumulation cell, built before "
                             f"Model sees it, is the training network, but got {level!r}. {hint}.")


def _check_validation(valid_dataset, valid_frequency):
    """Model.fit's validation arguments, checked before training (Model's fit took a valid_frequency of 0 and
    failed with a ZeroDivisionError once the first epoch had trained)."""
    if valid_dataset is not None and not isinstance(valid_dataset, Dataset):
        raise TypeError(f"For 'Model_ACCU.fit', 'valid_dataset' must be a mindspore.dataset.Dataset or None, but got "
                        f"{type(valid_dataset).__name__}. Wrap the validation data as the training data are, for "
                        f"example mindspore.dataset.NumpySlicesDataset(...).batch(b).")
    if isinstance(valid_frequency, list):
        for epoch in valid_frequency:
            check_positive_int("Model_ACCU.fit", "valid_frequency", epoch)
    else:
        check_positive_int("Model_ACCU.fit", "valid_frequency", valid_frequency)


def _carried_run(cb_params):
    """The RunPlan a :class:`_Carrier` brought into Model's training process."""
    carriers = [callback for callback in callbacks_of(cb_params) if isinstance(callback, _Carrier)]
    if len(carriers) != 1:
        raise RuntimeError(f"For 'Model_ACCU', training must go through Model_ACCU.train or Model_ACCU.fit, which "
                           f"lay the run's windows out before Model trains, but {len(carriers)} such layouts reached "
                           f"the training process. Call Model_ACCU.train or Model_ACCU.fit.")
    return carriers[0].run


def _give_callbacks_the_optimizer(cb_params, cell):
    """MindSpore's Model hands callbacks the optimizer it was given (``cb_params.optimizer``), which Model_ACCU never
    is: the cell holds it. Callbacks that read or set the rate (MindSpore's ``LearningRateScheduler``) get the
    cell's."""
    if cb_params.optimizer is None:
        cb_params.optimizer = cell.optimizer


class _ModelFront(CellFront):
    """Model_ACCU's side of the shared window loop: the cell's window loop (:class:`CellFront`), and what
    :class:`mindspore.train.Model` does around epochs (evaluation during training, the dataset's reset)."""

    def __init__(self, owner, model, train_dataset, valid_infos, max_nonfinite_windows):
        super().__init__(owner, train_network(model), max_nonfinite_windows)
        self.model, self.train_dataset, self.valid_infos = model, train_dataset, valid_infos

    def run_cell(self, data, accumulate):
        check_network_mode(self.model, self.cell)
        return super().run_cell(data, accumulate)

    def step_begins(self, cb_params, data):
        set_current_position(self.model, cb_params.cur_epoch_num,
                             int((cb_params.cur_step_num - 1) % cb_params.batch_num + 1))
        cb_params.train_dataset_element = data

    def epoch_begins(self, cb_params):
        set_current_position(self.model, cb_params.cur_epoch_num, 0)

    def epoch_ends(self, cb_params, callbacks):
        reset_op_ids()
        eval_during_train(self.model, self.valid_infos, cb_params, callbacks)
        self.train_dataset.reset()
        flush_from_cache(self.model, cb_params)

    def epoch_ended(self, cb_params):
        cb_params.pop("metrics", None)
        cb_params.pop("eval_results", None)


class Model_ACCU(Model):  # pylint: disable=invalid-name  (the name users know from the tutorial)
    r"""
    A :class:`mindspore.train.Model` that trains a :class:`TrainAccuStepsCell` (or its loss-scale variant) with
    one optimizer step per N micro-batches.

    Callbacks see one step per update: ``epoch_num`` is the run's epochs (a run begun at `initial_epoch`
    included; Model's is the epochs of the call), ``cur_step_num`` counts updates (an epoch that ends inside a
    window carried on, ``partial_window="carry"``, counts that window, and ``open_micro_batches`` gives its
    micro-batches so far at an epoch's begin and end; 0 at every update's end), ``batch_num`` is the epoch's
    updates (per sink in sink mode), ``net_outputs`` is the update call's output (the window's mean loss; a
    tuple with the overflow flag and loss scale for the loss-scale cell), ``window_record()`` gives the update's
    :class:`WindowRecord` (for :class:`WindowTelemetry`), and step callbacks fire only at update boundaries,
    where ``accu_grads`` are zero, so that a checkpoint they write holds no half-filled window (an epoch's end
    inside a carried window is not one).

    Without sink mode a window still open at the end of an epoch (dataset size not a multiple of N) is applied
    as a smaller window, weighted by its own samples. In sink mode `sink_size` (the dataset size when -1) must
    be a multiple of N.

    Args:
        network (Cell): A :class:`TrainAccuStepsCell` or :class:`TrainAccuStepsWithLossScaleCell`. With a cell
            built with ``nonfinite="raise"``, a window whose gradient is not finite stops training with a
            :class:`NonFiniteWindowError` that names the window's micro-batches (the cell skips the window, then
            raises its own error, which Model_ACCU replaces); the cell is left as it was built. A learning-rate
            rule is the cell's (its `lr_scaling`): it follows N without sink mode; in dataset sink mode, where N
            is one int, its factor stays 1 (G0 the first window's items) and a warning says so.
        gradient_accumulation_steps (Union[int, dict, str, AccumulationSchedule, AdaptiveAccumulation], optional):
            N, replacing the cell's: an int, a schedule (a dict, its text such as ``'0:1,2:2'``, or an
            :class:`AccumulationSchedule`) or a policy. Without sink mode each window is laid out with the cell's N
            for it (the int, the schedule's entry, or the policy's choice); dataset sink mode takes one int.
            ``accumulation_steps``, ``mini_steps`` and ``accumulate_step`` are accepted in its place (keyword only).
            Default: the cell's.
        state_path (str, optional): Without sink mode, where to keep the exact training state (the cell's
            parameters, a half-filled window included, and the position in the data), written atomically with
            the previous generation kept beside it. In data parallel each rank passes its own path. Default:
            ``None``.
        save_state_every (int): Write `state_path` every this many micro-batches; in data parallel at the first
            update boundary after every this many micro-batches, so that the ranks' files never differ by more
            than one generation. With 0, only where training stops early: on a callback's
            ``run_context.request_stop()`` and before :class:`NonFiniteWindowError`. Resume with
            ``train(..., resume_from=state_path)``. Default: ``0``.
        metrics, eval_network, eval_indexes, kwargs: As in :class:`mindspore.train.Model`. `loss_fn` and
            `optimizer` must be left ``None``: the cell holds them. So do Model's training settings: `amp_level` and
            `boost_level` must stay ``"O0"`` (convert the network with ``mindspore.amp.auto_mixed_precision``
            before building the cell on it) and `kwargs` must not hold a ``loss_scale_manager`` (build the cell
            as :class:`TrainAccuStepsWithLossScaleCell` with a `scale_sense`).

    Raises:
        TypeError: If `network` is not an accumulation cell, `loss_fn`, `optimizer` or a ``loss_scale_manager`` is
            given, or N is given twice or is not an int, a schedule or a policy.
        ValueError: If N is < 1, `state_path` is not a str ending with '.ckpt', or `amp_level` or `boost_level` is
            not ``"O0"``; at train time, if a schedule or
            policy meets dataset sink mode, if N exceeds the micro-batches of an epoch, in sink mode does not
            divide `sink_size`, or, with MindSpore's compile cache on, if its stored graphs were compiled with
            other settings.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> import ms_accum
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), optimizer,
        ...                                    gradient_accumulation_steps=4)
        >>> model = ms_accum.Model_ACCU(cell)
        >>> # model.train(epoch, dataset, callbacks=[LossMonitor()], dataset_sink_mode=True)
    """

    def __init__(self, network, loss_fn=None, optimizer=None, metrics=None, eval_network=None, eval_indexes=None,
                 amp_level="O0", boost_level="O0", gradient_accumulation_steps=None, state_path=None,
                 save_state_every=0, *, accumulation_steps=None, mini_steps=None, accumulate_step=None, **kwargs):
        if not isinstance(network, AccumulationModes):
            raise TypeError(f"For 'Model_ACCU', 'network' must be a TrainAccuStepsCell or "
                            f"TrainAccuStepsWithLossScaleCell, but got {type(network).__name__}. Wrap the loss "
                            f"network: Model_ACCU(TrainAccuStepsCell(loss_net, optimizer, "
                            f"gradient_accumulation_steps=N)).")
        if loss_fn is not None or optimizer is not None:
            raise TypeError("For 'Model_ACCU', 'loss_fn' and 'optimizer' must be None because the accumulation "
                            "cell already holds them, but got "
                            f"{type(loss_fn).__name__ if loss_fn is not None else type(optimizer).__name__}.")
        _check_model_training_settings(amp_level, boost_level, kwargs.get("loss_scale_manager"))
        aliases = dict(accumulation_steps=accumulation_steps, mini_steps=mini_steps, accumulate_step=accumulate_step)
        if steps_given(gradient_accumulation_steps, aliases):
            network.set_gradient_accumulation_steps(*steps_argument("Model_ACCU", gradient_accumulation_steps, aliases),
                                                    owner="Model_ACCU")
        check_state_saving("Model_ACCU", state_path, save_state_every)
        super().__init__(network, None, None, metrics, eval_network, eval_indexes, amp_level, boost_level,
                         **kwargs)
        self._registered_loops = set()
        self._state_path, self._save_state_every = state_path, save_state_every
        self._trained = False  # the cell's graphs hold its N once it has trained

    @property
    def gradient_accumulation_steps(self):
        """Micro-batches per update (the cell's: an int, a schedule or a policy)."""
        return train_network(self).gradient_accumulation_steps

    accumulation_steps = gradient_accumulation_steps  # the seed's name

    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1, initial_epoch=0,
              resume_from=None, partial_window="flush", max_nonfinite_windows=DEFAULT_MAX_NONFINITE_WINDOWS, *,
              global_batch_size=None, plan=None, gradient_accumulation_steps=None, accumulation_steps=None,
              mini_steps=None, accumulate_step=None):
        """
        :meth:`mindspore.train.Model.train`, plus exact resume and the partial-window policy without sink mode.

        The cell's mode (its ``accumulation`` attribute) is set for every micro-batch during training and
        restored afterwards.

        Args:
            resume_from (str, optional): A state file written through `state_path` (in data parallel, this
                rank's): training continues at the exact micro-batch where it was written (a half-filled window
                included) and ends with the parameters of an uninterrupted run, given deterministic data order and
                kernels. In data parallel the ranks first agree on the newest position all of them saved. A state
                written on another number of devices resumes at the same sample of its epoch when the global batch
                is the same (see :func:`load_training_state`; any of the saved run's files). Not with
                `dataset_sink_mode` on GPU/Ascend, nor with `initial_epoch`. Default: ``None``.
            partial_window (str): Without sink mode, what becomes of a window still open at an epoch's end, as in
                :meth:`GradientAccumulation.train_process`: ``"flush"`` applies it as a smaller window, ``"drop"``
                discards it, ``"carry"`` keeps it open into the next epoch (flushed after the last). Sink mode
                needs whole windows (`sink_size` a multiple of N). Default: ``"flush"``.
            max_nonfinite_windows (int): Stop once this many windows in a row were skipped (non-finite, or
                overflowing under a loss scale), with :class:`NonFiniteWindowError`; without sink mode the state is
                written to `state_path` first. Default: ``50``.
            global_batch_size (int, optional): Samples per update over all devices, G: sets the cell's N to
                G / (devices x the dataset's batch size) before its first window, so that a run keeps its global
                batch on any device count (keyword only). Default: ``None``, the cell's N.
            plan (MicroBatchPlan, optional): A plan from :func:`plan_micro_batch`, in place of
                `global_batch_size`: the cell's N becomes the plan's ``steps``, and the dataset must be batched at
                its ``micro_batch`` on its devices (keyword only). Default: ``None``.
            gradient_accumulation_steps (Union[int, dict, str, AccumulationSchedule, AdaptiveAccumulation],
                optional): N for this run, for a cell built without N (N 1), as the constructor takes it; under
                the same rules as `global_batch_size` (keyword only): a cell that has trained keeps its N.
                ``accumulation_steps``, ``mini_steps`` and ``accumulate_step`` are accepted in its place. Default:
                ``None``, the cell's N.
            Others: as in :meth:`mindspore.train.Model.train`.

        Raises:
            CheckpointError: If `resume_from` is not a state file of this cell and rank, or the ranks saved no
                common position.
            TypeError: If `train_dataset` is not a mindspore.dataset.Dataset, `callbacks` is not a Callback or a
                list or tuple of them, `dataset_sink_mode` is not a bool, or `sink_size` or `initial_epoch` is not
                an int.
            ValueError: As listed for the class, if `resume_from` is not a str ending with '.ckpt', `epoch` is not
                an int >= 1, `sink_size` is neither -1 nor >= 1, `train_dataset` is empty or its
                columns are more or fewer than the loss network takes, `partial_window` is unknown, `resume_from`
                is combined with `initial_epoch`, `global_batch_size` is not a multiple of devices x
                micro-batch (or `plan` does not fit the dataset or devices), or would change the N of a cell that
                has trained, or the cell's N is a schedule or a
                policy, the optimizer's learning-rate list is shorter than the run's updates (with the cell's
                `lr_scaling`, than the reference steps the run reaches), or in data parallel the devices' datasets
                hold different numbers of micro-batches.
        """
        settings = self._settings(epoch, train_dataset, callbacks, initial_epoch, dict(
            resume_from=resume_from, partial_window=partial_window, max_nonfinite_windows=max_nonfinite_windows,
            global_batch_size=global_batch_size, plan=plan, gradient_accumulation_steps=gradient_accumulation_steps,
            accumulation_steps=accumulation_steps, mini_steps=mini_steps, accumulate_step=accumulate_step))
        return self._plan_and_run("Model_ACCU.train", settings, dataset_sink_mode, sink_size,
                                  lambda epochs, carried, sink: super(Model_ACCU, self).train(
                                      epochs, train_dataset, carried, dataset_sink_mode, sink, initial_epoch))

    def fit(self, epoch, train_dataset, valid_dataset=None, valid_frequency=1, callbacks=None,
            dataset_sink_mode=False, valid_dataset_sink_mode=False, sink_size=-1, initial_epoch=0, **options):
        """
        :meth:`mindspore.train.Model.fit`: :meth:`train`, with the model evaluated on `valid_dataset` at the end of
        every `valid_frequency`-th epoch (its ``metrics``, as Model's fit; the results reach the callbacks'
        ``on_eval_end``).

        Args:
            valid_dataset, valid_frequency, valid_dataset_sink_mode: As in :meth:`mindspore.train.Model.fit`.
            options: The keyword arguments of :meth:`train` beyond Model's (`resume_from`, `partial_window`,
                `max_nonfinite_windows`, `global_batch_size`, `plan`, N under its names).
            Others: As in :meth:`train`.

        Raises:
            TypeError: If `options` holds an argument :meth:`train` does not take, or `valid_dataset` is neither a
                Dataset nor None.
            ValueError: As listed for :meth:`train`, or if `valid_frequency` is not an int >= 1 or a list of them
                (the epochs to evaluate after).
        """
        unknown = sorted(set(options) - set(_TRAIN_OPTIONS))
        if unknown:
            raise TypeError(f"For 'Model_ACCU.fit', the keyword arguments beyond Model.fit's must be those of "
                            f"Model_ACCU.train ({', '.join(_TRAIN_OPTIONS)}), but got {', '.join(map(repr, unknown))}.")
        _check_validation(valid_dataset, valid_frequency)
        settings = self._settings(epoch, train_dataset, callbacks, initial_epoch, options)
        return self._plan_and_run("Model_ACCU.fit", settings, dataset_sink_mode, sink_size,
                                  lambda epochs, carried, sink: super(Model_ACCU, self).fit(
                                      epochs, train_dataset, valid_dataset, valid_frequency, carried,
                                      dataset_sink_mode, valid_dataset_sink_mode, sink, initial_epoch))

    def _settings(self, epoch, train_dataset, callbacks, initial_epoch, options):
        """The RunSettings of a train or fit call: `options` are its keyword arguments beyond Model's
        (:data:`_TRAIN_OPTIONS`); one it leaves out takes RunSettings' default, which is train's."""
        aliases = {name: options.get(name) for name in STEPS_ALIASES}
        given = {name: options[name] for name in _RUN_OPTIONS if name in options}
        return RunSettings(epoch, train_dataset, options.get(STEPS_NAME), aliases,
                           initial_epoch=initial_epoch, state_path=self._state_path,
                           save_state_every=self._save_state_every, callbacks=callbacks, **given)

    def _plan_and_run(self, owner, settings, dataset_sink_mode, sink_size, launch):
        """Plan the run (`settings`, checked once), then `launch(epochs, callbacks, sink_size)` Model's training
        with the plan carried in the callbacks; the cell's mode is restored afterwards. A call refused before
        training leaves the cell's N as it was."""
        cell = train_network(self)
        check_bool(owner, "dataset_sink_mode", dataset_sink_mode)
        sink_size = check_int_at_least(owner, "sink_size", sink_size, 1, also=(-1, "the dataset size"))
        sinks = dataset_sink_mode and not _sink_falls_back()  # on CPU MindSpore trains without sink instead
        with cell.steps_kept_on_error():
            run = plan_run(owner, cell, settings, required_steps=False, trained=self._trained,
                           carry_hint=" (without sink mode)", check_learning_rate=not sinks)
            if dataset_sink_mode:  # on every device: a script tried on CPU must not fail first on a device
                self._check_sink_mode(run, sink_size)
        mode = cell.accumulation
        try:
            return launch(run.epochs, [_Carrier(run), *callback_list(settings.callbacks)], sink_size)
        finally:
            self._trained = True
            cell.accumulation = mode

    def _check_sink_mode(self, run, sink_size):
        """What dataset sink mode cannot carry, refused before training on every device (a script tried on CPU,
        where MindSpore trains without sink, must not fail for the first time on a GPU or Ascend)."""
        cell, settings, owner = train_network(self), run.settings, run.owner
        _check_fixed_steps(owner, cell)
        n = self.gradient_accumulation_steps
        dataset_size = run.micro_batches_per_epoch
        sink = dataset_size if sink_size == -1 else sink_size
        if sink % n:
            given = f"-1, the dataset size {dataset_size}" if sink_size == -1 else sink
            raise ValueError(f"For '{owner}', 'sink_size' must be a multiple of gradient_accumulation_steps "
                             f"{n} in dataset sink mode, but got {given}. Pass sink_size=k*{n}, or drop or pad "
                             f"batches.")
        if settings.partial_window != "flush":
            raise ValueError(f"For '{owner}', 'partial_window' must be 'flush' in dataset sink mode, which "
                             f"sinks whole windows only (sink_size a multiple of N), but got "
                             f"{settings.partial_window!r}. Pass dataset_sink_mode=False to drop or carry a window.")
        if settings.resume_from is not None or settings.save_state_every:
            raise ValueError(f"For '{owner}', exact state saving and 'resume_from' work without dataset "
                             "sink mode; pass dataset_sink_mode=False, or resume at an epoch with 'initial_epoch'.")
        epochs = settings.epochs  # the rate list against the sunk run's updates; sink mode resumes at an epoch only
        check_lr_schedule(owner, cell.optimizer, epochs * sink, epochs * (sink // n),
                          from_start=settings.initial_epoch == 0)
        cell._on_first_call()  # sink mode compiles the cell without calling it  # pylint: disable=protected-access
        if _sink_falls_back():
            last = dataset_size % n  # a device sinks whole windows; without sink an epoch's last is flushed
            flushed = f", its last window of {last} applied as a smaller one," if last else ","
            cut = "" if sink == dataset_size else (f"; 'sink_size' {sink} is not applied: each epoch runs all "
                                                   f"{dataset_size} micro-batches{flushed} where a device sinks "
                                                   f"{sink}")
            warn(f"For '{owner}', dataset sink mode needs a GPU or Ascend device: on CPU MindSpore "
                 f"trains without sink (its notice is logged at INFO level only){cut}. The checks a device "
                 f"makes passed. Pass dataset_sink_mode=False on CPU.", UserWarning)

    def predict(self, *predict_data, **kwargs):
        """Not supported: Model predicts with the network it was given, here the accumulation cell, whose call trains
        (it would add the batch to the window open in the cell's buffers, and the next window would hold it)."""
        raise RuntimeError("For 'Model_ACCU.predict', Model would predict with the network it was given, the "
                           "accumulation cell, whose call trains: it would add the batch's gradient to the window "
                           "open in the cell's buffers. Predict with your network instead: "
                           "mindspore.train.Model(net).predict(x), or net.set_train(False) and net(x).")

    def build(self, *args, **kwargs):
        """Not supported: it would compile a third 'train' graph and bind the dataset to it."""
        raise RuntimeError("For 'Model_ACCU', 'build' is not supported: the accumulation and update graphs are "
                           "compiled on the first window of 'train'. Call 'train' directly.")

    # ---------------------------------------------------------------- non-sink: micro-batch by micro-batch
    def _train_process(self, epoch, train_dataset, list_callback=None, cb_params=None, initial_epoch=0,
                       valid_infos=None):
        """The shared window loop (``loop.py``): each window as long as the cell's N for it, callbacks once per
        update, the partial-window policy at each epoch's end."""
        run = _carried_run(cb_params)
        cell = train_network(self)
        _give_callbacks_the_optimizer(cb_params, cell)
        cb_params.epoch_num = epoch  # the run's epochs, as the driver's; Model gives this call's, which read "3/2"
        run.start(cell)
        cb_params.cur_step_num = run.start_updates
        writer = run.state_writer(cell)
        with dataset_starting_at(train_dataset, run.start_micro):
            dataset_helper = exec_train_preprocess(self, train_dataset, epoch)
        cb_params.dataset_sink_mode = False
        cb_params.batch_num = run.updates_per_epoch
        cb_params.total_updates = run.total_updates  # None when a policy decides: progress lines count epochs
        self.batch_num = cb_params.batch_num

        def epoch_data(_):
            return (transfer_tensor_to_tuple(element) for element in dataset_helper)
        front = _ModelFront(run.owner, self, train_dataset, valid_infos, run.settings.max_nonfinite_windows)
        WindowLoop(front, epoch, run.micro_batches_per_epoch, run.settings.partial_window, cb_params, list_callback,
                   run.start_micro, run.open_micro_batches, writer, run.updates_before).run(epoch_data)

    # ---------------------------------------------------------------- sink: N sunk steps and the window's end
    def _train_dataset_sink_process(self, epoch, train_dataset, list_callback=None, cb_params=None, sink_size=-1,
                                    initial_epoch=0, valid_infos=None):
        """Per window: the accumulation graph sunk for N steps, then the window's end, a graph without the network
        (not sunk: it takes no data)."""
        n = self.gradient_accumulation_steps
        dataset_size = train_dataset.get_dataset_size()
        sink_size = dataset_size if sink_size == -1 else sink_size
        cycles = sink_size // n
        run = _carried_run(cb_params)
        dataset_sink_num = math.ceil(epoch * sink_size / dataset_size)
        set_sink_total(train_dataset, epoch * sink_size)
        cb_params.sink_size = sink_size
        cb_params.dataset_sink_mode = True
        _give_callbacks_the_optimizer(cb_params, train_network(self))
        cb_params.batch_num = cycles
        cb_params.total_updates = epoch * cycles
        cb_params.epoch_num = epoch  # the run's epochs, as without sink
        self.batch_num = cycles
        front = CellFront(run.owner, train_network(self), run.settings.max_nonfinite_windows)
        guard = front.nonfinite_guard(None)
        helper = self._make_sink_helper(train_dataset, sink_size, dataset_sink_num)
        sink_net = self._connect(helper)
        sink_net.set_train(True)
        mark_backbone_training(self)
        cb_params.train_network = sink_net
        cb_params.dataset_helper = helper
        run_context = RunContext(cb_params)
        list_callback.on_train_begin(run_context)
        for i in range(initial_epoch, epoch):
            cb_params.cur_epoch_num = i + 1
            set_current_position(self, cb_params.cur_epoch_num, 0)
            list_callback.on_train_epoch_begin(run_context)
            for _ in range(cycles):
                cb_params.cur_step_num += 1
                set_current_position(self, cb_params.cur_epoch_num, int((cb_params.cur_step_num - 1) % cycles + 1))
                store_training_step_info(self, cb_params)
                list_callback.on_train_step_begin(run_context)
                self._run_sink_graph(sink_net, train_dataset, loop=n)
                cb_params.net_outputs = self._end_window()
                cb_params.window_record = front.window_record(cb_params, cb_params.net_outputs, n, n)
                list_callback.on_train_step_end(run_context)
                guard.after_window(cb_params.cur_step_num, (cb_params.cur_step_num - 1) * n, n, sink_size,
                                   cb_params.net_outputs)
                if run_context.get_stop_requested():
                    break
            guard.check()
            helper.continue_send()
            reset_op_ids()
            eval_during_train(self, valid_infos, cb_params, list_callback)
            list_callback.on_train_epoch_end(run_context)
            cb_params.pop("metrics", None)
            cb_params.pop("eval_results", None)
            if run_context.get_stop_requested():
                break
        helper.stop_send()
        helper.release()
        list_callback.on_train_end(run_context)
        return None

    def _run_sink_graph(self, sink_net, dataset, loop):
        """Select the accumulation mode and phase right before the call (set_train resets the phase), then launch
        the accumulation graph sunk for `loop` steps."""
        sink_net = check_network_mode(self, sink_net)
        train_network(self).set_accumulation(True)
        train_network(self)._select_sunk()  # pylint: disable=protected-access
        sink_net.phase = ACCUMULATE_PHASE
        if ACCUMULATE_PHASE not in self._registered_loops:
            self._register_loop_size(dataset, loop, ACCUMULATE_PHASE)
            self._registered_loops.add(ACCUMULATE_PHASE)
        return sink_net()

    def _end_window(self):
        """The window's end on the device (a seam: the faked device of the tests records it)."""
        return train_network(self).end_window(raise_skipped=False)

    # Device seams: each one wraps a MindSpore call that needs a GPU or Ascend device queue.
    def _make_sink_helper(self, dataset, sink_size, dataset_sink_num):
        """Create the device queue with a loop size of 1 (any N; the accumulation phase registers its own)."""
        set_sink_loop_size(dataset, 1)
        helper = DatasetHelper(dataset, True, sink_size, dataset_sink_num)
        if needs_dataset_reset(self):
            set_training_dataset(helper)
        return helper

    def _connect(self, helper):
        """The sink network: GetNext in front of the (unwrapped) accumulation cell."""
        return connect_network_with_dataset(train_network(self), helper)

    @staticmethod
    def _register_loop_size(dataset, loop, phase):
        """Tell the backend how many steps `phase` sinks; read when that phase is first compiled."""
        register_sink_loop(dataset, loop, phase)

