"""A txtai index of precomputed teacher vectors, served by txtai's API: one of the peers of bench/serving/peers.py.

Encoding SciFact with the teacher takes about an hour on a 2-core CPU, so txtai does not encode the corpus:
`build_index` indexes the reference document vectors through txtai's "external" vectors method (a transform
that hands back each document's precomputed row), with the document text as content. Then it rewrites the
saved configuration so that txtai vectorizes *queries* with the teacher, as an index built by
`Embeddings({"path": teacher})` would (method `sentence-transformers`: `SentenceTransformer(teacher)`'s
mean pooling and normalization, then txtai's own L2 normalization).

FAISS is set to `IDMap,Flat`, exact inner-product search. txtai's default above 5,000 documents would be
IVF (SciFact has 5,183), which approximates; flat keeps the comparison about the serving path.

The API runs as txtai documents it, `CONFIG=config.yml uvicorn "txtai.api:app"`; search is
`GET /search?query=...&limit=10`, answering `[{"id", "text", "score"}, ...]`.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from collections import defaultdict, deque
from pathlib import Path

import numpy as np

from models.corpus import read_corpus

log = logging.getLogger("bench.peer_txtai")

FAISS_COMPONENTS = "IDMap,Flat"


def build_index(out: Path, corpus: Path, embeddings: Path, ids: Path, teacher: Path) -> dict[str, object]:
    """Index the reference vectors with their passages at `out`, queries vectorized by `teacher`; the saved config."""
    from txtai import Embeddings

    vectors = np.asarray(np.load(embeddings), dtype=np.float32)
    names = [str(i) for i in json.loads(ids.read_text())]
    if len(names) != len(vectors):
        raise ValueError(f"{ids}: {len(names)} ids for {len(vectors)} vectors in {embeddings}")
    passages = {doc.id: doc.passage() for doc in read_corpus(corpus)}
    missing = [n for n in names if n not in passages]
    if missing:
        raise ValueError(f"{corpus}: no document for {len(missing)} vector ids (e.g. {missing[0]!r})")
    texts = [passages[n] for n in names]

    # txtai streams the documents to the transform in input order, in batches of their texts; equal texts
    # (if any) get their rows in that same order.
    rows: dict[str, deque[int]] = defaultdict(deque)
    for row, text in enumerate(texts):
        rows[text].append(row)

    def precomputed(batch: list[str]) -> np.ndarray:
        return vectors[[rows[text].popleft() for text in batch]]

    index = Embeddings({"method": "external", "transform": precomputed, "content": True, "backend": "faiss",
                        "faiss": {"components": FAISS_COMPONENTS}})
    index.index(zip(names, texts, [None] * len(names), strict=True))
    if index.count() != len(names):
        raise RuntimeError(f"txtai indexed {index.count()} of {len(names)} documents")
    shutil.rmtree(out, ignore_errors=True)
    index.save(str(out))
    index.close()

    path = out / "config.json"
    config = json.loads(path.read_text())
    del config["transform"]  # saved as the function's repr
    # No progress bar per query (sentence-transformers shows one when its logger is at INFO).
    config.update(method="sentence-transformers", path=str(teacher), encodeargs={"show_progress_bar": False})
    path.write_text(json.dumps(config, indent=2))
    log.info("txtai index of %d documents at %s (faiss %s, queries by %s)", len(names), out, FAISS_COMPONENTS,
             teacher.name)
    return config


def write_api_config(path: Path, index: Path) -> Path:
    """txtai's API configuration: load the index at `index`, read-only, with the embeddings routes."""
    # JSON is YAML; `embeddings` turns the embeddings routes on, and an index found at `path` is loaded.
    path.write_text(json.dumps({"path": str(index), "writable": False, "embeddings": {}}, indent=2) + "\n")
    return path


def api_cmd(port: int) -> list[str]:
    """The documented way to run txtai's API (with the config in the CONFIG environment variable)."""
    return [sys.executable, "-m", "uvicorn", "txtai.api:app", "--host", "127.0.0.1", "--port", str(port)]
