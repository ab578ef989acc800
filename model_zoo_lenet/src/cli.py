"""Command-line plumbing shared by train.py, eval.py and prepare_data.py: one-line errors, no tracebacks."""
import os
import sys


def run_cli(main, stops=()):
    """Run `main()`; a bad argument, path, data set or checkpoint exits 2 with one line on stderr, and a run that
    stops itself with one of the exceptions `stops` (train.py: ms_accum's NonFiniteWindowError, whose message names
    the windows and the state written for a resume) exits 1 with its message.

    Set MS_ACCUM_DEBUG=1 to get the full traceback instead.
    """
    prog = os.path.basename(sys.argv[0])
    try:
        return main()
    except (ValueError, TypeError, OSError) as err:
        if os.environ.get("MS_ACCUM_DEBUG") == "1":
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except stops as err:
        if os.environ.get("MS_ACCUM_DEBUG") == "1":
            raise
        print(f"{prog}: stopped: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def set_device(target):
    """Select the device, turning MindSpore's 'unsupported device' failure into a one-line hint."""
    import mindspore as ms
    try:
        ms.set_device(target)
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise ValueError(f"'--device_target' {target} is not available in this MindSpore installation "
                         f"({first.split('. Please')[0]}). Use '--device_target CPU', or install the {target} "
                         f"runtime (see README.md).") from err
