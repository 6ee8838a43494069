"""models.paths: the store lives under TANDEM_HOME (else ./.tandem), and names are plain before they become paths
(the refused names everywhere: tests/models/bundle/test_names.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.paths import cache_dir, embeddings_dir, is_plain_name, models_dir, tandem_home


def test_the_store_follows_tandem_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    assert tandem_home() == tmp_path / "home"
    assert (models_dir(), embeddings_dir(), cache_dir()) == (tmp_path / "home/models", tmp_path / "home/embeddings",
                                                             tmp_path / "home/cache")
    monkeypatch.delenv("TANDEM_HOME")
    monkeypatch.chdir(tmp_path)
    assert tandem_home() == tmp_path / ".tandem"


def test_plain_names() -> None:
    assert all(is_plain_name(n) for n in ("v1", "a.b_c-d", "0"))
    assert not any(is_plain_name(n) for n in ("", "..", ".x", "-x", "a/b", "a b"))
