"""Argument checks shared by every ms_accum entry point.

Each check raises with one message shape: "For 'Owner', 'arg' must be <expected>, but got <received>."
"""
import math

from mindspore import Parameter, ParameterTuple, Tensor
from mindspore.nn import CellList


def check_positive_int(owner, arg_name, value):
    """Return `value` if it is an int >= 1 (bool excluded), else raise TypeError or ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"For '{owner}', '{arg_name}' must be an int >= 1, but got {value!r} "
                        f"of type {type(value).__name__}.")
    if value < 1:
        raise ValueError(f"For '{owner}', '{arg_name}' must be an int >= 1, but got {value}.")
    return value


def check_choice(owner, arg_name, value, choices):
    """Return `value` if it is one of `choices`, else raise ValueError."""
    if value not in choices:
        raise ValueError(f"For '{owner}', '{arg_name}' must be one of {list(choices)}, but got {value!r}.")
    return value


def check_bool(owner, arg_name, value):
    """Return `value` if it is a bool, else raise TypeError."""
    if not isinstance(value, bool):
        raise TypeError(f"For '{owner}', '{arg_name}' must be a bool, but got {value!r} "
                        f"of type {type(value).__name__}.")
    return value


def check_sens(owner, value):
    """Return `value` as a float if it is a non-zero finite real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value == 0:
        raise ValueError(f"For '{owner}', 'sens' must be a non-zero finite number, but got {value!r}.")
    return float(value)


def check_grad_sum(owner, grad_sum, optimizer=None):
    """Return `grad_sum` if it is a ParameterTuple shaped like the optimizer's parameters."""
    if not isinstance(grad_sum, ParameterTuple) or not all(isinstance(p, Parameter) for p in grad_sum):
        raise TypeError(f"For '{owner}', 'grad_sum' must be a ParameterTuple, such as "
                        f"optimizer.parameters.clone(prefix='grad_sum', init='zeros'), "
                        f"but got {type(grad_sum).__name__}.")
    if not grad_sum:
        raise ValueError(f"For '{owner}', 'grad_sum' must hold at least one Parameter, but got an empty tuple.")
    if optimizer is not None:
        params = optimizer.parameters
        got = [tuple(p.shape) for p in grad_sum]
        expected = [tuple(p.shape) for p in params]
        if got != expected:
            raise ValueError(f"For '{owner}', 'grad_sum' must match the optimizer's parameters one for one "
                             f"(shapes {expected}), but got shapes {got}. Build it with "
                             f"optimizer.parameters.clone(prefix='grad_sum', init='zeros').")
    return grad_sum


def check_state_saving(owner, state_path, save_state_every):
    """Raise unless `save_state_every` is an int >= 0, and > 0 only together with a `state_path`."""
    if isinstance(save_state_every, bool) or not isinstance(save_state_every, int) or save_state_every < 0 \
            or (save_state_every and state_path is None):
        raise ValueError(f"For '{owner}', 'save_state_every' must be an int >= 0, and > 0 only with a "
                         f"'state_path', but got {save_state_every!r} with state_path={state_path!r}.")


def check_resume_or_initial_epoch(owner, resume_from, initial_epoch):
    """Raise if both a state file and an initial epoch say where training starts."""
    if resume_from is not None and initial_epoch:
        raise ValueError(f"For '{owner}', pass either 'resume_from' or 'initial_epoch', not both: the state file "
                         f"records where training stopped.")


def check_lr_schedule(owner, optimizer, micro_steps, updates):
    """
    Raise if the optimizer's learning-rate list has one entry per micro-batch instead of one per update.

    A list or 1-D Tensor learning rate is indexed by the optimizer's global_step, which advances once per window;
    one built with `micro_steps` entries (the count of micro-batches in the whole run) was built for the wrong
    unit and would stretch the schedule by the accumulation factor.
    """
    if micro_steps == updates or not getattr(optimizer, "dynamic_lr", False):
        return
    rates = optimizer.learning_rate
    for rate in rates if isinstance(rates, (tuple, list, CellList)) else (rates,):
        table = getattr(rate, "learning_rate", rate)  # a list or Tensor rate is wrapped in _IteratorLearningRate
        length = table.shape[0] if isinstance(table, Tensor) and len(table.shape) == 1 else None
        if length == micro_steps:
            raise ValueError(f"For '{owner}', the optimizer's learning-rate schedule must have one entry per update "
                             f"({updates}), but got {length} entries, one per micro-batch. The optimizer's "
                             f"global_step advances once per accumulation window: build the schedule for "
                             f"{updates} steps.")
