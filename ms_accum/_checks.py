"""Argument checks shared by every ms_accum entry point.

Each check raises with one message shape: "For 'Owner', 'arg' must be <expected>, but got <received>."
"""
from mindspore import Parameter, ParameterTuple


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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value == 0 \
            or value in (float("inf"), float("-inf")):
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
