"""`make demo` ends with the search page's URL, after the curl line, and that URL serves the page."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from tandem.demo import curl_line, ready_message
from tests.fixtures.server import LiveServer


def test_demo_ends_with_the_search_pages_url(live_server: LiveServer) -> None:
    url = urlsplit(live_server.url)
    assert url.hostname is not None and url.port is not None
    lines = ready_message(Path("bundle"), Path("student"), url.hostname, url.port).splitlines()
    assert curl_line(url.hostname, url.port) in "\n".join(lines)
    assert lines[-1] == f"Search page: {live_server.url}/"
    page = live_server.client.get(lines[-1].removeprefix("Search page: "))
    assert page.status_code == 200 and "<title>tandem search</title>" in page.text


def test_a_wildcard_bind_shows_the_loopback() -> None:
    assert ready_message(Path("b"), Path("s"), "0.0.0.0", 8000).splitlines()[-1] == "Search page: http://127.0.0.1:8000/"
