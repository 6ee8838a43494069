"""The search page at GET /, driven in real headless Chromium against a real server: type a query, wait
for the results, check the first hit, the timings and the index version; pick a mode and build a filter from
the bundle's fields; with API keys, the key it asks for stays in the page. TANDEM_PAGE_SCREENSHOT=path saves
what the browser showed of a filtered search (docs/search-page.png)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.http.app import create_app
from service.settings import CollectionSpec, ServiceSettings
from tests.fixtures.browser import Page
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.metadata import META
from tests.fixtures.server import LiveServer, local_client, serve_app

QUERY = "how do I make a loaf of bread rise"
TITLES = {doc_id: title for doc_id, title, _ in DOCS}


def _shown(page: Page, element_id: str) -> bool:
    return bool(page.evaluate(f"getComputedStyle(document.getElementById('{element_id}')).display !== 'none'"))


def _search(page: Page, query: str) -> None:
    page.evaluate("document.getElementById('results').replaceChildren()")
    page.type("#query", query)
    page.press_enter()


def _first_hit(page: Page) -> dict[str, str]:
    page.wait_for("document.querySelectorAll('#results .hit').length > 0", "the results")
    return dict(page.evaluate("""(() => {
        const hit = document.querySelector('#results .hit');
        return {id: hit.dataset.id, title: hit.querySelector('.title').textContent,
                score: hit.querySelector('.score').textContent, snippet: hit.querySelector('.snippet').textContent};
    })()"""))


def test_page_searches_and_shows_hits_timings_and_version(live_server: LiveServer, chromium_page: Page,
                                                          tiny_bundle: Path) -> None:
    chromium_page.open(f"{live_server.url}/")
    assert not _shown(chromium_page, "key-row")  # no keys configured
    _search(chromium_page, QUERY)
    hit = _first_hit(chromium_page)
    assert hit["id"] == PROBES[QUERY] and hit["title"] == TITLES[PROBES[QUERY]]
    assert 0 < float(hit["score"]) <= 1 and "yeast" in hit["snippet"]
    assert chromium_page.evaluate("document.getElementById('index-version').textContent") == tiny_bundle.name
    timings = chromium_page.evaluate("['queue', 'encode', 'search'].map(s => document.getElementById('t-' + s)"
                                     ".textContent)")
    assert all(float(t) >= 0 for t in timings)
    assert _shown(chromium_page, "meta")
    # Offline: everything the page loaded came from the server itself.
    origins = chromium_page.evaluate("performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
    assert origins and set(origins) == {live_server.url}


def _choose(page: Page, selector: str, value: str) -> None:
    """Pick an option of a <select> as a user would: its value set, then its change event."""
    page.evaluate(f"(() => {{ const el = document.querySelector({json.dumps(selector)}); "
                  f"el.value = {json.dumps(value)}; el.dispatchEvent(new Event('change')); }})()")


def test_page_offers_the_modes_and_a_filter_box_of_the_bundles_fields(meta_server: LiveServer,
                                                                       chromium_page: Page) -> None:
    chromium_page.open(f"{meta_server.url}/")
    chromium_page.wait_for("document.body.dataset.index === 'loaded'", "the index's fields")
    modes = chromium_page.evaluate("[...document.getElementById('mode').options].filter(o => !o.disabled)"
                                   ".map(o => o.value)")
    assert modes == ["dense", "lexical", "hybrid"]
    _choose(chromium_page, "#mode", "hybrid")
    chromium_page.evaluate("document.getElementById('add-filter').click()")
    offered = chromium_page.evaluate("[...document.querySelectorAll('.filter .f-field option')].map(o => o.value)")
    assert set(offered) == {"year", "topic", "published", "open", "doi", "source"}
    labels = chromium_page.evaluate("[...document.querySelectorAll('.filter .f-field option')].map(o => o.text)")
    assert "year (integer)" in labels and "open (boolean)" in labels
    _choose(chromium_page, ".filter .f-field", "topic")
    chromium_page.type(".filter .f-value", "earth")
    chromium_page.evaluate("document.getElementById('add-filter').click()")
    _choose(chromium_page, ".filter:last-child .f-field", "year")
    _choose(chromium_page, ".filter:last-child .f-op", "gte")
    chromium_page.type(".filter:last-child .f-value", "2005")
    _search(chromium_page, "what is this about")
    chromium_page.wait_for("document.querySelectorAll('#results .hit').length > 0", "the filtered results")
    shown = chromium_page.evaluate("[...document.querySelectorAll('#results .hit')].map(h => h.dataset.id)")
    matching = {doc_id for doc_id, meta in META.items() if meta["topic"] == "earth" and meta["year"] >= 2005}
    assert shown and set(shown) == matching  # hybrid fills the page with every match
    assert float(chromium_page.evaluate("document.getElementById('t-filter').textContent")) >= 0
    screenshot = os.environ.get("TANDEM_PAGE_SCREENSHOT")
    if screenshot:
        chromium_page.screenshot(Path(screenshot))
    chromium_page.evaluate("document.querySelector('.filter:last-child .f-value').value = 'soon'")
    _search(chromium_page, "what is this about")
    chromium_page.wait_for("document.getElementById('status').textContent.includes('whole number')", "the refusal")


def test_page_lists_the_collections_and_searches_the_chosen_one(tiny_bundle: Path, meta_bundle: Path,
                                                                tiny_student: Path, chromium_page: Page) -> None:
    specs = (CollectionSpec(name="docs", index=tiny_bundle, student=tiny_student),
             CollectionSpec(name="meta", index=meta_bundle, student=tiny_student))
    settings = ServiceSettings(index=tiny_bundle, student=tiny_student, collections=specs)
    with serve_app(create_app(settings)) as server:
        chromium_page.open(f"{server.url}/")
        chromium_page.wait_for("document.body.dataset.index === 'loaded'", "the first collection's fields")
        offered = chromium_page.evaluate("[...document.getElementById('collection').options].map(o => o.value)")
        assert offered == ["docs", "meta"] and _shown(chromium_page, "collection")
        _choose(chromium_page, "#collection", "meta")
        chromium_page.wait_for("document.body.dataset.indexOf === 'meta'", "meta's fields")
        _choose(chromium_page, "#mode", "lexical")
        _search(chromium_page, "Odoacer")
        assert _first_hit(chromium_page)["id"] == "rome"
        shown = chromium_page.evaluate("document.getElementById('index-version').textContent")
        assert shown == meta_bundle.name  # meta answered, not the first collection


@pytest.fixture(scope="module")
def keyed_server(tiny_bundle: Path, tiny_student: Path) -> Iterator[LiveServer]:
    with serve_app(create_app(ServiceSettings(index=tiny_bundle, student=tiny_student, api_keys="k-page"))) as server:
        yield server


def test_page_asks_for_a_key_and_keeps_it_in_the_page(keyed_server: LiveServer, chromium_page: Page) -> None:
    chromium_page.open(f"{keyed_server.url}/")
    assert _shown(chromium_page, "key-row")
    _search(chromium_page, QUERY)
    chromium_page.wait_for("document.getElementById('status').textContent.includes('API key')", "the key prompt")
    chromium_page.type("#api-key", "wrong")
    chromium_page.press_enter()
    chromium_page.wait_for("document.getElementById('status').textContent.includes('not valid')", "the 403")
    chromium_page.evaluate("document.getElementById('api-key').value = ''")
    chromium_page.type("#api-key", "k-page")
    chromium_page.evaluate("document.getElementById('query').focus()")
    chromium_page.press_enter()
    assert _first_hit(chromium_page)["id"] == PROBES[QUERY]
    # with a working key, the page reads the index's fields (GET /index is behind the keys like /search)
    chromium_page.wait_for("document.body.dataset.index === 'loaded'", "the index's fields after the key")
    stored = chromium_page.evaluate("JSON.stringify([localStorage.length, sessionStorage.length, document.cookie])")
    assert json.loads(stored) == [0, 0, ""]


def test_page_and_its_files_are_open_and_self_contained(keyed_server: LiveServer) -> None:
    with local_client(keyed_server.url) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert "http://" not in page.text and "https://" not in page.text  # no CDN
        assert client.get("/ui/static/app.js").status_code == 200
        assert client.get("/ui/config").json()["api_key_required"] is True
        assert client.post("/search", json={"query": "tides"}).status_code == 401  # the searches are not open
        assert client.get("/index").status_code == 401  # nor the fields they may filter on
