"""models.manifest_io: a missing, invalid or foreign-format manifest is one readable error naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from models.errors import ContractMismatch
from models.manifest_io import read_manifest, utc_now


class Card(BaseModel):
    format_version: int = 2
    name: str
    dim: int


def test_a_valid_manifest_reads(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text('{"format_version": 2, "name": "x", "dim": 4}')
    assert read_manifest(tmp_path / "m.json", Card, "card") == Card(name="x", dim=4)
    assert utc_now().endswith("+00:00")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "is not a card: m.json is missing"),
        ("{not json", "m.json: invalid card manifest: manifest: Invalid JSON"),
        ('{"format_version": 2, "name": "x", "dim": "four"}', "m.json: invalid card manifest: dim: "),
        ('{"format_version": 2, "name": "x"}', "invalid card manifest: dim: Field required"),
        ('{"format_version": 1, "name": "x", "dim": 4}', "card format 1 is not supported (expected 2)"),
    ],
)
def test_each_failure_names_the_file(tmp_path: Path, text: str | None, message: str) -> None:
    if text is not None:
        (tmp_path / "m.json").write_text(text)
    with pytest.raises(ContractMismatch) as caught:
        read_manifest(tmp_path / "m.json", Card, "card")
    assert message in str(caught.value) and str(tmp_path) in str(caught.value)
    assert "four" not in str(caught.value)  # no input echoed
