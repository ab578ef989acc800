"""Names of earlier releases, kept until the release that removes them: reading one warns, naming the new name and
that release. CHANGELOG.md lists each under "Deprecated"; tests/test_release.py finds them on the public classes and
keeps the two, and the package's version, in step."""
from functools import partial
from operator import attrgetter

from .user_warning import warn

REMOVED_IN = "0.5.0"  # the next release: it removes every name deprecated in 0.4.0


class OldCall:
    """
    What an old name gives whose call did what its new attribute's call does not: `target`, the new attribute, with
    a call that does what the old one did, ``call(*args, **kwargs)``; its other attributes are `target`'s.
    """

    def __init__(self, target, call):
        self.target, self._call = target, call

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.target, name)


class renamed(property):  # pylint: disable=invalid-name  (a descriptor, named as `property` is)
    """
    A read-only property `old` that returns the attribute `new` (a dotted path, such as ``"cell.drop"``) with a
    DeprecationWarning: "For '<class>', '<old>' is <why> '<new>'; the old name goes in the next release, ms_accum
    <removed_in>."

    Args:
        old (str): The name an earlier release read.
        new (str): The name that replaces it.
        why (str): How the text says it was replaced. Default: ``"renamed"``.
        removed_in (str): The release that removes `old`. Default: :data:`REMOVED_IN`.
        call (callable, optional): Where calling `old` did what calling `new` does not, what it did,
            ``call(owner, *args, **kwargs)``: the property then returns an :class:`OldCall`. Default: ``None``,
            `new`'s value itself.
    """

    def __init__(self, old, new, why="renamed", removed_in=REMOVED_IN, call=None):
        read = attrgetter(new)

        def getter(owner):
            warn(f"For '{type(owner).__name__}', '{old}' is {why} '{new}'; the old name goes in the next "
                 f"release, ms_accum {removed_in}.", DeprecationWarning)
            return read(owner) if call is None else OldCall(read(owner), partial(call, owner))
        super().__init__(getter)
        self.old, self.new, self.removed_in, self.call = old, new, removed_in, call
        # set here: Python 3.11's property.__init__ leaves a subclass's instances with the class's own docstring
        self.__doc__ = f"Deprecated: read :attr:`{new}`; ms_accum {removed_in} removes this name."


# (function, old argument, new argument) of every argument renamed through renamed_argument: read by
# tests/test_release.py, which holds each to a CHANGELOG entry.
RENAMED_ARGUMENTS = (
    ("save_training_state", "micro_steps_done", "micro_batches_done"),
    ("load_training_state", "total_micro_steps", "total_micro_batches"),
)


def renamed_argument(owner, old, new, old_value, new_value):
    """
    The value of argument `new`, given under `new` or under its older name `old` (then with a DeprecationWarning
    naming the release that removes it). `(owner, old, new)` must be listed in :data:`RENAMED_ARGUMENTS`.

    Raises:
        TypeError: If both names are given, or neither.
    """
    if (owner, old, new) not in RENAMED_ARGUMENTS:
        raise ValueError(f"'{old}' of '{owner}' is not in RENAMED_ARGUMENTS: list it there and in CHANGELOG.md.")
    if old_value is None:
        if new_value is None:
            raise TypeError(f"For '{owner}', '{new}' is required, but got none.")
        return new_value
    if new_value is not None:
        raise TypeError(f"For '{owner}', pass '{new}' only, but got both '{new}' and its older name '{old}'.")
    warn(f"For '{owner}', the argument '{old}' is renamed '{new}'; the old name goes in the next release, "
         f"ms_accum {REMOVED_IN}.", DeprecationWarning)
    return old_value
