"""``python -m ms_accum.check``: the command-line equivalence check (its code is in ``ms_accum.tools.check``)."""
import sys

from .tools.check import main

if __name__ == "__main__":
    sys.exit(main())
