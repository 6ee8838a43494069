"""A large body is refused in the words of a small one: one over 8 KiB is parsed and validated on a worker thread
(service.http.body), one under it by FastAPI's handler, and a client cannot tell which."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.server import LiveServer, serve_app


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real server serving nothing: these bodies are refused before anything is loaded or looked up."""
    nothing = tmp_path_factory.mktemp("nothing")
    settings = ServiceSettings(index=Path(nothing, "bundle"), student=Path(nothing, "student"))
    with serve_app(create_app(settings), wait_ready=False) as server:
        yield server


@pytest.mark.parametrize("path", ["/search", "/v1/embeddings"])
@pytest.mark.parametrize("body", [b'{"query": 1}', b'{"input": ["a", " ", 3]}', b'{"query": "x", "top_k": 1e999}',
                                  b'{"query": "x"', b"[1,2", b'{"query": "x", "\\ud800": 1}', b'{"queries": [1, 2]}'])
def test_a_large_body_is_refused_in_the_words_of_a_small_one(bare_server: LiveServer, path: str, body: bytes) -> None:
    """The same request padded with whitespace past 8 KiB answers the same."""
    headers = {"Content-Type": "application/json"}
    small = bare_server.client.post(path, content=body, headers=headers)
    large = bare_server.client.post(path, content=body + b" " * 9000, headers=headers)
    assert small.status_code == 422
    assert (large.status_code, large.json()) == (small.status_code, small.json())
