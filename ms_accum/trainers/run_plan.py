"""One training run's setup, written once for :class:`GradientAccumulation` and :class:`Model_ACCU`.

:func:`plan_run` takes what a trainer's caller gave (the epochs, the dataset, N or the global batch or a
:class:`MicroBatchPlan`, the partial-window policy, state saving, resume) and returns a :class:`RunPlan`: every
argument checked once, in one order, N set on the engine cell through its public setter (which owns N's checks),
and the run's layout of windows over its epochs. :meth:`RunPlan.start` then places the run in the data: at an
initial epoch, or at the micro-batch a state file was written after. The trainers keep only what is theirs: the
driver its printed lines and out-of-memory rerun, Model_ACCU what :class:`mindspore.train.Model` does around
epochs, and dataset sink mode.
"""
import numbers
from dataclasses import dataclass, field
from typing import Optional

from ..core.checks import check_choice, check_positive_int, number_text_hint, warn_steps_unset
from ..core.compiled import write_parameter
from ..core.global_batch import DERIVED_STEPS_NAME, GLOBAL_BATCH_NAME, steps_for_global_batch
from ..core.schedule import STEPS_NAME, AccumulationSchedule, check_steps, steps_argument
from ..core.user_warning import warn
from . import devices
from .elastic import RunLayout, dataset_batched
from ..core.open_window import PARTIAL_WINDOW_POLICIES
from .loop import check_loss_monitor, check_rate_callbacks
from .nonfinite import DEFAULT_MAX_NONFINITE_WINDOWS
from .out_of_memory import OOM_POLICIES
from .planner import steps_from_plan
from .run_checks import (POLICIES, check_callbacks, check_dataset, check_dataset_columns, check_dataset_rows,
                         check_resume_or_initial_epoch, check_run_learning_rate, check_state_saving, check_window_fits,
                         largest_steps, plan_updates)
from .state import StateWriter, resume_training_state


@dataclass
class RunSettings:
    """What the caller of a trainer's training method gave, as given (checked by :func:`plan_run`)."""

    epochs: object
    dataset: object
    steps: object = None  # N under its one name
    step_aliases: dict = field(default_factory=dict)  # N under its older names: {name: value or None}
    global_batch_size: object = None
    plan: object = None  # a MicroBatchPlan
    partial_window: str = "flush"
    initial_epoch: int = 0
    resume_from: Optional[str] = None
    state_path: Optional[str] = None
    save_state_every: int = 0
    max_nonfinite_windows: int = DEFAULT_MAX_NONFINITE_WINDOWS
    callbacks: object = None
    on_out_of_memory: str = "raise"


@dataclass
class RunPlan:
    """
    One run, checked and laid out (see :func:`plan_run`).

    Attributes:
        owner (str): The trainer's method, named in messages.
        settings (RunSettings): What the caller gave; ``epochs`` and the others checked.
        micro_batches_per_epoch (int): The dataset's rows (MindSpore's ``steps_per_epoch``).
        world (int): Data-parallel devices; `rank`, this one.
        layout (RunLayout): What the run's state files record.
        updates_before (list[int], optional): Windows begun before each epoch; None when a policy chooses N.
        total_updates (int, optional): The run's updates; None when a policy chooses N.
        schedule (AccumulationSchedule): The cell's N as a schedule (a policy's first N).
        earlier_schedule (AccumulationSchedule): The cell's N as a schedule before this run set its own.
        start_micro (int): Micro-batches done before the run starts (set by :meth:`start`).
        start_updates (int): Updates done before the run starts (set by :meth:`start`).
        open_micro_batches (int): Micro-batches of a window open when the run starts, as the dataset gave them: the
            state file's record on a resume, else the cell's count (set by :meth:`start`); the training loop
            counts on from them.
    """

    owner: str
    settings: RunSettings
    micro_batches_per_epoch: int
    world: int
    rank: int
    layout: RunLayout
    updates_before: Optional[list]
    total_updates: Optional[int]
    schedule: AccumulationSchedule  # the cell's N as a schedule; a policy's first N
    earlier_schedule: AccumulationSchedule  # the cell's before this run set N
    start_micro: int = 0
    start_updates: int = 0
    open_micro_batches: int = 0

    @property
    def epochs(self):
        """The run's epochs."""
        return self.settings.epochs

    @property
    def total_micro_batches(self):
        """Micro-batches of the whole run on one device."""
        return self.settings.epochs * self.micro_batches_per_epoch

    @property
    def updates_per_epoch(self):
        """The callbacks' first ``batch_num``: the run's updates per epoch, or an epoch's at the policy's first N when
        a policy chooses N (at least 1: MindSpore's TimeMonitor divides by it)."""
        if self.total_updates is not None:
            return max(1, self.total_updates // self.settings.epochs)
        return max(1, self.schedule.run_plan(self.micro_batches_per_epoch, 1, self.settings.partial_window)[1])

    def state_writer(self, cell):
        """The :class:`StateWriter` of this run's exact state (writes nothing without a `state_path`)."""
        settings = self.settings
        return StateWriter(cell, settings.state_path, settings.save_state_every, self.total_micro_batches,
                           self.start_micro, self.rank, self.world, self.layout)

    def start(self, cell):
        """
        Place the run in the data: at the micro-batch and update `resume_from` was written after (its open window
        restored on the cell), or at the first micro-batch of the initial epoch, the cell's window count
        (``accu_windows``, which a schedule of N is read at) set to the updates an uninterrupted run makes before
        that epoch. Warns where that restarts a schedule of N that the cell had gone further in (a second call
        with the same schedule and without `initial_epoch`), and where MindSpore's LossMonitor would mislabel this
        run's updates. Returns the plan.
        """
        settings = self.settings
        if settings.resume_from is not None:
            self.start_micro, self.start_updates, self.open_micro_batches = resume_training_state(
                cell, settings.resume_from, self.total_micro_batches, self.rank, self.world, self.layout, cell.drop)
        else:
            self.start_micro = settings.initial_epoch * self.micro_batches_per_epoch
            before = self.updates_before or self.schedule.run_plan(self.micro_batches_per_epoch, settings.epochs,
                                                                   settings.partial_window)[0]
            self.start_updates = before[settings.initial_epoch]
            self._check_schedule_goes_on(cell)
            self._check_progress_goes_on(cell)
            write_parameter(cell.accu_windows, self.start_updates)
            self.open_micro_batches = int(cell.accu_micro_steps.asnumpy())
        check_loss_monitor(self.owner, settings.callbacks, self.updates_before,
                           self.start_micro // self.micro_batches_per_epoch + 1)
        return self

    def _check_progress_goes_on(self, cell):
        """A warning where a run started at an epoch after the first reads its learning-rate rule's schedule at a
        progress of 0: the checkpoint it was rebuilt from was loaded before the trainer made the progress
        Parameters (they come with the rule), or holds none."""
        initial = self.settings.initial_epoch
        if initial == 0 or cell.lr_state is None or cell.lr_state.progress != 0.0:
            return
        names = cell.lr_state.steps.name.rsplit(".", 1)[0] + ".*"
        warn(f"For '{self.owner}', the learning-rate rule ('{cell.lr_scaling}') reads the optimizer's "
             f"schedule at the run's progress, which is 0 at epoch {initial + 1} (initial_epoch={initial}): "
             f"the rate starts its schedule over. If the checkpoint of epoch {initial} holds the progress "
             f"('{names}'), load it after building the trainer, whose rule makes those Parameters: "
             f"ms_accum.load_network_checkpoint(cell, path, optional=ms_accum.is_accumulation_buffer), "
             f"the cell being the driver's trainer.cell or the one Model_ACCU trains.",
             UserWarning)

    def _check_schedule_goes_on(self, cell):
        """A warning where this run would take N from an earlier point of a changing schedule than the cell's
        window count has reached, the schedule the cell ran before (a new one given is meant to start): the earlier
        call's updates, the optimizer's steps and its learning-rate progress go on, the schedule of N would start
        over."""
        if self.schedule.constant is not None or self.schedule != self.earlier_schedule:
            return
        done = int(cell.accu_windows.asnumpy())
        if done > self.start_updates:
            warn(f"For '{self.owner}', the schedule of N {dict(self.schedule.points)} starts over at update "
                 f"{self.start_updates} (epoch {self.settings.initial_epoch + 1}), but the cell has made "
                 f"{done} updates in an earlier call: each call is a new run, whose windows take N from "
                 f"that update of the schedule, while the optimizer's step count and learning-rate "
                 f"progress go on. To continue the earlier run, pass initial_epoch=<the epochs it ran> "
                 f"with 'epoch' the run's last epoch, so the schedule goes on at the update it reached.",
                 UserWarning)


def _as_cells_steps(owner, steps, name):
    """N as a cell's ``gradient_accumulation_steps`` shows it, for comparing what a caller gave with the cell's: an
    int for a constant N, an :class:`AccumulationSchedule` for a schedule given as a dict, text or schedule (a
    constant one as its int), a policy as it is."""
    if isinstance(steps, (dict, str, AccumulationSchedule)):
        schedule = steps if isinstance(steps, AccumulationSchedule) else AccumulationSchedule(steps, owner, name)
        return schedule.as_given
    return steps


def run_steps(owner, cell, settings, world, required, trained=False):
    """
    N of the run as its caller gave it: under its one name or an older one, derived from `global_batch_size`, or
    from `plan`; at most one of them. Returns (N, the name it was given under), or (None, None) when none was given
    and not `required` (the cell keeps its N). An N other than a cell's own is refused when the cell already has
    one given (not 1) or, `trained` (or called before: by another Model_ACCU, or the user's own loop), holds its
    graphs.
    """
    given = [name for name, value in [(STEPS_NAME, settings.steps), *settings.step_aliases.items(),
                                      (GLOBAL_BATCH_NAME, settings.global_batch_size)] if value is not None]
    batch_size = settings.dataset.get_batch_size()
    if (settings.plan is not None or settings.global_batch_size is not None) and not dataset_batched(settings.dataset):
        argument = "'plan'" if settings.plan is not None else f"'{GLOBAL_BATCH_NAME}'"
        raise ValueError(f"For '{owner}', {argument} derives N from the dataset's micro-batch size, which this "
                         f"dataset does not give: it has no batch operation, so its get_batch_size() is 1 whatever "
                         f"its rows hold (a GeneratorDataset that yields whole micro-batches of 16 samples, say, "
                         f"would give N = G instead of G / 16). Yield samples and batch them with "
                         f"dataset.batch(micro_batch), or pass N itself (gradient_accumulation_steps).")
    if settings.plan is not None:
        steps, name = steps_from_plan(owner, settings.plan, given, batch_size, world), "plan.steps"
        source = f"'plan' (global batch {settings.plan.global_batch_size})"
    elif settings.global_batch_size is not None:
        if len(given) > 1:
            raise TypeError(f"For '{owner}', N must be given once, but got both '{given[0]}' and "
                            f"'{GLOBAL_BATCH_NAME}'. Pass {GLOBAL_BATCH_NAME}=G to derive N = G / (devices x "
                            f"micro-batch) on every device count, or N alone.")
        steps = steps_for_global_batch(settings.global_batch_size, batch_size, world, owner)
        name = DERIVED_STEPS_NAME
        source = f"'{GLOBAL_BATCH_NAME}' {settings.global_batch_size}"
    elif given or required:
        steps, name = steps_argument(owner, settings.steps, settings.step_aliases)
        source = f"'{name}'"
    else:
        return None, None
    if required:
        return steps, name
    if not isinstance(steps, POLICIES):  # the cell's own check, before its N is compared with this one (a trial)
        check_steps(owner, name, steps)
    current, wanted = cell.gradient_accumulation_steps, _as_cells_steps(owner, steps, name)
    if name != STEPS_NAME and name not in settings.step_aliases and not isinstance(current, int):
        argument = source.split(" ")[0]
        raise ValueError(f"For '{owner}', {argument} sets one N, but the cell's '{cell.steps_name}' is {current!r}. "
                         f"Build the cell without it, or drop {argument}.")
    if wanted != current and (trained or (current != 1 and cell._called)):  # pylint: disable=protected-access
        raise ValueError(f"For '{owner}', {source} needs N = {steps!r}, but the cell has trained with N = {current!r} "
                         f"and its graphs hold it. Build a new cell and Model_ACCU for another N.")
    if wanted != current and current != 1:
        raise ValueError(f"For '{owner}', N must be given once, but the cell's '{cell.steps_name}' is {current!r} "
                         f"and this call's {source} gives N = {steps!r}. Leave N out of this call to train with the "
                         f"cell's, pass Model_ACCU(cell, gradient_accumulation_steps=N) to replace the cell's, or "
                         f"build the cell without N.")
    return steps, name


def plan_run(owner, cell, settings, *, required_steps, trained=False, columns_hint="", carry_hint="",
             check_learning_rate=True):
    """
    Check a run's arguments once, set its N on `cell` and lay its windows out over its epochs. In data parallel
    (the devices `cell` reduces over), also compare what every device must agree on (:mod:`.devices`, one
    AllGather, after N is set).

    Args:
        owner (str): The trainer's method, named in messages.
        cell (Cell): The engine cell (a TrainAccuStepsCell or its loss-scale variant).
        settings (RunSettings): What the caller gave.
        required_steps (bool): Whether N must be given (the driver) or defaults to the cell's (Model_ACCU).
        trained (bool): Whether the cell has trained already (its N then stays).
        columns_hint (str): Ends the message of a dataset whose columns do not fit the loss network.
        carry_hint (str): Follows "pass partial_window='carry'" in the message of a window longer than an epoch.
        check_learning_rate (bool): Check the optimizer's learning-rate list against the run's updates (dataset
            sink mode checks it against its sunk epochs itself).

    Returns:
        RunPlan.
    """
    settings.epochs = check_positive_int(owner, "epoch", settings.epochs)
    micro_batches = check_dataset(owner, settings.dataset)
    check_dataset_columns(owner, settings.dataset, cell.network.network, hint=columns_hint)
    check_dataset_rows(owner, settings.dataset)
    initial = settings.initial_epoch
    if isinstance(initial, bool) or not isinstance(initial, int):  # as MindSpore's Model takes it, a Python int
        hint = number_text_hint(initial)
        if isinstance(initial, numbers.Integral) and not isinstance(initial, bool):  # a numpy integer
            hint = " Pass int(initial_epoch): MindSpore's Model takes a Python int."
        raise TypeError(f"For '{owner}', 'initial_epoch' must be an int in [0, {settings.epochs}), but got "
                        f"{initial!r} of type {type(initial).__name__}.{hint}")
    if not 0 <= initial < settings.epochs:
        raise ValueError(f"For '{owner}', 'initial_epoch' must be an int in [0, {settings.epochs}), but got "
                         f"{initial}.")
    check_choice(owner, "partial_window", settings.partial_window, PARTIAL_WINDOW_POLICIES)
    check_choice(owner, "on_out_of_memory", settings.on_out_of_memory, OOM_POLICIES)
    rank, world = devices.rank_and_world(cell)
    if world > 1 and settings.on_out_of_memory == "halve":
        raise ValueError(f"For '{owner}', 'on_out_of_memory' must be 'raise' in data parallel, but got 'halve': a "
                         f"device rerunning its window with halved micro-batches would reach the window's gradient "
                         f"reduction at another count than the others. Plan the micro-batch for the memory instead "
                         f"(ms_accum.plan_micro_batch, which takes every device's peaks).")
    check_positive_int(owner, "max_nonfinite_windows", settings.max_nonfinite_windows)
    check_state_saving(owner, settings.state_path, settings.save_state_every)
    check_resume_or_initial_epoch(owner, settings.resume_from, initial)
    check_callbacks(owner, settings.callbacks)
    steps, name = run_steps(owner, cell, settings, world, required_steps, trained)
    earlier_schedule = cell.accumulation_schedule
    if steps is not None:
        cell.set_gradient_accumulation_steps(steps, name, owner)
    else:
        warn_steps_unset(cell, owner)
    n = cell.gradient_accumulation_steps
    check_rate_callbacks(owner, settings.callbacks, cell)
    check_window_fits(owner, cell.steps_name, n, micro_batches, settings.partial_window, carry_hint)
    if cell.measure_noise and largest_steps(n) * world == 1:  # in data parallel a window holds one a device
        warn(f"For '{owner}', the noise scale needs windows of at least 2 micro-batches (two batch sizes to "
             f"compare), but every window of this run holds 1 ('{cell.steps_name}'): every estimate will be "
             f"NaN. Pass N >= 2 (halve the micro-batch for the same update), or build the cell with "
             f"noise_scale=False.", UserWarning)
    before, updates, trained = plan_updates(n, micro_batches, settings.epochs, settings.partial_window)
    if check_learning_rate:
        check_run_learning_rate(owner, cell.optimizer, n, micro_batches, settings.epochs, settings.partial_window,
                                from_start=initial == 0 and settings.resume_from is None, updates=updates,
                                trained=trained, micro_batch_items=settings.dataset.get_batch_size() * world,
                                lr_scaling=cell.lr_scaling)
    layout = RunLayout(world, settings.dataset.get_batch_size(), micro_batches, n if isinstance(n, int) else 0,
                       settings.partial_window, devices.check_sharding(owner, cell, settings.dataset))
    devices.check_devices_agree(owner, cell, settings.dataset)
    return RunPlan(owner, settings, micro_batches, world, rank, layout, before, updates, cell.accumulation_schedule,
                   earlier_schedule)
