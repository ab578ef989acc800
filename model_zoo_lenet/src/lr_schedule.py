"""Learning-rate schedules for train.py, one entry per update (the optimizer's global_step counts updates)."""
import math


def warmup_cosine(peak, total_updates, warmup_updates):
    """
    A linear warm-up to `peak` over `warmup_updates`, then a cosine decay towards 0 at the end of the run.

    Returns a list with one learning rate per update of the whole run, for the optimizer's `learning_rate`:
    entry k is used by update k + 1.
    """
    warmup = min(warmup_updates, total_updates - 1)
    rates = []
    for update in range(total_updates):
        if update < warmup:
            rates.append(peak * (update + 1) / warmup)
        else:
            progress = (update - warmup) / max(total_updates - warmup, 1)
            rates.append(peak * 0.5 * (1.0 + math.cos(math.pi * progress)))
    return rates
