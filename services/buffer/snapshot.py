"""Snapshot bytes in the safetensors layout, built in place so that no step holds the
GIL for long: the buffer's other threads keep sampling while a snapshot is made.

`safetensors.numpy.save` serializes with the GIL held (over a second for 400 MB), and
`bytearray(n)` zero-fills with it held. Here every array's place is known up front:
one buffer is allocated untouched, numpy copies the arrays into it (letting the GIL
go while it copies), and the header is written into the room kept for it.

    out = ArrayFileBuilder({"key": (np.dtype(np.int64), capacity), ...}, spare)
    np.copyto(out.arrays["key"], table.key)
    data = out.finish()                          # a memoryview of the file's bytes
    safetensors.numpy.load(bytes(data))          # reads back as usual
    spare = out.buffer                           # for the next file, once data is let go

Faulting in fresh pages costs more than copying into them (the kernel zeroes each
one), so a builder may write over an earlier file's buffer once nobody holds it.
"""

from __future__ import annotations

import json

import numpy as np

_DTYPES = {
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.float64): "F64",
    np.dtype(np.uint8): "U8",
}


class ArrayFileBuilder:
    """One safetensors file of 1-D arrays whose dtypes and lengths are known up front,
    filled in place through `arrays` (in layout order, so put the widest dtypes first
    to keep every array aligned)."""

    def __init__(
        self, layout: dict[str, tuple[np.dtype, int]], spare: np.ndarray | None = None
    ) -> None:
        """Args:
        layout: each array's dtype and length, in file order.
        spare: an earlier builder's `buffer`, written over if it is big enough: the
            caller makes sure nothing refers to it any more.
        """
        header: dict[str, dict] = {}
        begin = 0
        for name, (dtype, n) in layout.items():
            dtype = np.dtype(dtype)
            end = begin + dtype.itemsize * n
            header[name] = {"dtype": _DTYPES[dtype], "shape": [n], "data_offsets": [begin, end]}
            begin = end
        text = json.dumps(header, separators=(",", ":")).encode()
        # Spaces pad the header so the data starts 8-byte aligned (as safetensors does).
        text += b" " * (-(8 + len(text)) % 8)
        self._header = len(text).to_bytes(8, "little") + text
        start = len(self._header)
        size = start + begin
        if spare is not None and spare.nbytes >= size:
            self.buffer = spare
        else:
            # Room to grow a little. np.empty leaves the pages untouched: the copies
            # fault them in, with the GIL released.
            self.buffer = np.empty(size + size // 16, dtype=np.uint8)
        self._file = self.buffer[:size]
        self.arrays: dict[str, np.ndarray] = {}
        for name, (dtype, _) in layout.items():
            a, b = header[name]["data_offsets"]
            self.arrays[name] = self._file[start + a : start + b].view(dtype)

    def finish(self) -> memoryview:
        """The file's bytes, once every array has been filled."""
        self._file[: len(self._header)] = np.frombuffer(self._header, dtype=np.uint8)
        self.arrays = {}
        return memoryview(self._file)
