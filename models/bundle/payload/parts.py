"""A payload column's .npy parts: opened when the segment loads, memory-mapped when a filter first needs the column.

Mapping a part is most of what opening a payload index cost (np.load's mmap_mode parses the header and opens the
file three times: about 0.17 ms a part, seven parts a field), and most filters name few of a segment's fields.
Opening a part's descriptor is a system call, and it is what keeps the part readable later: a reloaded version
shares its segments with the version it replaced, whose directory the indexer may prune before a filter first
names a field (tests/models/bundle/storage/test_shared_segment_pruned.py). So the descriptor is taken at load and
the part mapped from it, never from its path again; the map holds its own descriptor, and the part's is closed.
Each part's header is read at load too (`read_header`, a pread or two): a field whose parts' sizes disagree is
refused with its segment then, never at a filter.
"""

from __future__ import annotations

import io
import math
import mmap
import os
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

HEADER_READ = 128  # bytes read for a header: np.save pads one, magic included, to 64 bytes; a 1-D array's is 128
_HEADERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}  # what np.save writes here


def open_part(path: Path) -> int:
    """A read-only descriptor of the part (not inherited by child processes: os.open's default)."""
    return os.open(path, os.O_RDONLY)


def read_header(descriptor: int) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, Fortran order, dtype, where the data starts) of the part's .npy header, read with os.pread (the
    descriptor's position is untouched); a file that is no .npy array, or shorter than its header says, is a
    ValueError as it is for np.load."""
    head = os.pread(descriptor, HEADER_READ, 0)
    version = npy.read_magic(io.BytesIO(head))  # the magic string, then the header's length: 2 bytes (1.0) or 4
    header = _HEADERS.get(version)
    if header is None:
        raise ValueError(f"unsupported .npy format version {version}")
    width = 2 if version == (1, 0) else 4
    end = npy.MAGIC_LEN + width + int.from_bytes(head[npy.MAGIC_LEN : npy.MAGIC_LEN + width], "little")
    if end > len(head):  # a header longer than np.save writes for a 1-D array: read it whole
        head = os.pread(descriptor, end, 0)
    stream = io.BytesIO(head)
    npy.read_magic(stream)
    shape, fortran, dtype = header(stream)  # a file that ends inside its header: ValueError
    if dtype.hasobject:
        raise ValueError("Array can't be memory-mapped: Python objects in dtype.")
    size = os.fstat(descriptor).st_size
    if end + math.prod(shape) * dtype.itemsize > size:
        raise ValueError(f"a .npy file of {size} bytes is shorter than its header's {shape} {dtype}")
    return shape, fortran, dtype, end


def map_part(descriptor: int) -> np.ndarray:
    """The part's array, read-only over a map of its file, as np.load(mmap_mode="r") maps it; its header is read
    again (the file may have changed since it was opened)."""
    shape, fortran, dtype, offset = read_header(descriptor)
    pages = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)  # its own descriptor; an empty file: ValueError
    try:
        if offset + math.prod(shape) * dtype.itemsize > len(pages):  # truncated since read_header
            raise ValueError(f"a .npy file of {len(pages)} bytes is shorter than its header's {shape} {dtype}")
        return np.ndarray(shape, dtype, buffer=pages, offset=offset, order="F" if fortran else "C")
    except BaseException:
        pages.close()
        raise
