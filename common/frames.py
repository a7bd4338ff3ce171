"""Image step data stored with each frame once.

Stacked Atari observations repeat themselves: the stack at step t holds three of the
four frames of the stack at t-1, and a transition's `next_obs` is the next row's
`obs`. Written as they are, a Pong transition costs 2 x 4 x 84 x 84 bytes. A segment
instead keeps every distinct 2-D frame (plane) once, in a pool, and each image column
as indexes into it (as Reverb and Acme keep sequences)::

    pool.frames        uint8  [frames, H, W]     every distinct plane, once
    obs.frames         int32  [rows, C]          obs[i, c] == pool.frames[obs.frames[i, c]]
    next_obs.frames    int32  [rows, C]

Usage::

    packed = pack_frames(columns)            # a collector, before writing a segment
    obs = take(packed, "obs", rows)          # a learner: [len(rows), C, H, W], uint8

A column is packed when it is uint8 with at least 4 axes ([rows, (time,) C, H, W]);
others are stored as they are. Rebuilding rows is one fancy index into the pool (no
per-row Python), so the learner's read path stays as fast as reading whole arrays.
"""

from __future__ import annotations

import numpy as np

#: The pool's tensor name; tensors named `pool.*` are not rows (`common.storage`).
POOL = "pool.frames"
POOL_PREFIX = "pool."
#: An image column `<name>` is stored as `<name>.frames`.
INDEX_SUFFIX = ".frames"

# Fixed odd multipliers of a 64-bit multiplicative hash of each plane. A hash only
# groups candidates: planes are compared byte for byte before they share a slot, so a
# collision costs space, never correctness.
_MULTIPLIERS = np.random.default_rng(0x5EED).integers(
    1, 2**63, size=65536, dtype=np.uint64
) | np.uint64(1)


def packable(array: np.ndarray) -> bool:
    return array.dtype == np.uint8 and array.ndim >= 4


def pack_frames(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The columns with every packable image column replaced by indexes into one pool
    of distinct planes; unchanged when none is packable.

    Every packable column must have the same plane size (the job's observation)."""
    names = [name for name, array in columns.items() if packable(array)]
    if not names:
        return columns
    plane_shapes = {columns[name].shape[-2:] for name in names}
    if len(plane_shapes) != 1:
        raise ValueError(f"image columns differ in frame size: {sorted(plane_shapes)}")
    height, width = plane_shapes.pop()
    planes = np.concatenate(
        [np.ascontiguousarray(columns[name]).reshape(-1, height * width) for name in names]
    )
    keep, index = distinct_rows(planes)
    packed = {name: array for name, array in columns.items() if name not in names}
    packed[POOL] = planes[keep].reshape(-1, height, width)
    start = 0
    for name in names:
        shape = columns[name].shape[:-2]
        count = int(np.prod(shape))
        packed[name + INDEX_SUFFIX] = index[start : start + count].reshape(shape)
        start += count
    return packed


def distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(`keep`, `index`): the positions of one row of each distinct content of a 2-D
    uint8 array, in first-seen order, and for every row the position in `keep` of the
    row equal to it (int32), so that `rows[keep][index] == rows`."""
    count, width = rows.shape
    padded = -width % 8
    if padded:
        rows_for_hash = np.zeros((count, width + padded), np.uint8)
        rows_for_hash[:, :width] = rows
    else:
        rows_for_hash = np.ascontiguousarray(rows)
    words = rows_for_hash.view(np.uint64)
    if words.shape[1] > len(_MULTIPLIERS):
        raise ValueError(f"frames of {width} bytes are over the packer's limit")
    digest = words @ _MULTIPLIERS[: words.shape[1]]  # wraps modulo 2**64
    _, first, inverse = np.unique(digest, return_index=True, return_inverse=True)
    representative = first[inverse.reshape(-1)]
    # Word-for-word check of every row that would share another's slot: one whose hash
    # collided with a different row keeps its own.
    shared = np.flatnonzero(representative != np.arange(count))
    equal = (words[shared] == words[representative[shared]]).all(axis=1)
    representative[shared[~equal]] = shared[~equal]
    keep, index = np.unique(representative, return_inverse=True)
    return keep, index.reshape(-1).astype(np.int32)


def is_packed(columns: dict[str, np.ndarray], name: str) -> bool:
    return name not in columns and name + INDEX_SUFFIX in columns and POOL in columns


def take(columns: dict[str, np.ndarray], name: str, rows: np.ndarray | slice) -> np.ndarray:
    """Rows of column `name`, rebuilt from the pool when it is packed."""
    if is_packed(columns, name):
        return columns[POOL][columns[name + INDEX_SUFFIX][rows]]
    return columns[name][rows]


def unpack_frames(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every column whole, as it was before `pack_frames`."""
    out = {
        name: array
        for name, array in columns.items()
        if not name.startswith(POOL_PREFIX) and not name.endswith(INDEX_SUFFIX)
    }
    for name in columns:
        if name.endswith(INDEX_SUFFIX) and name != POOL and POOL in columns:
            base = name[: -len(INDEX_SUFFIX)]
            out[base] = columns[POOL][columns[name]]
    return out
