"""The runner: MindSpore started as train.py starts it, fresh child processes (a child command per configuration,
configurations taking turns, a JSON result line a run), the in-process rotation of blocks, the command line of the
benchmarks that measure one configuration per child, and the Markdown table every benchmark prints."""
import argparse
import json
import os
import socket
import subprocess
import sys

from .models import model_name


def start_mindspore(mode):
    """Apply train.py's CPU defaults (before MindSpore loads), then set the CPU device and `mode`."""
    from src.cpu_speed import apply_env_defaults, set_mode  # pylint: disable=import-outside-toplevel
    apply_env_defaults()
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    ms.set_device("CPU")
    set_mode(mode)


def free_port():
    """A free TCP port on 127.0.0.1 (for msrun's scheduler, or a PyTorch process group's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def msrun_command(workers, log_dir, script_argv):
    """The command line running `script_argv` (a script and its arguments) on `workers` msrun workers of this
    machine (127.0.0.1, a free port), with this interpreter's msrun, their logs in `log_dir`."""
    return [os.path.join(os.path.dirname(sys.executable), "msrun"), f"--worker_num={workers}",
            f"--local_worker_num={workers}", "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--join=True",
            f"--log_dir={log_dir}", *script_argv]


RESULT = "RESULT "  # the line a child prints its result on


def report(result):
    """Print `result` (a dict) as a child's result line, for :func:`run_child`."""
    print(RESULT + json.dumps(result), flush=True)


def run_child(script, argv, env=None, timeout=None):
    """Run `script` with `argv` in a fresh Python process (this interpreter, environment `env` or this one's) and
    return the dict of the last result line it printed (:func:`report`); raise RuntimeError, with the ends of its
    output, if it exits non-zero or prints none."""
    done = subprocess.run([sys.executable, os.path.abspath(script), *map(str, argv)], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines:
        raise RuntimeError(f"{os.path.basename(script)} {' '.join(map(str, argv))}: exited {done.returncode}\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


def take_turns(jobs, repeats, measure):
    """{job: [measure(job), one a round]} over `repeats` rounds, each round every job of `jobs` once in order: a
    slow spell of a shared machine hits them all."""
    results = {job: [] for job in jobs}
    for _ in range(repeats):
        for job in jobs:
            results[job].append(measure(job))
    return results


def rotate(runners, rounds, shift=False):
    """{label: [runner(), one a round]} over `rounds` rounds in this process, each round every runner of `runners`
    ({label: function}) once; with `shift` each round starts one runner later than the one before."""
    order = list(runners)
    results = {label: [] for label in order}
    for index in range(rounds):
        start = index % len(order) if shift else 0
        for label in order[start:] + order[:start]:
            results[label].append(runners[label]())
    return results


def argtypes():
    """ms_accum's argparse types (``ms_accum.tools.argtypes``: a bad value refused in one line naming its flag).
    Importing ms_accum loads MindSpore, so train.py's CPU defaults are set first, as :func:`start_mindspore` does
    (and the child processes inherit them: not for a benchmark comparing them)."""
    from src.cpu_speed import apply_env_defaults  # pylint: disable=import-outside-toplevel
    apply_env_defaults()
    from ms_accum.tools import argtypes as types  # pylint: disable=import-outside-toplevel
    return types


def names_among(known, what="configuration"):
    """argparse type: comma-separated names, each one of `known` (a misspelt one was measured as another)."""
    def names(text):
        unknown = [name for name in text.split(",") if name not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"takes {what}s among {', '.join(known)}, but got "
                                             f"{', '.join(repr(name) for name in unknown)}")
        return text
    return names


def mode_arguments(doc, modes):
    """The command line of a probe that runs each mode it is given in a child process of its own: ``--modes``
    (comma-separated, each among `modes`, all of them by default, in that order) and the hidden ``--child``, the
    mode a child runs. Returns (the parsed arguments, the modes asked)."""
    parser = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    parser.add_argument("--modes", default=",".join(modes), help="comma-separated: " + ", ".join(modes))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    asked = args.modes.split(",")
    unknown = sorted(set(asked) - set(modes))
    if unknown:
        parser.error(f"--modes takes {' and '.join(modes)}, but got {unknown}")
    return args, asked


def add_model_arguments(parser, configs, windows, known=None):
    """The options of the model, the micro-batches and the configurations to measure (each in a child process):
    `configs` the default ones, `known` every name ``--configs`` takes (default: `configs`)."""
    types = argtypes()
    parser.add_argument("--model", type=model_name, default="resnet18",
                        help="a MindCV model name, 'block', 'lenet', 'mlp', 'tiny' or 'text' (default: %(default)s)")
    parser.add_argument("--image_size", type=types.positive_int, default=192)
    parser.add_argument("--micro_batch", type=types.positive_int, default=8)
    parser.add_argument("--steps", type=types.positive_int, default=8, help="N")
    parser.add_argument("--windows", type=types.positive_int, default=windows)
    parser.add_argument("--classes", type=types.positive_int, default=10)
    parser.add_argument("--width", type=types.positive_int, default=2048, help="the MLP's hidden width (--model mlp)")
    parser.add_argument("--optimizer", choices=["mindcv", "momentum"], default="mindcv",
                        help="MindCV's momentum with weight decay and label smoothing, or nn.Momentum without")
    parser.add_argument("--configs", type=names_among(known or configs), default=",".join(configs),
                        help=f"comma-separated, among {', '.join(known or configs)}")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)


def measure_each(script, args, child_main, extra=(), strict=False):
    """In a child process (``--child``), run ``child_main(config, args)`` and return None. Otherwise run `script`
    for each of ``--configs`` in a fresh process, with the options of :func:`add_model_arguments` and `extra`, and
    return {config: its result}; a configuration that fails is reported and left out, or with `strict` raises."""
    if args.child:
        child_main(args.child, args)
        return None
    names = ("model", "image_size", "micro_batch", "steps", "windows", "classes", "width", "optimizer") + tuple(extra)
    results = {}
    for config in args.configs.split(","):
        try:
            results[config] = run_child(script, ["--child", config] + [f"--{n}={getattr(args, n)}" for n in names])
        except RuntimeError as error:
            if strict:
                raise
            print(f"{os.path.basename(script)}: {config} failed: {error}", flush=True)
    return results


def print_table(header, rows):
    """A Markdown table: the `header` cells, then one line per row of `rows` (cells already formatted)."""
    print("| " + " | ".join(header) + " |")
    print("|---" * len(header) + "|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
