"""What the benchmarks share, written once, one module an idea:

- ``runner``: MindSpore started with train.py's CPU defaults, fresh child processes taking turns (a JSON result
  line a run), the in-process rotation of blocks, the command line of one configuration per child, the Markdown
  table;
- ``timing``: wall and CPU clocks, samples per second, medians and quartiles, and where a run's time goes;
- ``memory``: resident memory and its peak (VmHWM), and the unit of the tables, one copy of the parameters;
- ``data`` and ``models``: the data, networks, losses and optimizers the benchmarks train;
- ``steps``: plain training and ms_accum's paths as the benchmarks run them;
- ``peers``: the MindSpore tutorial's accumulator (with its start-up floors) and LeNet5 in PyTorch;
- ``costs``: the cost benchmarks' drivers, the tutorial's step with a squared norm, rotation and ratios.

A benchmark is a script in ``benchmarks/`` (``benchmarks/lab/`` holds one-off probes) that imports this package
and never another benchmark; it reads every name here as ``harness.<name>``. Importing the package loads no
MindSpore: it puts the repository and ``model_zoo_lenet`` on ``sys.path``, and each function imports what it needs.
"""
from .paths import ROOT, SAMPLE, ZOO
from .costs import compare_runners, cost_arguments, driver_runners, tutorial_runner
from .data import TEXT_VOCAB, dataset_of, random_batches, sample_arrays, window_of
from .memory import copy_mib_of, peak_mib, rss_mib
from .models import (COST_MODELS, PROJECT_MODELS, block_model, build, lenet_parts, model_name, plain_parts,
                     resnet18_parts, text_model, wide_mlp)
from .peers import (STEP_NAMES, TUTORIAL_CLIP_NORM, checked_window_end, jit_step, step_cell, step_parts,
                    torch_lenet_update, two_graph_steps)
from .runner import (RESULT, add_model_arguments, argtypes, free_port, measure_each, mode_arguments, msrun_command,
                     print_table, report, rotate, run_child, start_mindspore, take_turns)
from .steps import (accumulated_update, dataset_trainer, plain_and_three_cells, plain_step, plain_updates,
                    three_cells)
from .timing import (PHASE_LINE, compile_phases, profile_compiles, spread, timed, timed_epochs, wall_and_cpu,
                     where_the_time_goes)

__all__ = ["ROOT", "SAMPLE", "ZOO", "compare_runners", "cost_arguments", "driver_runners", "tutorial_runner",
           "TEXT_VOCAB", "dataset_of", "random_batches", "sample_arrays", "window_of", "copy_mib_of", "peak_mib",
           "rss_mib", "COST_MODELS", "PROJECT_MODELS", "block_model", "build", "lenet_parts", "model_name",
           "plain_parts", "resnet18_parts", "text_model",
           "wide_mlp", "STEP_NAMES", "TUTORIAL_CLIP_NORM", "checked_window_end", "jit_step", "step_cell", "step_parts",
           "torch_lenet_update", "two_graph_steps", "RESULT", "add_model_arguments", "argtypes", "free_port",
           "measure_each", "mode_arguments",
           "msrun_command", "print_table", "report", "rotate", "run_child", "start_mindspore", "take_turns",
           "accumulated_update", "dataset_trainer", "plain_and_three_cells", "plain_step", "plain_updates",
           "three_cells", "PHASE_LINE", "compile_phases", "profile_compiles", "spread", "timed", "timed_epochs",
           "wall_and_cpu", "where_the_time_goes"]
