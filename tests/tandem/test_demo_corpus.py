"""The embedded demo corpus: valid, unique, useful, and byte-for-byte reproducible."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from models.corpus import read_corpus
from tandem.demo_corpus import DEMO_DOCS, MAX_DOC_CHARS, MIN_DOC_CHARS, MODULES, write_demo_corpus


@pytest.fixture(scope="module")
def demo_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "stdlib.jsonl"
    write_demo_corpus(out)
    return out


def test_documents_are_valid_and_unique(demo_corpus: Path) -> None:
    docs = read_corpus(demo_corpus)  # raises on a bad line or a duplicate id
    assert 2000 <= len(docs) <= 3000
    assert all(MIN_DOC_CHARS <= len(d.text) <= MAX_DOC_CHARS + 2 for d in docs)
    assert all(not d.id.rsplit(".", 1)[-1].startswith("_") for d in docs)


def test_answers_people_look_for_are_there(demo_corpus: Path) -> None:
    docs = {d.id: d for d in read_corpus(demo_corpus)}
    loads = docs["json.loads"]
    assert loads.title.startswith("json.loads(s, *")
    assert "JSON document" in loads.text
    assert "os.path.join" in docs and "pathlib.Path.glob" in docs
    # An alias reached twice is kept once, under its module-level name.
    assert "random.randint" in docs and "random.Random.randint" not in docs


def test_the_demo_indexes_the_everyday_modules(demo_corpus: Path) -> None:
    """`demo serve` indexes the walk's first DEMO_DOCS records, which are the modules MODULES lists first, so the
    answers a newcomer tries first are among them."""
    served = read_corpus(demo_corpus)[:DEMO_DOCS]
    ids = {d.id for d in served}
    assert {"json.loads", "os.path.join", "pathlib.Path.read_text", "subprocess.run", "time.sleep", "re.sub",
            "collections.Counter", "itertools.groupby", "threading.Thread", "copy.deepcopy", "io.StringIO",
            "urllib.parse.urlparse", "functools.lru_cache"} <= ids
    module_of = {m: i for i, m in enumerate(MODULES)}
    order = [max((m for m in MODULES if d.id.startswith(m + ".")), key=len) for d in served]
    assert [module_of[m] for m in order] == sorted(module_of[m] for m in order)  # the walk follows MODULES


def test_output_does_not_depend_on_the_caller(
    demo_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same bytes even when the calling process has patched the stdlib (transformers adds methods
    to logging.Logger, pytest swaps threading.excepthook), so the demo's embedding cache is reused."""

    def warning_once(self: logging.Logger, msg: str) -> None:
        """Like warning(), but emits each message only once per process lifetime."""

    monkeypatch.setattr(logging.Logger, "warning_once", warning_once, raising=False)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    again = tmp_path / "again.jsonl"
    write_demo_corpus(again)
    assert again.read_bytes() == demo_corpus.read_bytes()
    assert "logging.Logger.warning_once" not in again.read_text()


def test_max_docs_caps_the_output(tmp_path: Path, demo_corpus: Path) -> None:
    out = tmp_path / "small.jsonl"
    assert write_demo_corpus(out, max_docs=50) == 50
    assert out.read_text().splitlines() == demo_corpus.read_text().splitlines()[:50]
    assert not out.with_name(out.name + ".tmp").exists()
