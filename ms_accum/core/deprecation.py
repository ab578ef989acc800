"""Names of earlier releases, kept until the release that removes them: reading one warns, naming the new name and
that release. CHANGELOG.md lists each under "Deprecated"; tests/test_release.py finds them on the public classes and
keeps the two, and the package's version, in step."""
import warnings
from operator import attrgetter

REMOVED_IN = "0.5.0"  # the next release: it removes every name deprecated in 0.4.0


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
    """

    def __init__(self, old, new, why="renamed", removed_in=REMOVED_IN):
        read = attrgetter(new)

        def getter(owner):
            warnings.warn(f"For '{type(owner).__name__}', '{old}' is {why} '{new}'; the old name goes in the next "
                          f"release, ms_accum {removed_in}.", DeprecationWarning, stacklevel=2)
            return read(owner)
        super().__init__(getter)
        self.old, self.new, self.removed_in = old, new, removed_in
        # set here: Python 3.11's property.__init__ leaves a subclass's instances with the class's own docstring
        self.__doc__ = f"Deprecated: read :attr:`{new}`; ms_accum {removed_in} removes this name."
