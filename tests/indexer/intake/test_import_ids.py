"""The --ids file streamed a chunk at a time (indexer.intake.import_ids): the same ids json.loads gives, in any layout,
and a clear error naming the file and the element for anything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from indexer.intake import import_ids
from indexer.intake.import_ids import IdStream
from models.errors import InputError


def _stream_all(path: Path, step: int) -> list[str]:
    out: list[str] = []
    with IdStream(path) as stream:
        while batch := stream.take(step):
            out += batch
        assert stream.count == len(out)
    return out


@pytest.mark.parametrize("window", [1, 3, 7, 1 << 20])
def test_ids_stream_as_json_loads_reads_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    monkeypatch.setattr(import_ids, "READ_CHARS", window)  # elements cut across windows, numbers included
    ids = ["a", "doc, with comma", 'q"uote', "ünï", "\\slash", 12345678901234, 7, "x" * 50, "]", "[", ""]
    for text in (json.dumps(ids), json.dumps(ids, indent=2), "\n [ " + " ,\n".join(map(json.dumps, ids)) + " ]\n"):
        (tmp_path / "ids.json").write_text(text)
        for step in (1, 2, 1000):
            assert _stream_all(tmp_path / "ids.json", step) == [str(i) for i in ids]
    (tmp_path / "ids.json").write_text("[]")
    assert _stream_all(tmp_path / "ids.json", 5) == []


def test_rest_counts_what_is_left(tmp_path: Path) -> None:
    (tmp_path / "ids.json").write_text(json.dumps([f"d{i}" for i in range(100)]))
    with IdStream(tmp_path / "ids.json") as stream:
        assert stream.take(30) == [f"d{i}" for i in range(30)]
        assert stream.rest() == 70
        assert stream.count == 100


@pytest.mark.parametrize(("text", "message"), [
    ('{"a": 1}', r"expected '\['"),
    ('["a", "b"', "expected ',' or ']' after id 1"),
    ('["a" "b"]', "expected ',' or ']' after id 0"),
    ('["a", nul]', "id 1 is not valid JSON"),
    ('["a", "b', "id 1 is not valid JSON"),
    ('["a", true]', "id 1 is true"),
    ('["a", {"b": 1}]', "id 1 is"),
    ('["a", 1.5]', "id 1 is 1.5"),
    ('["a"] x', "unexpected content after the list"),
    ("", r"expected '\['"),
])
def test_bad_ids_files_name_the_file_and_the_element(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "ids.json").write_text(text)
    with pytest.raises(InputError, match=message) as caught, IdStream(tmp_path / "ids.json") as stream:
        stream.rest()
    assert str(tmp_path / "ids.json") in str(caught.value)


def test_a_missing_or_undecodable_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a readable JSON list of ids"):
        IdStream(tmp_path / "none.json")
    (tmp_path / "ids.json").write_bytes(b'["a", "\xff\xfe"]')
    with pytest.raises(InputError, match="not a readable JSON list of ids"), IdStream(tmp_path / "ids.json") as s:
        s.rest()
