"""models.bundle.staging: a directory is published whole under its name or not at all, a failure leaves no staging
directory, and an existing one is replaced only with force (by one atomic exchange)."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.bundle.staging import check_target, place, staged
from models.errors import InputError


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_a_staged_directory_is_published_whole(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "v1"
    ran: list[bool] = []
    with staged(out, force=False, after=lambda: ran.append(out.is_dir())) as staging:
        assert staging.parent == out.parent and staging.name.startswith(".v1.staging-")
        (staging / "sub").mkdir()
        (staging / "sub" / "a.txt").write_text("a")
        assert not out.exists()
    assert (out / "sub" / "a.txt").read_text() == "a"
    assert ran == [True] and _leftovers(out.parent) == []


def test_a_failure_publishes_nothing_and_leaves_no_staging(tmp_path: Path) -> None:
    out = tmp_path / "v1"
    with pytest.raises(RuntimeError, match="boom"), staged(out, force=False) as staging:
        (staging / "a.txt").write_text("half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_needs_force_and_is_replaced_atomically(tmp_path: Path) -> None:
    out = tmp_path / "v1"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(InputError, match="already exists; pass --force"):
        check_target(out, force=False)
    with staged(out, force=True) as staging:
        (staging / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"] and _leftovers(tmp_path) == []


def test_a_file_in_the_way_and_a_rival_publisher_are_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="exists and is not a directory"):
        check_target(tmp_path / "file", force=True)
    rival, mine = tmp_path / "v1", tmp_path / ".mine"
    mine.mkdir()
    rival.mkdir()
    (rival / "theirs.txt").write_text("theirs")
    with pytest.raises(InputError, match="published by another writer meanwhile"):
        place(mine, rival, force=False)
    assert (rival / "theirs.txt").read_text() == "theirs"
