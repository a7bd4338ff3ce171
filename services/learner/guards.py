"""What keeps a learn task's output sound, and how it learns it must stop.

A network with NaN or inf weights is never published or checkpointed (`finite`, and
`NonFiniteWeights` when it fails), and whatever a task reports is finite: the progress
its heartbeats carry (`set_progress`) and the priorities it sends the coordinator
(`priorities_of`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from common.messages import MAX_ABS_FLOAT, MAX_PRIORITY


class NonFiniteWeights(RuntimeError):
    """Training produced NaN or inf weights: they are neither published nor saved."""


def finite(state: Any) -> bool:
    """Whether every floating value in a (nested) state dict, tensor or array is finite."""
    if isinstance(state, torch.Tensor):
        return not state.is_floating_point() or bool(torch.isfinite(state).all())
    if isinstance(state, np.ndarray):
        return state.dtype.kind != "f" or bool(np.isfinite(state).all())
    if isinstance(state, dict):
        return all(finite(value) for value in state.values())
    if isinstance(state, list | tuple):
        return all(finite(value) for value in state)
    if isinstance(state, float):
        return math.isfinite(state)
    return True


def set_progress(progress: dict[str, float], **values: float) -> None:
    """Put values into a task's progress, which heartbeats carry as JSON: a value that
    is not finite or beyond `MAX_ABS_FLOAT` is left out (and an older one removed)."""
    for key, value in values.items():
        if math.isfinite(value) and abs(value) <= MAX_ABS_FLOAT:
            progress[key] = value
        else:
            progress.pop(key, None)


def priorities_of(td_abs: np.ndarray) -> list[float]:
    """TD errors as priorities the coordinator accepts: in `[0, MAX_PRIORITY]`, with a
    non-finite error (a diverging update) given the highest priority."""
    values = np.asarray(td_abs, dtype=np.float64)
    values = np.where(np.isfinite(values), values, MAX_PRIORITY)
    return np.clip(values, 0.0, MAX_PRIORITY).tolist()
