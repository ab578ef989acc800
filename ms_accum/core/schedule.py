"""Accumulation schedules: how many micro-batches each window holds, as a function of the update's index.

A schedule ``{first_update: N, ...}`` gives N from its first update on: ``{0: 1, 2: 2, 4: 3}`` runs updates 0 and
1 with one micro-batch, updates 2 and 3 with two, and every update from 4 on with three. Updates are counted from
0 over the whole run (windows begun, a skipped overflowing window included: the index the learning rate of a
window would take). Each window is still exactly the large-batch step of its own size.
"""
import bisect
import numbers

from .checks import number_text_hint
from .open_window import epoch_end_action



STEPS_NAME = "gradient_accumulation_steps"  # N's one name, as in MindCV, MindFormers, Hugging Face and Keras
STEPS_ALIASES = ("accumulation_steps", "mini_steps", "accumulate_step")  # the seed's, the driver's, the tutorial's


def steps_argument(owner, value, aliases, default=None):
    """
    The N a caller gave, under its one name or one of its aliases.

    Args:
        owner (str): The API, for messages.
        value: What was given as ``gradient_accumulation_steps`` (None: not given).
        aliases (dict): {alias: what was given under it (None: not given)}, aliases from :data:`STEPS_ALIASES`.
        default: What N is when none is given; None makes N required.

    Returns:
        (N as given, the name it was given under, for messages).
    """
    given = ([(STEPS_NAME, value)] if value is not None else []) + [
        (name, alias_value) for name, alias_value in aliases.items() if alias_value is not None]
    if len(given) > 1:
        raise TypeError(f"For '{owner}', N must be given once, as '{STEPS_NAME}', but got "
                        f"{' and '.join(repr(name) for name, _ in given)}. Pass only {STEPS_NAME}=N "
                        f"({', '.join(repr(name) for name in aliases)} are older names for it).")
    if not given:
        if default is None:
            raise TypeError(f"For '{owner}', '{STEPS_NAME}' (micro-batches per update) is required, but got none. "
                            f"Pass {STEPS_NAME}=N, a schedule {{first_update: N}} or an AdaptiveAccumulation.")
        return default, STEPS_NAME
    return given[0][1], given[0][0]


def steps_given(value, aliases):
    """Whether N was given, under its one name or an alias (see :func:`steps_argument`)."""
    return value is not None or any(alias_value is not None for alias_value in aliases.values())


def shown_steps_name(arg_name):
    """N's argument as messages show it: as the user wrote it, quoted, with the one name beside an older one
    (``'mini_steps' (gradient_accumulation_steps)``)."""
    if arg_name in STEPS_ALIASES:
        return f"'{arg_name}' ({STEPS_NAME})"
    return f"'{arg_name}'"


def is_int(value):
    """An integral number that is not a bool (numpy integers too)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class AccumulationSchedule:
    r"""
    Micro-batches per window as a step function of the update's index.

    Args:
        steps (Union[int, dict, str, AccumulationSchedule]): An int N (every window holds N micro-batches); a dict
            ``{first_update: N}`` whose keys are ints >= 0, one of them 0, and whose values are ints >= 1; or the
            same as text, ``"0:1,2:2,4:3"``.
        owner (str): The API the schedule was given to, for error messages. Default: ``"AccumulationSchedule"``.
        arg_name (str): The argument's name, for error messages. Default: ``"steps"``.

    Raises:
        TypeError: If `steps` is none of the above, or a key or value is not an int.
        ValueError: If the schedule is empty, has no entry for update 0, a key is negative, a value is < 1, or the
            text is malformed.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import ms_accum
        >>> schedule = ms_accum.AccumulationSchedule({0: 1, 2: 2, 4: 3})
        >>> [schedule.steps_at(update) for update in range(6)]
        [1, 1, 2, 2, 3, 3]
        >>> ms_accum.AccumulationSchedule("0:1,2:2,4:3") == schedule
        True
    """

    def __init__(self, steps, owner="AccumulationSchedule", arg_name="steps"):
        name = shown_steps_name(arg_name)
        if isinstance(steps, AccumulationSchedule):
            self.points = steps.points
            return
        if isinstance(steps, str):
            steps = _parse(owner, arg_name, steps)
        if is_int(steps):
            if steps < 1:
                raise _refused(ValueError, owner, name, f"must be an int >= 1, but got {steps}.")
            steps = {0: steps}
        if isinstance(steps, bool) or isinstance(steps, float):
            raise _refused(TypeError, owner, name, f"must be an int >= 1 or a schedule {{first_update: N}}, but got "
                           f"{steps!r} of type {type(steps).__name__}.")
        if not isinstance(steps, dict):
            raise _refused(TypeError, owner, name, f"must be an int or a schedule {{first_update: N}} (a dict, or text "
                           f"such as '0:1,2:2,4:3'), but got {type(steps).__name__}.")
        if not steps:
            raise _refused(ValueError, owner, name, "must hold at least one stage {first_update: N}, but got an empty "
                           "schedule.")
        for first, count in steps.items():
            if not is_int(first) or not is_int(count):
                raise _refused(TypeError, owner, name, f"must map int first updates to int micro-batch counts, but "
                               f"got {first!r}: {count!r}.")
            if first < 0 or count < 1:
                raise _refused(ValueError, owner, name, f"must map first updates >= 0 to micro-batch counts >= 1, but "
                               f"got {first}: {count}.")
        if 0 not in steps:
            raise _refused(ValueError, owner, name, f"must say how many micro-batches the first windows hold (an entry "
                           f"for update 0), but got {dict(sorted(steps.items()))}. Add 0: N.")
        self.points = tuple(sorted((int(first), int(count)) for first, count in steps.items()))

    def __eq__(self, other):
        return isinstance(other, AccumulationSchedule) and self.points == other.points

    def __hash__(self):
        return hash(self.points)

    def __repr__(self):
        return f"AccumulationSchedule({dict(self.points)})"

    @property
    def constant(self):
        """The N of every window if the schedule never changes it, else None."""
        counts = {count for _, count in self.points}
        return counts.pop() if len(counts) == 1 else None

    @property
    def as_given(self):
        """The schedule as a cell's ``gradient_accumulation_steps`` shows it: its N when constant, else itself."""
        constant = self.constant
        return self if constant is None else constant

    @property
    def firsts(self):
        """The first update of each stage, ascending."""
        return tuple(first for first, _ in self.points)

    @property
    def counts(self):
        """The micro-batches of each stage, in the order of :attr:`firsts`."""
        return tuple(count for _, count in self.points)

    def steps_at(self, update):
        """
        The micro-batches of window `update` (counted from 0).

        Args:
            update (int): The update's index, >= 0.

        Returns:
            int.
        """
        return self.points[bisect.bisect_right(self.firsts, update) - 1][1]

    def run_plan(self, micro_batches_per_epoch, epochs, partial_window):
        """
        Windows that begin before each epoch, and in all, for a run of `epochs` epochs of `micro_batches_per_epoch`
        micro-batches under a trainer's `partial_window` policy (``"flush"``, ``"drop"`` or ``"carry"``).

        Returns:
            tuple(list[int], int): windows begun before epoch e (e = 0 .. epochs), counting those a policy later
            dropped as not begun; the run's updates.
        """
        before, update, _ = self.walk(micro_batches_per_epoch, epochs, partial_window)
        return before, update

    def trained_micro_batches(self, micro_batches_per_epoch, epochs, partial_window):
        """The micro-batches of such a run that reach an update: all but those of windows a policy drops."""
        return self.walk(micro_batches_per_epoch, epochs, partial_window)[2]

    def walk(self, micro_batches_per_epoch, epochs, partial_window):
        """(windows begun before each epoch, updates, micro-batches updated) of :meth:`run_plan`'s run: both of its
        figures and :meth:`trained_micro_batches`' from one walk, for a trainer that needs all three.

        Within an epoch the windows of one stage are counted together, not one by one: a run of many epochs (a
        ``Model.train(10 ** 6, ...)`` that a callback stops) is planned in time linear in its epochs and stages,
        not in its windows."""
        firsts, counts = self.firsts, self.counts
        update, pending, before, trained = 0, 0, [0], 0
        for epoch in range(epochs):
            left = micro_batches_per_epoch
            while left:
                stage = bisect.bisect_right(firsts, update) - 1
                steps = counts[stage]
                if pending + left < steps:
                    pending += left
                    break
                # the windows that end in this epoch at this stage's N, up to the next stage's first update
                windows = (pending + left) // steps
                if stage + 1 < len(firsts):
                    windows = min(windows, firsts[stage + 1] - update)
                left -= windows * steps - pending
                trained += windows * steps
                update, pending = update + windows, 0
            action = epoch_end_action(partial_window, epoch == epochs - 1) if pending else "carry"
            if action == "update":
                update += 1
                trained += pending
            if action != "carry":
                pending = 0
            before.append(update)
        return before, update, trained


def check_steps(owner, arg_name, value):
    """Refuse an N that is neither a schedule (:func:`is_schedule`) nor an int >= 1. Text that is not a schedule
    (``'4'``: a number read from a command line and not converted) is refused naming both forms."""
    if is_schedule(value):
        return
    if isinstance(value, str):
        fix = number_text_hint(value) or " Pass the number of micro-batches per update, such as 4."
        raise TypeError(f"For '{owner}', {shown_steps_name(arg_name)} must be an int >= 1, or a schedule such as "
                        f"'0:1,2:2' as text, but got {value!r} of type str.{fix}")
    if not is_int(value):
        raise TypeError(f"For '{owner}', {shown_steps_name(arg_name)} must be an int >= 1, a schedule {{first_update: "
                        f"N}} (or its text, '0:1,2:2') or an AdaptiveAccumulation or GoodputAccumulation policy, but "
                        f"got {value!r} of type {type(value).__name__}.{number_text_hint(value)}")
    if value < 1:
        raise ValueError(f"For '{owner}', {shown_steps_name(arg_name)} must be an int >= 1, but got {value}.")


def is_schedule(value):
    """Whether `value` gives N as a schedule: a dict, an :class:`AccumulationSchedule` or its text ('0:1,2:2');
    other values are checked as an int by :func:`check_steps` (which refuses text such as '4', a number read from a
    command line and not converted)."""
    return isinstance(value, (dict, AccumulationSchedule)) or (isinstance(value, str) and ":" in value)


def _parse(owner, arg_name, text):
    """'0:1,2:2,4:3' -> {0: 1, 2: 2, 4: 3}."""
    name = shown_steps_name(arg_name)
    steps = {}
    for part in text.split(","):
        pieces = part.strip().split(":")
        try:
            first, count = (int(piece) for piece in pieces)
        except ValueError:
            raise _refused(ValueError, owner, name, f"must be 'first_update:N' pairs separated by commas, such as "
                           f"'0:1,2:2,4:3', but got {text!r}.") from None
        if first in steps:
            raise _refused(ValueError, owner, name, f"must give each first update once, but {first} appears twice in "
                           f"{text!r}.")
        steps[first] = count
    return steps


def max_updates(smallest, micro_batches_per_epoch, epochs, partial_window):
    """The most updates a run can make when no window holds fewer than `smallest` micro-batches (an adaptive N's
    min_steps): every window at it, laid out over the epochs by the run's `partial_window` policy."""
    return AccumulationSchedule(smallest).run_plan(micro_batches_per_epoch, epochs, partial_window)[1]


def _refused(kind, owner, name, requirement):
    """A `kind` error "For '<owner>', <name> <requirement>", which also holds its `requirement` ("must ..."): what
    a caller that names the argument itself (argparse) shows."""
    error = kind(f"For '{owner}', {name} {requirement}")
    error.requirement = requirement
    return error


def schedule_argument(text):
    """argparse type: a schedule 'first_update:N,...' (or a plain N)."""
    import argparse  # pylint: disable=import-outside-toplevel
    try:
        return AccumulationSchedule(int(text) if text.strip().isdigit() else text, "train.py",
                                    "--accumulation_schedule")
    except (TypeError, ValueError) as error:  # argparse names the flag: "argument --accumulation_schedule: must ..."
        raise argparse.ArgumentTypeError(getattr(error, "requirement", str(error))) from None
