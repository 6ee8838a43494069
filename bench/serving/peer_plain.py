"""The plain way to serve teacher search, one of the peers that bench/serving/peers.py measures against tandem.

What a developer would write first: FastAPI on uvicorn (the same stack and uvicorn settings as `tandem serve`),
a sync endpoint (FastAPI runs it in its thread pool) that encodes the query with sentence-transformers'
`SentenceTransformer(teacher)` on CPU and searches a FAISS `IndexFlatIP` of precomputed teacher document
vectors. No batching, no caching, no student: the baseline tandem's design has to beat.

    python -m bench.serving.peer_plain --teacher DIR --embeddings corpus.f16.npy --ids corpus.ids.json --port 8001

POST /search {"query": "...", "top_k": 10} → {"results": [{"id": ..., "score": ...}, ...]}; GET /readyz → 200
once the model and the index are loaded (before the port opens, in fact).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel, Field

log = logging.getLogger("bench.peer_plain")


class SearchRequest(BaseModel):
    query: str = Field(min_length=1)
    top_k: int = Field(10, ge=1, le=100)


class Hit(BaseModel):
    id: str
    score: float


class SearchResponse(BaseModel):
    results: list[Hit]


def load_vectors(embeddings: Path, ids: Path) -> tuple[np.ndarray, list[str]]:
    """Unit float32 rows and their document ids."""
    import faiss

    vectors = np.ascontiguousarray(np.load(embeddings), dtype=np.float32)
    names = [str(i) for i in json.loads(ids.read_text())]
    if len(names) != len(vectors):
        raise ValueError(f"{ids}: {len(names)} ids for {len(vectors)} vectors in {embeddings}")
    faiss.normalize_L2(vectors)
    return vectors, names


def create_app(teacher: Path, embeddings: Path, ids: Path) -> FastAPI:
    import faiss
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(teacher), device="cpu")
    vectors, names = load_vectors(embeddings, ids)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    log.info("teacher %s, %d documents in a %d-d IndexFlatIP", teacher.name, index.ntotal, index.d)
    app = FastAPI(title="plain teacher search")

    @app.get("/readyz")
    def readyz() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/search")
    def search(request: SearchRequest) -> SearchResponse:
        query = model.encode([request.query], convert_to_numpy=True, normalize_embeddings=True,
                             show_progress_bar=False)
        scores, rows = index.search(np.asarray(query, dtype=np.float32), request.top_k)
        return SearchResponse(results=[Hit(id=names[r], score=float(s))
                                       for r, s in zip(rows[0], scores[0], strict=True) if r >= 0])

    return app


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Plain teacher search: sentence-transformers + FAISS flat on FastAPI.")
    parser.add_argument("--teacher", type=Path, required=True, help="Teacher sentence-transformers directory.")
    parser.add_argument("--embeddings", type=Path, required=True, help="Document vectors (.npy, one row per id).")
    parser.add_argument("--ids", type=Path, required=True, help="JSON list of the rows' document ids.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads.")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch
    import uvicorn

    torch.set_num_threads(args.threads)
    app = create_app(args.teacher, args.embeddings, args.ids)
    # As `tandem serve` runs it (service/runtime/main.py): uvicorn's default loop and HTTP implementations, no access
    # log.
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", log_config=None, access_log=False)


if __name__ == "__main__":
    main()
