"""A payload column's .npy parts: opened when the segment loads, memory-mapped when a filter first needs the column.

Mapping a part is most of what opening a payload index cost (np.load's mmap_mode parses the header and opens the
file three times: about 0.17 ms a part, seven parts a field), and most filters name few of a segment's fields.
Opening a part's descriptor is a system call, and it is what keeps the part readable later: a reloaded version
shares its segments with the version it replaced, whose directory the indexer may prune before a filter first
names a field (tests/models/bundle/storage/test_shared_segment_pruned.py). So the descriptor is taken at load and
the part mapped from it, never from its path again; the map holds its own descriptor, and the part's is closed.
"""

from __future__ import annotations

import math
import mmap
import os
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

_HEADERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}  # what np.save writes here


def open_part(path: Path) -> int:
    """A read-only descriptor of the part (not inherited by child processes: os.open's default)."""
    return os.open(path, os.O_RDONLY)


def map_part(descriptor: int) -> np.ndarray:
    """The part's array, read-only over a map of its file, as np.load(mmap_mode="r") maps it; a file that is no
    .npy array, or shorter than its header says, is a ValueError as it is for np.load."""
    pages = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)  # its own descriptor; an empty file: ValueError
    try:
        version = npy.read_magic(pages)  # an mmap reads as a file: the header is the map's first bytes
        header = _HEADERS.get(version)
        if header is None:
            raise ValueError(f"unsupported .npy format version {version}")
        shape, fortran, dtype = header(pages)
        if dtype.hasobject:
            raise ValueError("Array can't be memory-mapped: Python objects in dtype.")
        offset = pages.tell()
        if offset + math.prod(shape) * dtype.itemsize > len(pages):
            raise ValueError(f"a .npy file of {len(pages)} bytes is shorter than its header's {shape} {dtype}")
        return np.ndarray(shape, dtype, buffer=pages, offset=offset, order="F" if fortran else "C")
    except BaseException:
        pages.close()
        raise
