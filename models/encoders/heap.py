"""Hand the pages glibc keeps after a large free back to the OS.

Why: glibc's malloc keeps freed memory in the process for reuse; after a one-off load (an ONNX graph parsed at
session start, a teacher used for a hundred queries) that memory stays resident for the process's life unless
`malloc_trim` returns it. A no-op where libc is not glibc.
"""

from __future__ import annotations

import contextlib
import ctypes


def return_freed_heap() -> None:
    """malloc_trim(0): what glibc holds free goes back to the OS."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
