"""What a reload may trust (issue 42, item 5): a file verified before is trusted only while its device, inode, size
and mtime_ns are the same; the files every version reads again are always hashed; and the limit, stated as a test:
a write in place that restores size and mtime keeps the identity."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from models.bundle.storage.integrity import check_unchanged, load_checked_array, verify_files
from models.errors import ContractMismatch


def _file(directory: Path, name: str, data: bytes) -> dict[str, str]:
    (directory / name).write_bytes(data)
    return {name: hashlib.sha256(data).hexdigest()}


def _flip_in_place(path: Path, keep_mtime: bool) -> None:
    """Change one byte of the same inode (r+b), the size kept; with `keep_mtime` the mtime is put back too."""
    stat = path.stat()
    with path.open("r+b") as fh:
        first = fh.read(1)
        fh.seek(0)
        fh.write(bytes([first[0] ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    else:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # coarse clocks: make it differ
    assert path.stat().st_ino == stat.st_ino and path.stat().st_size == stat.st_size


def test_a_file_is_hashed_once_then_trusted_while_its_identity_holds(tmp_path: Path) -> None:
    files = _file(tmp_path, "index.faiss", b"vectors" * 100)
    first = verify_files(tmp_path, files)
    assert first.hashed == ["index.faiss"] and first.hashed_bytes == 700
    again = verify_files(tmp_path, files, trusted=first.files)
    assert again.hashed == [] and again.trusted == 1 and again.files == first.files


def test_a_file_changed_in_place_is_hashed_again_and_refused_by_name(tmp_path: Path) -> None:
    files = _file(tmp_path, "docs.sqlite", b"documents" * 100)
    verified = verify_files(tmp_path, files).files
    _flip_in_place(tmp_path / "docs.sqlite", keep_mtime=False)
    with pytest.raises(ContractMismatch, match=r"docs\.sqlite: checksum mismatch"):
        verify_files(tmp_path, files, trusted=verified)
    with pytest.raises(ContractMismatch, match=r"docs\.sqlite: changed after it was verified"):
        check_unchanged(tmp_path, verified)


def test_a_replaced_file_with_the_old_size_and_mtime_is_caught_by_its_inode(tmp_path: Path) -> None:
    path = tmp_path / "index.faiss"
    files = _file(tmp_path, "index.faiss", b"a" * 64)
    verified = verify_files(tmp_path, files).files
    stat = path.stat()
    (tmp_path / "new").write_bytes(b"b" * 64)
    os.utime(tmp_path / "new", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(tmp_path / "new", path)
    with pytest.raises(ContractMismatch, match=r"index\.faiss: checksum mismatch"):
        verify_files(tmp_path, files, trusted=verified)


def test_the_limit_a_sneaky_write_in_place_keeps_the_identity_unless_the_file_is_always_hashed(tmp_path: Path) -> None:
    files = _file(tmp_path, "index.faiss", b"c" * 64) | _file(tmp_path, "rotation.npy", b"d" * 64)
    verified = verify_files(tmp_path, files).files
    for name in files:
        _flip_in_place(tmp_path / name, keep_mtime=True)
    # same device, inode, size and mtime_ns: trusted without a read (docs/operations.md#verification)
    assert verify_files(tmp_path, {"index.faiss": files["index.faiss"]}, trusted=verified).hashed == []
    # a file every version reads again is hashed however it looks, and a full verification reads everything
    with pytest.raises(ContractMismatch, match=r"rotation\.npy: checksum mismatch"):
        verify_files(tmp_path, files, trusted=verified, always=["rotation.npy"])
    with pytest.raises(ContractMismatch, match="checksum mismatch"):
        verify_files(tmp_path, files)


def test_a_trusted_identity_counts_only_for_the_sha256_it_was_verified_with(tmp_path: Path) -> None:
    files = _file(tmp_path, "a.npy", b"e" * 64)
    verified = verify_files(tmp_path, files).files
    with pytest.raises(ContractMismatch, match=r"a\.npy: checksum mismatch"):
        verify_files(tmp_path, {"a.npy": "0" * 64}, trusted=verified)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ContractMismatch, match=r"missing gone\.npy"):
        verify_files(tmp_path, {"gone.npy": "0" * 64})


def test_arrays_load_from_the_bytes_that_were_checked(tmp_path: Path) -> None:
    np.save(tmp_path / "center.npy", np.arange(4, dtype=np.float32))
    files = {"center.npy": hashlib.sha256((tmp_path / "center.npy").read_bytes()).hexdigest()}
    assert load_checked_array(tmp_path, "center.npy", files).tolist() == [0, 1, 2, 3]
    _flip_in_place(tmp_path / "center.npy", keep_mtime=True)
    with pytest.raises(ContractMismatch, match=r"center\.npy: checksum mismatch"):
        load_checked_array(tmp_path, "center.npy", files)
    with pytest.raises(ContractMismatch, match=r"does not list spin\.npy"):
        load_checked_array(tmp_path, "spin.npy", files)
