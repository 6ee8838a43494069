"""What a loaded version's files were verified to be: each file's sha256, and the identity (device, inode, size,
mtime_ns) the file had when it was hashed.

Why identities: a hot reload to a version that hard-links most of its files from the version in service would
otherwise read the whole bundle again on every reload (docs/operations.md#verification gives the cost at 1M
documents). A file whose identity is one this process hashed, and whose manifest sha256 is the one it had then,
is trusted without being read. The limit: a write in place that keeps the size and puts the mtime back (os.utime)
keeps all four, and only reading the file again (`tandem index verify`) finds it. The ctime would catch that write
but cannot be part of the identity: hard-linking a file into the next version changes its ctime.

Files a version reads again however many segments it shares (the space files, the tombstones) are never trusted
by identity: `load_checked_array` reads them once, hashes those bytes and loads the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from models.errors import ContractMismatch

log = logging.getLogger(__name__)


class FileIdentity(NamedTuple):
    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, stat: os.stat_result) -> FileIdentity:
        return cls(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


@dataclass(frozen=True)
class VerifiedFile:
    identity: FileIdentity  # as it was when hashed
    sha256: str


Verified = Mapping[str, VerifiedFile]  # a version's file name → what verifying it found


@dataclass(frozen=True)
class Verification:
    """The files of one version as verified: those hashed now and those trusted by identity."""

    files: dict[str, VerifiedFile]
    hashed: list[str]
    hashed_bytes: int

    @property
    def trusted(self) -> int:
        return len(self.files) - len(self.hashed)


def mismatch(directory: Path, name: str) -> ContractMismatch:
    """Names the version and the file within it (an HTTP body keeps only a path's last component)."""
    return ContractMismatch(f"{directory}: {name}: checksum mismatch with the manifest; the bundle is corrupted or "
                            "was modified after publishing")


def hash_file(directory: Path, name: str) -> VerifiedFile:
    """The file's sha256 and its identity while it was read; a file that changed meanwhile is refused."""
    with (directory / name).open("rb") as fh:
        before = FileIdentity.of(os.fstat(fh.fileno()))
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
        after = FileIdentity.of(os.fstat(fh.fileno()))
    if before != after:
        raise ContractMismatch(f"{directory}: {name}: changed while it was being verified")
    return VerifiedFile(before, digest)


def verify_files(directory: Path, files: Mapping[str, str], trusted: Verified | None = None,
                 always: Iterable[str] = ()) -> Verification:
    """Check each of `files` (name → manifest sha256) under `directory`; raise naming the first that differs.

    A file is trusted without being read when its identity is that of a file in `trusted` (what the version in
    service verified) that had the sha256 the manifest now gives it; every other file, and each of `always`, is
    hashed again."""
    known = {v.identity: v.sha256 for v in (trusted or {}).values()}
    reread = frozenset(always)
    out: dict[str, VerifiedFile] = {}
    hashed: list[str] = []
    size = 0
    for name, expected in files.items():
        path = directory / name
        try:
            identity = FileIdentity.of(path.stat())
        except FileNotFoundError:
            raise ContractMismatch(f"{directory}: bundle is incomplete, missing {name}") from None
        if name not in reread and known.get(identity) == expected:
            out[name] = VerifiedFile(identity, expected)
            continue
        found = hash_file(directory, name)
        if found.sha256 != expected:
            log.warning("%s: sha256 %s, the manifest says %s", path, found.sha256, expected)
            raise mismatch(directory, name)
        out[name], size = found, size + found.identity.size
        hashed.append(name)
    return Verification(out, hashed, size)


def check_unchanged(directory: Path, verified: Verified) -> None:
    """Refuse a version whose files changed (identity) since they were verified, e.g. while it was loading."""
    for name, file in verified.items():
        try:
            identity = FileIdentity.of((directory / name).stat())
        except FileNotFoundError:
            raise ContractMismatch(f"{directory}: {name}: removed after it was verified") from None
        if identity != file.identity:
            raise ContractMismatch(f"{directory}: {name}: changed after it was verified (its identity differs)")


def read_checked(directory: Path, name: str, files: Mapping[str, str]) -> bytes:
    """The bytes of file `name`, once their sha256 is the one `files` (the manifest's) gives it."""
    if name not in files:
        raise ContractMismatch(f"{directory}: the manifest does not list {name}, which the loader reads")
    data = (directory / name).read_bytes()
    if hashlib.sha256(data).hexdigest() != files[name]:
        raise mismatch(directory, name)
    return data


def load_checked_array(directory: Path, name: str, files: Mapping[str, str]) -> np.ndarray:
    """A .npy file loaded from the very bytes that were checked against the manifest (no second read)."""
    array: np.ndarray = np.load(io.BytesIO(read_checked(directory, name, files)), allow_pickle=False)
    return array
