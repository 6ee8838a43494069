"""Bad corpus lines are rejected with an error naming the file and line, by the library and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from models.corpus import read_corpus
from models.errors import InputError

GOOD = json.dumps({"_id": "a", "title": "T", "text": "alpha"})

BAD_LINES = {
    "invalid JSON": ("{not json", "invalid JSON"),
    "missing id": (json.dumps({"title": "x", "text": "y"}), "missing document id"),
    "missing text": (json.dumps({"_id": "b", "title": "x"}), "missing 'text'"),
    "empty text": (json.dumps({"_id": "b", "text": "   "}), "empty text"),
    "duplicate id": (json.dumps({"_id": "a", "text": "again"}), "duplicate id 'a' (first seen on line 1)"),
    "not an object": ("[1, 2]", "expected a JSON object"),
    "non-string text": (json.dumps({"id": "b", "text": 5}), "'text' must be a string"),
}


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reads_beir_and_plain_lines(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD, "", json.dumps({"id": 7, "text": " plain "}))
    docs = read_corpus(path)
    assert [(d.id, d.title, d.text) for d in docs] == [("a", "T", "alpha"), ("7", "", "plain")]
    assert docs[0].passage() == "T alpha" and docs[1].passage() == "plain"


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_line_names_file_and_line(tmp_path: Path, case: str) -> None:
    line, message = BAD_LINES[case]
    path = write(tmp_path, GOOD, line)
    with pytest.raises(InputError) as err:
        read_corpus(path)
    assert f"{path}:2" in str(err.value)
    assert message in str(err.value)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="empty"):
        read_corpus(write(tmp_path, ""))
    with pytest.raises(InputError, match="not found"):
        read_corpus(tmp_path / "nope.jsonl")


def test_invalid_utf8_names_line(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"_id": "b", "text": "\xff\xfe"}\n')
    with pytest.raises(InputError, match=f"{path}:2"):
        read_corpus(path)


@pytest.mark.slow  # the build resolves the teacher model first
def test_cli_exits_nonzero_naming_the_line(tmp_path: Path) -> None:
    path, out = write(tmp_path, GOOD, GOOD), tmp_path / "b"
    proc = subprocess.run(
        [sys.executable, "-m", "tandem", "index", "build", "--corpus", str(path), "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2
    assert f"{path}:2: duplicate id 'a'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()
