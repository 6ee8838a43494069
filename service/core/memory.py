"""What a collection costs in memory, read from Linux's /proc (None elsewhere): the process's resident set around a
collection's initial load, and the bytes of a version's files the process maps.

Why both: the resident growth is what loading took (the vectors FAISS reads into memory, the docstore's index, the
student when it is the first to use it) but it is one process's figure, measured while other collections may load
too; the mapped bytes are the version's own files mapped into memory (the docstore, mmapped segments), which the
kernel pages in on demand and may share with other processes, so they bound what it can add, not what it holds.
"""

from __future__ import annotations

import os
from pathlib import Path

_STATUS = Path("/proc/self/status")
_MAPS = Path("/proc/self/maps")


def rss_bytes() -> int | None:
    """VmRSS of this process now (resident: anonymous memory and file pages in memory)."""
    try:
        lines = _STATUS.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # reported in kB
    return None


def mapped_bytes(directory: Path) -> int | None:
    """The address space this process maps from files under `directory` (each mapping's full length)."""
    try:
        lines = _MAPS.read_text().splitlines()
    except OSError:
        return None
    prefix = os.path.realpath(directory) + os.sep
    total = 0
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(prefix):
            start, end = parts[0].split("-")
            total += int(end, 16) - int(start, 16)
    return total
