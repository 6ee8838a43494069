"""models.encoders.registry: a model directory's card (described, written, read back), the fingerprint that
changes with what makes the vectors, roles recorded in the store, and directories that are not models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.encoders.registry import (
    CARD_FILE,
    ROLES_FILE,
    describe,
    fingerprint,
    load_card,
    record_role,
    resolve,
    write_card,
)
from models.errors import ModelNotFound
from tests.fixtures.tiny_models import save_hf


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf("bert", tmp_path_factory.mktemp("models") / "tiny", hidden=32, layers=1)


def test_a_card_round_trips_and_names_the_teacher(model_dir: Path) -> None:
    card = describe(model_dir, name="tiny")
    assert (card.name, card.dim, card.pooling, card.normalize) == ("tiny", 32, "mean", True)
    assert len(card.fingerprint) == 64 and card.teacher_ref().fingerprint == card.fingerprint
    write_card(card)
    assert (model_dir / CARD_FILE).is_file() and load_card(model_dir) == card
    assert describe(model_dir, name="tiny").fingerprint == card.fingerprint  # the same weights, the same space


def test_the_fingerprint_changes_with_each_part() -> None:
    base = fingerprint("w", "mean", 768, True)
    assert base == fingerprint("w", "mean", 768, True, {})
    others = {fingerprint("x", "mean", 768, True), fingerprint("w", "cls", 768, True),
              fingerprint("w", "mean", 384, True), fingerprint("w", "mean", 768, False),
              fingerprint("w", "mean", 768, True, {"query_prompt": "q: "})}
    assert base not in others and len(others) == 5


def test_roles_are_recorded_in_the_store(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    with pytest.raises(ModelNotFound, match=r"no teacher model at .*all-mpnet-base-v2; run `tandem models fetch`"):
        resolve("teacher")
    record_role("teacher", model_dir)
    assert json.loads((tmp_path / "models" / ROLES_FILE).read_text()) == {"teacher": str(model_dir.resolve())}
    assert resolve("teacher") == model_dir.resolve() and resolve("backbone", model_dir) == model_dir


def test_a_directory_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="is not a model directory"):
        describe(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFound, match=r"has no weights \(model\.safetensors or pytorch_model\.bin\)"):
        describe(tmp_path)
