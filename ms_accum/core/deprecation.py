"""Names renamed since ms_accum 0.1, kept for a release: reading one warns, naming the new one."""
import warnings
from operator import attrgetter


def renamed(old, new, why="renamed"):
    """
    A read-only property `old` that returns the attribute `new` (a dotted path, such as ``"cell.drop"``) with a
    DeprecationWarning: "For '<class>', '<old>' is <why> '<new>'; the old name goes in the next release."

    Args:
        old (str): The name of ms_accum 0.1.
        new (str): The name that replaces it.
        why (str): How the text says it was replaced. Default: ``"renamed"``.

    Returns:
        property.
    """
    read = attrgetter(new)

    def getter(self):
        warnings.warn(f"For '{type(self).__name__}', '{old}' is {why} '{new}'; the old name goes in the next release.",
                      DeprecationWarning, stacklevel=2)
        return read(self)
    getter.__doc__ = f"Deprecated: :attr:`{new}` (the name of ms_accum 0.1)."
    return property(getter)
