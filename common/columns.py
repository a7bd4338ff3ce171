"""Step-data columns as an algorithm declares them: what each column means, and so
what shape and dtype one row of it has for a job.

An algorithm lists its columns in its spec (`AlgorithmSpec.columns`); the
collector's loop writes exactly those (the ones its actor records too), and the
learner holds every segment to them before training. A column's meaning is its
`kind`, never its name:

    observation  the env's observation: `obs_shape`, uint8 for images, else float32
    action       an action id below `action_shape` (discrete), or `action_shape`
                 floats (continuous)
    mask         0 or 1 for each discrete action (`action_shape` of them), at least
                 one 1 a row; the row's action (an `action` column) must be a 1
    float        numbers of `shape` (() is one number a row)
    flag         0 or 1 (episode ends)
    recurrent    a recurrent network's state: floats of `shape`

Rows of the `unrolls` unit are unrolls of `unroll_len` steps: each column has a time
axis first, unless it is `per_item` (one value an unroll, such as the state after
its last step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from common.config import PolicyConfig, obs_shape_of

ColumnKind = Literal["observation", "action", "mask", "float", "flag", "recurrent"]
#: How a column's value is checked: `float` finite numbers, `index` integers in
#: `[0, high)`, `flag` 0 or 1, `mask` 0 or 1 with a 1 in each row (a legal-action
#: mask), `pixels` uint8 images (whole, or packed frames).
CheckKind = Literal["float", "index", "flag", "mask", "pixels"]
#: An entry of a declared shape: a number, or the job's action count.
ACTIONS = "actions"


@dataclass(frozen=True)
class Column:
    name: str
    kind: ColumnKind
    #: `float` and `recurrent` columns: one row's shape. Entries are ints, `ACTIONS`
    #: (the job's action count), or the name of an int key of the job's
    #: `policy.model` section (a recurrent state's `lstm_hidden_size`); the other
    #: kinds' shapes come from the job.
    shape: tuple[int | str, ...] = ()
    #: One value an item even where an item is an unroll of steps.
    per_item: bool = False
    #: The actor records it while acting (`RecordingActor.recorded`), rather than the
    #: collect loop from the env's steps.
    from_actor: bool = False
    #: Only a job whose env gives a legal-action mask (`policy.model.action_mask`) has
    #: it: the mask itself, or what only masked play records.
    masked_only: bool = False
    #: Only a job whose policy config this says yes to has it (what an option of the
    #: algorithm's needs recorded, such as PPO's reward normalization).
    needs: Callable[[PolicyConfig], bool] | None = None


def job_columns(columns: tuple[Column, ...], policy: PolicyConfig) -> tuple[Column, ...]:
    """The columns of `columns` (an algorithm's) that a job's step data holds: those
    `masked_only` ones only when the job's env gives action masks, those with `needs`
    only when the job's policy config has what they need."""
    masked = bool(policy.model.action_mask)
    return tuple(
        column
        for column in columns
        if (masked or not column.masked_only) and (column.needs is None or column.needs(policy))
    )


def _size(model: object, entry: int | str) -> int:
    """A declared shape entry's size for a job (see `Column.shape`)."""
    if entry == ACTIONS:
        entry = "action_shape"
    if isinstance(entry, str):
        value = getattr(model, entry, None)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"policy.model.{entry} is no int for a column's shape")
        return value
    return int(entry)


@dataclass(frozen=True)
class ColumnSpec:
    """What one column of a segment must hold for a job: how it is checked (`kind`),
    one row's shape (the column's shape without its first, rows, dimension), the dtype
    training uses (the column is cast to it once checked) and, for `index`, the bound."""

    kind: CheckKind
    shape: tuple[int, ...]
    dtype: type[np.generic]
    high: int = 0


def column_spec(column: Column, policy: PolicyConfig, steps: tuple[int, ...]) -> ColumnSpec:
    """`column`'s spec for a job whose spaces are filled in; `steps` is the time axis
    of an unroll's per-step columns (() for rows that are single steps)."""
    model = policy.model
    if model.obs_shape is None or model.action_shape is None:
        raise ValueError("the job config lacks policy.model.obs_shape or action_shape")
    row = () if column.per_item else steps
    declared = tuple(_size(model, d) for d in column.shape)
    if column.kind == "observation":
        if model.obs_dtype == "uint8":
            return ColumnSpec("pixels", (*row, *obs_shape_of(model)), np.uint8)
        return ColumnSpec("float", (*row, *obs_shape_of(model)), np.float32)
    if column.kind == "action":
        if model.action_space == "continuous":
            return ColumnSpec("float", (*row, model.action_shape), np.float32)
        return ColumnSpec("index", row, np.int64, high=model.action_shape)
    if column.kind == "mask":
        return ColumnSpec("mask", (*row, model.action_shape), np.float32)
    if column.kind == "flag":
        return ColumnSpec("flag", row, np.float32)
    return ColumnSpec("float", (*row, *declared), np.float32)  # float, recurrent
