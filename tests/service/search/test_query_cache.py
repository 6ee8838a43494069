"""The query-vector cache: a bounded LRU (unit), and a real server answering repeated queries from it, counted in
/metrics, or encoding every query when TANDEM_QUERY_CACHE is 0."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.core.query_cache import QueryCache
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.server import LiveServer, serve_app


def test_the_least_recently_used_entry_goes_first_and_lookups_are_counted() -> None:
    counted: list[tuple[int, int]] = []
    cache = QueryCache(2, on_lookup=lambda hits, misses: counted.append((hits, misses)))
    a, b, c = (("key:a", "s", t) for t in "abc")
    cache.put_many([a, b], np.eye(2, dtype=np.float32), [3, 4])
    assert cache.get_many([a]) != [None]  # a is now the most recently used
    cache.put_many([c], np.ones((1, 2), dtype=np.float32), [5])
    found = cache.get_many([a, b, c])
    assert found[1] is None and len(cache) == 2
    assert found[0] is not None and found[0][1] == 3 and list(found[0][0]) == [1.0, 0.0]
    assert found[2] is not None and found[2][1] == 5
    assert counted == [(1, 0), (2, 1)]
    with pytest.raises(ValueError):
        found[0][0][0] = 2.0  # shared with answers: read-only
    with pytest.raises(ValueError, match="at least 1"):
        QueryCache(0)


def _cache_counts(server: LiveServer) -> dict[str, float]:
    text = server.client.get("/metrics").text
    return {s.labels["result"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "tandem_query_cache_total"}


def _tokenized(server: LiveServer) -> float:
    text = server.client.get("/metrics").text
    return next(s.value for family in text_string_to_metric_families(text) for s in family.samples
                if s.name == "tandem_stage_duration_seconds_count" and s.labels.get("stage") == "tokenize")


@pytest.mark.slow
def test_a_repeated_query_is_answered_from_the_cache(mini_settings: ServiceSettings) -> None:
    with serve_app(create_app(mini_settings.model_copy(update={"query_cache": 8}))) as server:
        first = server.client.post("/search", json={"query": "Why do ocean  tides follow the moon?", "top_k": 3})
        tokenized = _tokenized(server)
        again = server.client.post("/search", json={"query": "why do ocean tides follow the MOON?", "top_k": 3})
        assert first.status_code == again.status_code == 200
        assert again.json()["results"] == first.json()["results"]
        assert _cache_counts(server) == {"hit": 1, "miss": 1}
        assert _tokenized(server) == tokenized  # the second was never encoded
        # a batch mixing a cached query and a new one: the new one alone is encoded, answers in order
        batch = server.client.post("/search", json={"queries": ["a new query about bread",
                                                                "why do ocean tides follow the moon?"], "top_k": 3})
        assert batch.status_code == 200
        assert batch.json()["results"][1] == first.json()["results"]
        assert _cache_counts(server) == {"hit": 2, "miss": 2}
        # /v1/embeddings shares it: the vector and the usage of a cached query are those it was encoded with
        one = server.client.post("/v1/embeddings", json={"input": "a new query about bread"}).json()
        two = server.client.post("/v1/embeddings", json={"input": "A new query about bread"}).json()
        assert one["data"][0]["embedding"] == two["data"][0]["embedding"]
        assert one["usage"] == two["usage"]
        assert _cache_counts(server) == {"hit": 4, "miss": 2}


@pytest.mark.slow
def test_a_cache_of_size_zero_encodes_every_query(mini_settings: ServiceSettings) -> None:
    with serve_app(create_app(mini_settings.model_copy(update={"query_cache": 0}))) as server:
        for _ in range(2):
            assert server.client.post("/search", json={"query": "ocean tides", "top_k": 1}).status_code == 200
        assert _cache_counts(server) == {"hit": 0, "miss": 0}
        assert _tokenized(server) == 2
