"""Hostile rows of issue 55 against a real server (uvicorn on 127.0.0.1): filters that would reach a limit of
SQLite, and pages deep enough that binary rescoring would decode a pool of rows at once.

The bundle is binary (sign codes, int8 rescoring) over the tiny corpus, and every document's `code` is a number
or a string by turns: a key of two JSON types, which the payload index leaves to the docstore's SQL. The server
caps the rows one request may rescore at 16 (TANDEM_MAX_RESCORE_ROWS) and oversamples ×4. Counted, never timed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from models.bundle.vectors.index import VectorIndex
from models.search.filters import parse_filter
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.corpus import DOCS
from tests.fixtures.server import LiveServer, serve_app
from tests.fixtures.tiny_service import MINI_DIM, build_mini

CAP = 16


def _code(i: int) -> int | str:
    return i if i % 2 == 0 else str(i)


CODES = {doc_id: _code(i) for i, (doc_id, _, _) in enumerate(DOCS)}


@pytest.fixture(scope="module")
def server(mini_bundle: Path, mini_teacher: Path, mini_student: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Over the tiny models (tests/fixtures/tiny_service.py): these rows count rows and codes, whatever the vectors."""
    root = tmp_path_factory.mktemp("hostile-sqlrescore")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d, "title": t, "text": x, "metadata": {"code": CODES[d]}}) + "\n"
                              for d, t, x in DOCS))
    build_mini(corpus, root / "bundle", mini_teacher, dim=MINI_DIM, quantization="binary")
    settings = ServiceSettings(index=root / "bundle", student=mini_student, binary_oversample=4,
                               max_rescore_rows=CAP)
    with serve_app(create_app(settings)) as live:
        yield live


def _index(live: LiveServer) -> VectorIndex:
    app: Any = live.server.config.app
    return app.state.loader.searcher().bundle.segments[0].vectors


def _nest(leaf: dict[str, Any], depth: int) -> dict[str, Any]:
    out = leaf
    for level in range(depth):
        out = {"not": out} if level % 3 == 2 else {("and", "or")[level % 3]: [out, {"field": "code", "exists": True}]}
    return out


WIDE = [*range(0, 1000, 2), *(str(i) for i in range(1, 1000, 2))]  # 1,000 values, under the 1,024 cap

HOSTILE: dict[str, dict[str, Any]] = {
    "in of 1,000 values of two kinds": {"field": "code", "in": WIDE},
    "in of 1,024 values": {"field": "code", "in": [*WIDE, *range(1000, 1024)]},
    "or of 255 conditions": {"or": [{"field": "code", "eq": _code(i)} for i in range(255)]},
    "16 levels deep": _nest({"field": "code", "in": WIDE}, 15),
    "a 300 kB value": {"field": "code", "in": ["x" * 300_000, 2, "3"]},
}


def _matching(flt: dict[str, Any]) -> set[str]:
    """The documents a filter allows, by its semantics in Python (Filter.matches)."""
    parsed = parse_filter(flt, frozenset({"code"}))
    return {d for d, code in CODES.items() if parsed.matches({"code": code})}


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.parametrize("mode", ["dense", "lexical"])  # hybrid's fusion depth rescores past this server's cap
def test_a_filter_on_an_unindexed_key_answers_200_or_422_never_5xx(server: LiveServer, name: str, mode: str) -> None:
    flt = HOSTILE[name]
    response = server.client.post("/search", json={"query": "glucose", "top_k": 4, "mode": mode, "filter": flt})
    assert response.status_code in (200, 422), response.text  # never a 5xx
    assert response.status_code == 200, response.text  # and each is within the filter's limits: answered
    found, allowed = {hit["id"] for hit in response.json()["results"]}, _matching(flt)
    assert found <= allowed and (mode != "dense" or len(found) == min(4, len(allowed)))  # dense fills its page


def test_a_page_past_the_rescoring_cap_is_refused_naming_it(server: LiveServer) -> None:
    # (offset 3 + top_k 2) × 4 = 20 rows to rescore (the whole tiny bundle): past the cap of 16
    response = server.client.post("/search", json={"query": "glucose", "top_k": 2, "offset": 3})
    assert response.status_code == 422, response.text
    problem = response.json()["details"][0]
    assert problem["field"] == "offset" and "TANDEM_MAX_RESCORE_ROWS" in problem["message"], problem
    assert "rescore 20 binary candidates" in problem["message"] and "at most 16" in problem["message"]
    batch = server.client.post("/search", json={"queries": ["glucose", "lava"], "top_k": 2})  # 2 × 2 × 4 = 16
    assert batch.status_code == 200, batch.text
    assert server.client.post("/search", json={"query": "lava", "top_k": 2, "offset": 3,
                                               "mode": "lexical"}).status_code == 200  # no rescoring


def test_rescoring_under_the_cap_decodes_its_pool_a_chunk_at_a_time(server: LiveServer) -> None:
    from models.bundle.vectors.index import ScoredRows  # here, so that the rows above run (and fail) on older code

    index = _index(server)
    index.chunk_rows = 4  # the served index's chunk, made small enough to count on 20 documents
    index.scored = ScoredRows()
    response = server.client.post("/search", json={"query": "glucose", "top_k": 2, "offset": 1})
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == 2
    pool = index.rescore_rows(3, 4, 3)
    assert pool == 12 <= CAP
    assert index.scored == ScoredRows(rows=pool, chunks=3, largest=4)  # at most 4 stored vectors decoded at once
