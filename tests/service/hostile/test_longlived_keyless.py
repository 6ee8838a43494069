"""Key-less endpoints say nothing a key would not (issue 55, deliverable 7): /readyz and /metrics, open to anyone
who reaches the server, name no collection, not even one that failed to load, unless the request bears
TANDEM_METRICS_TOKEN (or TANDEM_METRICS_NAMES is on). A tenant's API key does not open them either. A real server:
two collections, one of which fails to load, and a scoped key file."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.http.app import create_app
from service.settings import CollectionSpec, ServiceSettings
from tests.fixtures.server import LiveServer, serve_app
from tests.service.reload.test_service_reload import flip_bytes, wait_for

pytestmark = pytest.mark.slow

SERVED, BROKEN = "acme-merger-docs", "globex-layoffs"  # names worth hiding
TOKEN = "metrics-token-0123456789"
TENANT = "tenant-key-0123456789"


@pytest.fixture(scope="module")
def server(mini_bundle: Path, mini_student: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    work = tmp_path_factory.mktemp("keyless")
    broken = work / "broken"
    shutil.copytree(mini_bundle, broken)
    flip_bytes(broken)  # fails verification at load: that collection reports a failure
    keys = work / "keys.toml"
    keys.write_text(f'[[key]]\nid = "tenant"\nkey = "{TENANT}"\ncollections = ["{SERVED}"]\n')
    specs = (CollectionSpec(name=SERVED, index=mini_bundle, student=mini_student),
             CollectionSpec(name=BROKEN, index=broken, student=mini_student))
    settings = ServiceSettings(index=mini_bundle, student=mini_student, collections=specs, keys_file=keys,
                               metrics_token=TOKEN, agreement_budget_s=0)
    with serve_app(create_app(settings), wait_ready=False) as live:
        wait_for(lambda: live.client.get("/readyz").status_code == 200, "one collection serves, the other failed")
        assert live.client.post(f"/collections/{SERVED}/search", json={"query": "tides"},
                                headers={"Authorization": f"Bearer {TENANT}"}).status_code == 200
        yield live


def _named(text: str) -> list[str]:
    return [name for name in (SERVED, BROKEN) if name in text]


@pytest.mark.parametrize("headers", [{}, {"Authorization": f"Bearer {TENANT}"}, {"Authorization": "Bearer wrong"}],
                         ids=["no key", "a tenant's key", "a wrong token"])
def test_readyz_and_metrics_name_no_collection_without_the_metrics_token(server: LiveServer,
                                                                         headers: dict[str, str]) -> None:
    ready = server.client.get("/readyz", headers=headers)
    assert ready.status_code == 200
    assert _named(ready.text) == []
    assert ready.json()["error"].startswith("1 of 2 collections failed to load")
    scraped = server.client.get("/metrics", headers=headers)
    assert scraped.status_code == 200
    assert _named(scraped.text) == [] and 'collection="' not in scraped.text
    # still useful: aggregated over the collections
    assert "tandem_collection_ready 1.0" in scraped.text  # one of the two serves
    assert "tandem_collection_searches_total 1.0" in scraped.text


def test_the_metrics_token_lets_them_name_the_collections(server: LiveServer) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    ready = server.client.get("/readyz", headers=auth).json()
    assert _named(ready["error"]) == [BROKEN]
    scraped = server.client.get("/metrics", headers=auth).text
    assert f'tandem_collection_ready{{collection="{SERVED}"}} 1.0' in scraped
    assert f'tandem_collection_ready{{collection="{BROKEN}"}} 0.0' in scraped
