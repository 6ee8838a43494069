"""Reading a BEIR dataset directory: corpus.jsonl, queries.jsonl and qrels/{split}.tsv.

Only the queries judged in the chosen qrels split are kept, as BEIR evaluates them.
Every malformed line is an InputError naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from models.corpus import Document, json_object, read_corpus
from models.errors import InputError

CORPUS_FILE = "corpus.jsonl"
QUERIES_FILE = "queries.jsonl"
QRELS_DIR = "qrels"
QRELS_HEADER = ("query-id", "corpus-id", "score")

Qrels = dict[str, dict[str, int]]


@dataclass(frozen=True)
class BeirDataset:
    """One split of a BEIR directory, as `tandem eval` and `choose_fusion` read it."""

    directory: Path
    split: str
    corpus: list[Document]
    queries: dict[str, str]  # only the queries judged in `qrels`, in qrels order
    qrels: Qrels


def _lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) for the non-blank lines of a UTF-8 text file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = _line_at(path, exc.start)
        raise InputError(f"{path}:{line}: not valid UTF-8 ({exc.reason})") from exc
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _line_at(path: Path, byte_offset: int) -> int:
    """1-based line number of a byte offset, for decoding errors."""
    return path.read_bytes()[:byte_offset].count(b"\n") + 1


def read_queries(path: Path) -> dict[str, str]:
    """Query id → text from a BEIR queries JSONL (`_id`, `text`; other keys ignored)."""
    queries: dict[str, str] = {}
    first_seen: dict[str, int] = {}
    for lineno, line in _lines(path):
        where = f"{path}:{lineno}"
        obj = json_object(line, where)
        qid, text = obj.get("_id", obj.get("id")), obj.get("text")
        if not isinstance(qid, str | int) or isinstance(qid, bool) or not str(qid).strip():
            raise InputError(f"{where}: missing query id ('_id')")
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{where}: query {qid!r} has no 'text'")
        qid = str(qid)
        if qid in first_seen:
            raise InputError(f"{where}: duplicate query id {qid!r} (first seen on line {first_seen[qid]})")
        first_seen[qid] = lineno
        queries[qid] = text.strip()
    if not queries:
        raise InputError(f"{path}: no queries")
    return queries


def read_qrels(path: Path) -> tuple[Qrels, dict[str, int]]:
    """Relevance judgements from a BEIR qrels TSV, and the line each query first appears on."""
    lines = _lines(path)
    if not lines or tuple(f.strip() for f in lines[0][1].split("\t")) != QRELS_HEADER:
        where = f"{path}:{lines[0][0]}" if lines else str(path)
        raise InputError(f"{where}: expected the header line {chr(9).join(QRELS_HEADER)!r} (tab-separated)")
    qrels: Qrels = {}
    first_line: dict[str, int] = {}
    for lineno, line in lines[1:]:
        where = f"{path}:{lineno}"
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != 3 or not all(fields):
            raise InputError(f"{where}: expected 3 tab-separated fields query-id, corpus-id, score")
        qid, doc_id, raw_score = fields
        try:
            score = int(raw_score)
        except ValueError:
            raise InputError(f"{where}: score {raw_score!r} is not an integer") from None
        judged = qrels.setdefault(qid, {})
        if doc_id in judged:
            raise InputError(f"{where}: duplicate judgement for query {qid!r} and document {doc_id!r}")
        judged[doc_id] = score
        first_line.setdefault(qid, lineno)
    if not qrels:
        raise InputError(f"{path}: no judgements after the header")
    return qrels, first_line


def load_beir(directory: Path, split: str = "test") -> BeirDataset:
    """The corpus, the split's judged queries and its qrels; a missing file or split is an InputError naming it."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory}: dataset directory not found")
    qrels_path = directory / QRELS_DIR / f"{split}.tsv"
    if not qrels_path.is_file():
        splits = sorted(p.stem for p in (directory / QRELS_DIR).glob("*.tsv"))
        available = ", ".join(splits) or "none"
        raise InputError(f"{qrels_path}: no qrels for split {split!r} (available: {available})")
    qrels, first_line = read_qrels(qrels_path)
    all_queries = read_queries(directory / QUERIES_FILE)
    missing = [qid for qid in qrels if qid not in all_queries]
    if missing:
        where, more = f"{qrels_path}:{first_line[missing[0]]}", len(missing) - 1
        raise InputError(
            f"{where}: query {missing[0]!r} is not in {directory / QUERIES_FILE}"
            + (f" (and {more} more such queries)" if more else "")
        )
    corpus = read_corpus(directory / CORPUS_FILE)
    return BeirDataset(
        directory=directory,
        split=split,
        corpus=corpus,
        queries={qid: all_queries[qid] for qid in qrels},
        qrels=qrels,
    )
