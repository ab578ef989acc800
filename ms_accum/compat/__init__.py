"""Every private or moved MindSpore name ms_accum uses, imported here once, for MindSpore 2.7.0 through 2.10.x.

No other module of ms_accum imports a private MindSpore name (one starting with ``_``, or one from a private
module) or decides anything by MindSpore's version: they import from here. Each name below says where it lives in
each supported release and which release moved it; a release that moves one more fails at ``import ms_accum``
with the supported range in the message, instead of failing later inside training.

The releases tested are listed in docs/ecosystem.md (2.7.0, 2.7.1, 2.7.2, 2.8.0, 2.9.0, 2.10.0 on the registry
for Python 3.11).
"""
import importlib
import inspect
import re

import mindspore

LOWEST = (2, 7, 0)     # the oldest release ms_accum supports
BEYOND = (2, 11, 0)    # the first release it has not been tested on
SUPPORTED = "MindSpore 2.7.0 to 2.10.x"
INSTALL_HINT = "pip install 'mindspore>=2.7.0,<2.11'"


def release_of(version):
    """The (major, minor, patch) numbers that begin a version string such as '2.10.0' or '2.7.0rc1'."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if match is None:
        raise ImportError(f"ms_accum supports {SUPPORTED}, but could not read the installed MindSpore's version "
                          f"{version!r}. Install a supported release: {INSTALL_HINT}")
    return tuple(int(part or 0) for part in match.groups())


def check_release(version):
    """The release numbers of `version`; ImportError below the supported range."""
    release = release_of(version)
    if release < LOWEST:
        raise ImportError(f"ms_accum supports {SUPPORTED}, but MindSpore {version} is installed. Install a "
                          f"supported release: {INSTALL_HINT}")
    return release


def untested_release(version):
    """The warning's text for a `version` above the supported range (the private names may still be in place), else
    None. ``import ms_accum`` issues it before it loads the names it exports, at the user's line that imported it."""
    if release_of(version) < BEYOND:
        return None
    return (f"ms_accum supports {SUPPORTED} and was not tested on MindSpore {version}; if it fails, install a "
            f"supported release: {INSTALL_HINT}")


RELEASE = check_release(mindspore.__version__)
UNTESTED_RELEASE = untested_release(mindspore.__version__)


def _first(what, *candidates):
    """The first of `candidates` ('module:name') that imports: the per-release locations of one name."""
    for candidate in candidates:
        module_name, name = candidate.split(":")
        try:
            return getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"ms_accum supports {SUPPORTED}: MindSpore {mindspore.__version__} has no {what} (looked for "
                      f"{', '.join(candidates)}). Install a supported release: {INSTALL_HINT}")


# The graph executors: mindspore.common.api in 2.7 and 2.8; 2.9 moved them to mindspore.graph.api and left
# mindspore.common.api as a deprecated alias that warns on import, so the new place is tried first.
cell_graph_executor = _first("graph executor", "mindspore.graph.api:_cell_graph_executor",
                             "mindspore.common.api:_cell_graph_executor")
pynative_executor = _first("PYNATIVE executor", "mindspore.graph.api:_pynative_executor",
                           "mindspore.common.api:_pynative_executor")

# The files whose hash decides whether MindSpore's compile cache reloads its stored graphs (the entry script and its
# local modules), listed as MindSpore lists them: moved with the graph executors in 2.9.
compile_cache_dep_files = _first("compile cache's dependency list", "mindspore.graph.api:_get_compile_cache_dep_files",
                                 "mindspore.common.api:_get_compile_cache_dep_files")

# The execution mode as MindSpore's own Cell.__call__ reads it (mindspore.context in every supported release): far
# cheaper than the public get_context("mode"), read on every ms_accum cell call (docs/performance_history.md, A
# cell call's Python side).
get_mode = _first("execution mode reader", "mindspore.context:_get_mode")

# Model's callback machinery: mindspore.train.callback._callback in every supported release.
CallbackManager = _first("callback manager", "mindspore.train.callback._callback:CallbackManager")
InternalCallbackParam = _first("callback parameters", "mindspore.train.callback._callback:InternalCallbackParam")

# What Model.train uses around the dataset (same places in every supported release).
transfer_tensor_to_tuple = _first("Model's batch conversion", "mindspore.train.model:_transfer_tensor_to_tuple")
get_types_and_shapes = _first("dataset type and shape reader", "mindspore.train._utils:_get_types_and_shapes")
set_training_dataset = _first("training dataset registration",
                              "mindspore.dataset.engine.datasets:_set_training_dataset")

# The parallel context as TrainOneStepCell reads it (mindspore.parallel._utils in every supported release).
get_parallel_mode = _first("parallel mode", "mindspore.parallel._utils:_get_parallel_mode")
get_device_num = _first("device count", "mindspore.parallel._utils:_get_device_num")
get_gradients_mean = _first("gradients_mean setting", "mindspore.parallel._utils:_get_gradients_mean")

# BatchNorm's base class and the synchronised BatchNorm primitive (same places in every supported release).
BatchNormBase = _first("BatchNorm base class", "mindspore.nn.layer.normalization:_BatchNorm")
SyncBatchNormOp = _first("SyncBatchNorm primitive", "mindspore.ops.operations._inner_ops:SyncBatchNorm")

# 2.7 resets the operator ids at each epoch's end under distributed MindRT (msrun), so that train and eval graphs
# find their actor routes; 2.8 dropped the step. Model_ACCU's own training loops call reset_op_ids().
try:
    from mindspore.parallel._utils import _reset_op_id_with_offset as _reset_op_id  # pylint: disable=ungrouped-imports
    from mindspore.parallel._ps_context import _enable_distributed_mindrt
except ImportError:  # 2.8 and later
    _reset_op_id = _enable_distributed_mindrt = None


def reset_op_ids():
    """What Model's own loops do at the end of every epoch under distributed MindRT, on releases that do it."""
    if _reset_op_id is not None and _enable_distributed_mindrt():
        _reset_op_id()


def register_sink_loop(dataset, loop, phase):
    """
    Tell the backend how many steps the graph phase `phase` sinks, before that phase is first compiled, as
    MindSpore's own THOR model (mindspore/train/train_thor/model_thor.py) alternates two sink sizes. The executor's
    ``init_dataset`` has the same arguments in every supported release.
    """
    types, shapes = get_types_and_shapes(dataset)
    cell_graph_executor.init_dataset(dataset.__transfer_dataset__.queue_name, loop, dataset.get_batch_size(), types,
                                     shapes, dataset.input_indexs, phase=phase + "_dataset", need_run=False)


def set_sink_total(dataset, total):
    """Tell `dataset` the micro-batches a sink-mode run takes from it in all, in the private attribute Model's
    ``_warmup_dataset`` and ``_train_dataset_sink_process`` set (``__total_batch__``, 2.7 to 2.10)."""
    dataset.__total_batch__ = total


def set_sink_loop_size(dataset, loop):
    """Set the steps one sunk graph call takes from `dataset`'s device queue, in the private attribute Model's
    ``_exec_preprocess`` and MindSpore's THOR model set before they build a DatasetHelper (``__loop_size__``, 2.7 to
    2.10)."""
    dataset.__loop_size__ = loop


def compile_config():
    """MindSpore's compile settings module, whose ``COMPILE_PROFILE`` switch the start-up benchmarks turn on: in
    mindspore._extends.parse in 2.7, mindspore.graph._parse in 2.10 (the newer place tried first). Looked up when
    asked, not at import: ms_accum itself does not need it."""
    names = ("mindspore.graph._parse.compile_config", "mindspore._extends.parse.compile_config")
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(f"MindSpore {mindspore.__version__} has no compile settings module (looked for "
                      f"{', '.join(names)}). Install a supported release: {INSTALL_HINT}")


def forget_pynative_recording(cell):
    """Close the gradient recording a failed PYNATIVE forward of `cell` left open (same calls 2.7 to 2.10)."""
    cell.is_top_cell = False
    pynative_executor.set_grad_flag(False)
    pynative_executor.clear_res()


def overflow_saturates(cell):
    """Whether `cell` (a :class:`mindspore.nn.TrainOneStepWithLossScaleCell`) runs on an Ascend whose float overflow
    saturates instead of giving inf (910A, or 910B with MS_ASCEND_CHECK_OVERFLOW_MODE=SATURATION_MODE): there
    only MindSpore's float-status check sees an overflow. Read from the cell's private attributes, the same in
    2.7 to 2.10."""
    return bool(cell.ascend_910a_target) or (bool(cell.ascend_910b_target)
                                             and cell._ascend_check_overflow_mode == "SATURATION_MODE")


# ---------------------------------------------------------------- private attributes of MindSpore objects
# Model_ACCU runs mindspore.train.Model's own steps around its loops; these read or set Model's private state
# (the same names in 2.7.0 to 2.10.0, checked for the methods by check_model_internals below).


def callbacks_of(cb_params):
    """The callbacks ``Model._train`` put in `cb_params` (``cb_params.list_callback``, a list in 2.7 to 2.10)."""
    return cb_params.list_callback


def train_network(model):
    """The training cell a Model trains (``Model._train_network``)."""
    return model._train_network  # pylint: disable=protected-access


def check_network_mode(model, network, is_train=True):
    """``Model._check_network_mode``: put `network` in training mode after an evaluation; returns it."""
    return model._check_network_mode(network, is_train)  # pylint: disable=protected-access


def exec_train_preprocess(model, dataset, epoch):
    """``Model._exec_preprocess`` for training without sink: the dataset helper to iterate."""
    helper, _ = model._exec_preprocess(is_train=True, dataset=dataset,  # pylint: disable=protected-access
                                       dataset_sink_mode=False, epoch_num=epoch)
    return helper


def eval_during_train(model, valid_infos, cb_params, callbacks):
    """``Model._eval_during_train``: the evaluation Model.train runs at an epoch's end when asked."""
    model._eval_during_train(valid_infos, cb_params, callbacks)  # pylint: disable=protected-access


def flush_from_cache(model, cb_params):
    """``Model._flush_from_cache``: what Model does for embedding caches at an epoch's end."""
    model._flush_from_cache(cb_params)  # pylint: disable=protected-access


def store_training_step_info(model, cb_params):
    """``Model._store_training_step_info``: the step information Model keeps for failure recovery."""
    model._store_training_step_info(cb_params)  # pylint: disable=protected-access


def set_current_position(model, epoch, step):
    """Model's ``_current_epoch_num`` and ``_current_step_num``, read by its exception checkpoints."""
    model._current_epoch_num = epoch  # pylint: disable=protected-access
    model._current_step_num = step  # pylint: disable=protected-access


def mark_backbone_training(model):
    """Model's ``_backbone_is_train``: the backbone was put in training mode (sink mode sets it itself)."""
    model._backbone_is_train = True  # pylint: disable=protected-access


def needs_dataset_reset(model):
    """Model's ``_need_reset_data``: whether the training dataset must be registered for a reset."""
    return model._need_reset_data  # pylint: disable=protected-access


def keep_cell_config_visible(wrapper, network):
    """``Cell._get_attr_from_cell``: keep `network`'s amp level and jit config visible on its `wrapper`."""
    wrapper._get_attr_from_cell(network)  # pylint: disable=protected-access


# Model_ACCU overrides these methods of mindspore.train.Model and calls the others; Model calls the overrides
# positionally, so their parameters must stay as written here (the same in 2.7.0, 2.8.0, 2.9.0 and 2.10.0).
MODEL_METHODS = {
    # called with positional arguments by Model_ACCU.train and Model_ACCU.fit
    "train": ["self", "epoch", "train_dataset", "callbacks", "dataset_sink_mode", "sink_size", "initial_epoch"],
    "fit": ["self", "epoch", "train_dataset", "valid_dataset", "valid_frequency", "callbacks", "dataset_sink_mode",
            "valid_dataset_sink_mode", "sink_size", "initial_epoch"],
    "_train_process": ["self", "epoch", "train_dataset", "list_callback", "cb_params", "initial_epoch",
                       "valid_infos"],
    "_train_dataset_sink_process": ["self", "epoch", "train_dataset", "list_callback", "cb_params", "sink_size",
                                    "initial_epoch", "valid_infos"],
    "_exec_preprocess": ["self", "is_train", "dataset", "dataset_sink_mode", "sink_size", "epoch_num",
                         "dataset_helper"],
    "_check_network_mode": ["self", "network", "is_train"],
    "_eval_during_train": ["self", "valid_infos", "cb_params", "list_callback"],
    "_flush_from_cache": ["self", "cb_params"],
    "_store_training_step_info": ["self", "cb_params"],
}


def check_model_internals(model_class):
    """Raise ImportError if `model_class` (mindspore.train.Model) lacks a method Model_ACCU relies on, or has it
    with other parameters: Model_ACCU would otherwise break, or train wrongly, only once training starts."""
    for name, expected in MODEL_METHODS.items():
        method = getattr(model_class, name, None)
        got = list(inspect.signature(method).parameters) if callable(method) else None
        if got != expected:
            raise ImportError(f"ms_accum supports {SUPPORTED}: Model_ACCU overrides or calls "
                              f"mindspore.train.Model.{name}({', '.join(expected[1:])}), but MindSpore "
                              f"{mindspore.__version__} has {'no such method' if got is None else got[1:]}. "
                              f"Install a supported release: {INSTALL_HINT}")
