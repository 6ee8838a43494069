"""Every request is bounded before work starts, and input never costs a 5xx (issue 42): the hostile bodies of the
issue's table get 422s naming the field, the caps answer 422 beyond their limits, and the work a request costs
is bounded by counting what it touched (postings scored, filter values looked up, docstore scans), never by
timing it. Against the real server over the tiny metadata bundle (fields year, topic, published, open, doi), on the
tiny models (tests/fixtures/tiny_service.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from models.bundle.lexical.postings import Lexical
from models.bundle.version import Bundle
from tests.fixtures.server import LiveServer


def _post(server: LiveServer, body: str | dict[str, Any]) -> Any:
    content = body if isinstance(body, str) else json.dumps(body)
    return server.client.post("/search", content=content, headers={"content-type": "application/json"})


def _fields(response: Any) -> list[str]:
    assert response.status_code == 422, response.text
    return [d["field"] for d in response.json()["details"]]


def _bundle(server: LiveServer) -> Bundle:
    bundle: Bundle = server.server.config.app.state.loader.searcher().bundle
    return bundle


NOTS = '{"query": "vitamin d", "filter": ' + '{"not": ' * 100_000 + '{"field": "year", "eq": 1}' + "}" * 100_001


@pytest.mark.parametrize(("body", "field"), [
    ('{"query": "vitamin d", "filter": {"field": "year", "gte": 1e999}}', "filter.gte"),
    ('{"query": "\\ud800 vitamin d"}', "query"),
    ('{"queries": ["fine", "\\udfff"]}', "queries.1"),
    (NOTS, "body"),
    ('{"query": "vitamin d", "min_score": NaN}', "min_score"),
    ('{"query": "vitamin d", "min_score": -Infinity}', "min_score"),
    ('{"query": "vitamin d", "mode": "hybrid", "alpha": NaN}', "alpha"),
    ('{"query": "vitamin d", "top_k": 1e999}', "top_k"),
    ('{"query": "vitamin d", "filter": {"field": "year", "in": [2001, NaN]}}', "filter.in"),
    ('{"query": "vitamin d", "filter": {"field": "topic", "eq": "food\\ud800"}}', "filter.eq"),
    ('{"query": "vitamin d", "filter": {"field": "year", "eq": 9223372036854775808}}', "filter.eq"),
    ('{"query": "vitamin d", "filter": {"field": "\\ud800", "eq": 1}}', "filter.field"),
    ('{"query": "vitamin d", "\\ud800": 1}', "body"),  # pydantic refuses the key before naming it
])
def test_hostile_bodies_are_422s_naming_the_field(mini_meta_server: LiveServer, body: str, field: str) -> None:
    assert field in _fields(_post(mini_meta_server, body))


def test_the_body_depth_bound_spares_strings(mini_meta_server: LiveServer) -> None:
    query = "[" * 2000 + " tides"  # brackets inside a string nest nothing
    assert _post(mini_meta_server, {"query": query, "top_k": 1}).status_code == 200


def test_in_lists_and_filters_are_capped(mini_meta_server: LiveServer) -> None:
    one = {"field": "year", "in": list(range(1025))}
    assert _fields(_post(mini_meta_server, {"query": "x", "filter": one})) == ["filter.in"]
    five = {"or": [{"field": "year", "in": list(range(1000))} for _ in range(5)]}
    response = _post(mini_meta_server, {"query": "x", "filter": five})
    assert _fields(response) == ["filter.or.4"] and "4096" in response.json()["message"]
    deep: dict[str, Any] = {"field": "year", "eq": 1}
    for _ in range(17):
        deep = {"not": deep}
    assert _fields(_post(mini_meta_server, {"query": "x", "filter": deep}))[0].startswith("filter.not")


def test_offset_counts_toward_the_hits_bound(mini_meta_server: LiveServer) -> None:
    response = _post(mini_meta_server, {"query": "x", "top_k": 10, "offset": 9_995})
    assert _fields(response) == ["offset"] and "TANDEM_MAX_TOTAL_HITS" in response.json()["message"]
    assert _post(mini_meta_server, {"query": "x", "top_k": 10, "offset": 9_990}).status_code == 200


def test_a_lexical_query_is_capped_in_distinct_terms_not_in_repeats(mini_meta_server: LiveServer) -> None:
    distinct = " ".join(f"zq{a}{b}" for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefgh")  # 208 stems
    assert _fields(_post(mini_meta_server, {"query": distinct, "mode": "lexical"})) == ["query"]
    assert _post(mini_meta_server, {"query": distinct, "mode": "dense"}).status_code == 200  # dense scores no stem
    lexical = _bundle(mini_meta_server).require_lexical()
    assert isinstance(lexical, Lexical)
    before = lexical.postings_scored
    once = _post(mini_meta_server, {"query": "blood", "mode": "lexical", "top_k": 5}).json()["results"]
    single = lexical.postings_scored - before
    assert single > 0
    repeated = _post(mini_meta_server, {"query": " ".join(["blood"] * 340), "mode": "lexical", "top_k": 5})
    assert repeated.status_code == 200
    assert lexical.postings_scored - before == 2 * single  # the 340 words cost what one did
    assert [h["id"] for h in repeated.json()["results"]] == [h["id"] for h in once]


def test_in_values_are_looked_up_once_each_and_typed_fields_never_scan(mini_meta_server: LiveServer) -> None:
    segments = _bundle(mini_meta_server).segments
    looked_up = [s.payload.values_looked_up for s in segments if s.payload is not None]
    scans = [s.docs.scans for s in segments]
    many = _post(mini_meta_server, {"query": "x", "top_k": 20, "filter": {"field": "topic", "in": ["food"] * 1024}})
    once = _post(mini_meta_server, {"query": "x", "top_k": 20, "filter": {"field": "topic", "eq": "food"}})
    assert many.status_code == once.status_code == 200
    assert [h["id"] for h in many.json()["results"]] == [h["id"] for h in once.json()["results"]]
    assert [s.payload.values_looked_up for s in segments if s.payload is not None] == [n + 2 for n in looked_up]
    assert [s.docs.scans for s in segments] == scans
