"""The measuring process :class:`~ms_accum.trainers.memory_probe.FreshProcessMeasure` starts ahead: it imports the
modules named on its command line, waits for a script's command line on standard input (a JSON list), then runs
the script as ``__main__`` with the script's own folder first on ``sys.path``, as Python would run it.

It is run as a file, ``python .../preloaded_run.py mindspore ms_accum``, not with ``python -m``: ``-m`` would import
the ms_accum package, and MindSpore with it, into every measuring process, whatever it was asked to import.
"""
import importlib
import json
import os
import runpy
import sys


def main(modules):
    """Import `modules`, read the script's argv from standard input and run the script as ``__main__``."""
    sys.path[0] = ""  # the imports ahead resolve from the working directory, as ``python -c`` does, not from here
    for name in modules:
        importlib.import_module(name)
    argv = json.loads(sys.stdin.readline())
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
