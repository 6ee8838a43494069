"""The service's file descriptors: the limit raised at startup, and a version that needs more refused by name.

A loaded segment keeps about ten files open for as long as it serves (its docstore, and the memory-mapped arrays
of its lexical and payload indexes: each map holds a descriptor), and a hot reload holds the version in service
and the candidate at once. A version of about a hundred segments passes a 1,024 soft limit, so `tandem serve`
raises its soft RLIMIT_NOFILE to the hard limit at startup (`raise_descriptor_limit`, logged), which the kernel
allows any process. A version that still cannot be opened fails with EMFILE or ENFILE somewhere inside FAISS,
SQLite or numpy; `out_of_descriptors` finds that in the error's chain, and the loader raises `TooManyOpenFiles`
naming the version, its segments and the limit, so the reload is refused with that reason and the version in
service keeps serving (docs/operations.md#file-descriptors).
"""

from __future__ import annotations

import errno
import logging
import os
import resource

from models.errors import TandemError

log = logging.getLogger(__name__)

_EXHAUSTED = (errno.EMFILE, errno.ENFILE)
_TEXTS = tuple(os.strerror(e) for e in _EXHAUSTED)  # FAISS and SQLite report the OS's text, not an OSError
MAX_RAISED = 1 << 20  # the soft limit asked for when the hard one is unlimited (Linux's default nr_open)


class TooManyOpenFiles(TandemError):
    """A version needs more file descriptors than the process may open: the reload is refused, the old one kept."""


def descriptor_limit() -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE; RLIM_INFINITY as is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return int(soft), int(hard)


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one (or MAX_RAISED when that is unlimited) and log it; the soft
    limit in force afterwards. A refusal (a container's seccomp, an odd platform) is a warning, never fatal."""
    soft, hard = descriptor_limit()
    want = MAX_RAISED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the file descriptor limit from %d to %d (%s): a version of many segments "
                        "may not load; compact it (`tandem index compact`)", soft, want, exc)
            return soft
        log.info("file descriptor limit raised from %d to %d (the hard limit)", soft, want)
        return want
    log.info("file descriptor limit: %d (hard %s)", soft, "unlimited" if hard == resource.RLIM_INFINITY else hard)
    return soft


def out_of_descriptors(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, says the process or the system ran out of descriptors."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _EXHAUSTED:
            return True
        if any(text in str(current) for text in _TEXTS):
            return True
        current = current.__cause__ or current.__context__
    return False


def too_many_open_files(directory: os.PathLike[str] | str, segments: int, shared: int) -> TooManyOpenFiles:
    """The error a version that ran out of descriptors is refused with: its segments, the limit and the remedies."""
    soft, _ = descriptor_limit()
    return TooManyOpenFiles(
        f"{directory}: too many open files: {segments} segments ({shared} shared with the version in service) need "
        f"more than the descriptor limit ({soft}) allows; raise the descriptor limit (ulimit -n, LimitNOFILE, "
        "docker --ulimit nofile) or compact the version (`tandem index compact`)")
