"""A process that has imported MindSpore and ms_accum once and runs Python scripts in forked copies of itself.

Started by :func:`helpers.run_python` (one per test process), it reads requests on standard input, a JSON object a
line: ``{"argv": [script, *args], "env": {...}, "cwd": ..., "out": path, "err": path}``, or ``["-m", module,
*args]`` to run a module as ``python -m`` does. For each it forks. The copy takes the request's environment,
directory and output files, standard input from /dev/null, and runs the script as ``__main__`` with its folder
first on ``sys.path``, the environment's PYTHONPATH after it and ``sys.argv`` set, as ``python script args``
would; it exits with the script's exit code (1, the traceback on stderr, for an exception, as Python does). The
server answers with the copy's pid, then with its exit code once it has ended.

What this saves: a fresh interpreter spends about 1.7 s of CPU importing MindSpore; a copy starts with it
imported. Only MindSpore and ms_accum are imported ahead (MindSpore starts no thread and no runtime at import), so
a copy begins as a fresh process does, with no device, context or graph set up; a script's own modules (the model
zoo's ``src``) are imported by the script. Each copy reads a function's source once (source_cache.py), as the test
processes do.
"""
import atexit
import importlib
import json
import os
import runpy
import sys
import tempfile
import threading
import traceback

import source_cache  # tests/, this file's folder

REPLIES = os.fdopen(os.dup(1), "w", buffering=1)  # the answers; fd 1 itself is each copy's stdout


def run_copy(request):
    """In the forked copy: run the script of `request` as Python would; never returns."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # not the server's buffer of requests
        for fd, path in ((1, request["out"]), (2, request["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # read from the environment again (TMPDIR), as a fresh process would
        os.chdir(request["cwd"])
        argv = list(request["argv"])
        module = argv[0] == "-m"  # python -m module args: the directory first on sys.path, else the script's folder
        sys.argv = argv[1:] if module else argv
        sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(argv[0])))
        entries = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
        sys.path[1:] = entries + [entry for entry in sys.path[1:] if entry not in entries]  # as Python places them
        try:
            if module:
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as done:
            if done.code is None or isinstance(done.code, int):
                code = done.code or 0
            else:  # sys.exit("message"): printed, exit code 1
                print(done.code, file=sys.stderr)
                code = 1
        except BaseException:  # pylint: disable=broad-except  (Python prints it and exits 1)
            traceback.print_exc()
            code = 1
        threading._shutdown()  # pylint: disable=protected-access  (as Python's exit: its threads, then atexit's)
        atexit._run_exitfuncs()  # pylint: disable=protected-access
    except BaseException:  # pylint: disable=broad-except  (setting the copy up failed: told on its stderr)
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # pylint: disable=protected-access


def main():
    """Import MindSpore and ms_accum, then serve requests until standard input closes."""
    del sys.path[0]  # this file's folder: a copy puts its script's there
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # what the imports print does not reach the answers
    source_cache.install()  # each copy reads a function's source once
    for name in ("mindspore", "ms_accum"):
        importlib.import_module(name)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_copy(request)
        REPLIES.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        REPLIES.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    main()
