"""The append-only log of an embedding-store entry's shards: proof of what was encoded, once.

One JSON line per shard written (index, row range, sha256 of the shard file, when, which
process). A build killed at any point resumes from the shards on disk; the log then shows
that every shard was encoded exactly once. A line cut short by a kill is ignored on read.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)

SHARD_LOG = "shards.jsonl"

# encoded: computed by the teacher now; stored: vectors computed elsewhere (an import, an update);
# adopted: a complete shard file found on resume that a kill kept out of the log; linked: an import file shared
# with the entry by a hard link (models.embeddings.store.EmbeddingStore.put_file).
ShardEvent = Literal["encoded", "stored", "adopted", "linked"]


class ShardRecord(BaseModel):
    shard: int
    start: int
    end: int
    sha256: str
    event: ShardEvent = "encoded"
    shard_size: int
    at: str
    pid: int
    # the file's size and st_mtime_ns when it was stored: a single-file entry (put_file) is checked against them
    size: int | None = None
    mtime_ns: int | None = None


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@contextlib.contextmanager
def entry_lock(entry: Path) -> Iterator[None]:
    """An exclusive lock on an entry, so concurrent builds never encode the same shard twice.

    flock is released by the kernel when its holder dies, so a SIGKILLed build never leaves it stale.
    """
    with (Path(entry) / ".lock").open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s is being encoded by another process; waiting for it", entry)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class ShardLog:
    def __init__(self, entry: Path) -> None:
        self.path = Path(entry) / SHARD_LOG

    def append(self, record: ShardRecord) -> None:
        """Append one line and fsync it, so a record on disk means the shard is on disk."""
        torn = False
        if self.path.is_file() and self.path.stat().st_size:
            with self.path.open("rb") as fh:
                fh.seek(-1, os.SEEK_END)
                torn = fh.read(1) != b"\n"  # a kill cut the last append short: start a fresh line
        with self.path.open("a") as fh:
            fh.write(("\n" if torn else "") + record.model_dump_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read(self) -> list[ShardRecord]:
        """Records in order; a torn last line (killed mid-append) is skipped, other bad lines too, with a warning."""
        if not self.path.is_file():
            return []
        out: list[ShardRecord] = []
        for lineno, line in enumerate(self.path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append(ShardRecord.model_validate(json.loads(line)))
            except (json.JSONDecodeError, ValidationError):
                log.warning("%s:%d: unreadable shard record skipped", self.path, lineno)
        return out

    def latest(self) -> dict[int, ShardRecord]:
        """The last record of each shard index."""
        return {r.shard: r for r in self.read()}
