"""Scoped keys and collections over a real uvicorn server: two collections (one with two tenants) in one process,
keys from a real TOML key file, a hypothesis property that a tenant's key never receives another tenant's document,
the key file rotated under load, and a malformed key file refusing to start `tandem serve`. On the tiny models
(tests/fixtures/tiny_service.py): who sees which document never depends on relevance."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.errors import InputError
from service.http.app import create_app
from service.settings import CollectionSpec, ServiceSettings
from tests.fixtures import service_fast
from tests.fixtures.corpus import DOCS
from tests.fixtures.server import LiveServer, local_client, serve_app
from tests.fixtures.tiny_service import build_mini

pytestmark = pytest.mark.slow

TENANTS = ("acme", "globex")
TENANT_OF = {doc_id: TENANTS[i % 2] for i, (doc_id, _, _) in enumerate(DOCS)}
BY_TITLE = {title: doc_id for doc_id, title, _ in DOCS}
BY_TEXT = {text: doc_id for doc_id, _, text in DOCS}
KEYS = {"acme": "acme-key-0123456789", "globex": "globex-key-0123456789", "ops": "ops-key-0123456789"}
LEGACY = "legacy-key-0123456789"
METRICS_TOKEN = "metrics-token-0123456789"  # lets /metrics name the collections
# TANDEM_LEAK_EXAMPLES: how many requests the property sends (the acceptance run used 2,000)
LEAK_EXAMPLES = int(os.environ.get("TANDEM_LEAK_EXAMPLES", "300"))


def _key_file(extra: str = "") -> str:
    acme_sha = hashlib.sha256(KEYS["acme"].encode()).hexdigest()
    return f"""# tenants of the docs collection
[[key]]
id = "acme"
sha256 = "{acme_sha}"
collections = ["docs"]
filter = {{field = "tenant", eq = "acme"}}

[[key]]
id = "globex"
key = "{KEYS['globex']}"
collections = ["docs"]
filter = {{field = "tenant", eq = "globex"}}
embeddings = true

[[key]]
id = "ops"
key = "{KEYS['ops']}"
collections = ["*"]
embeddings = true
{extra}"""


@pytest.fixture(scope="module")
def tenant_bundle(mini_teacher: Path, bundles_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny corpus, every document of one of two tenants (alternating), plus a year."""
    corpus = tmp_path_factory.mktemp("tenants") / "corpus.jsonl"
    with corpus.open("w") as fh:
        for i, (doc_id, title, text) in enumerate(DOCS):
            meta = {"tenant": TENANT_OF[doc_id], "year": 2000 + i}
            fh.write(json.dumps({"_id": doc_id, "title": title, "text": text, "metadata": meta}) + "\n")
    return build_mini(corpus, bundles_dir / "mini-tenants", mini_teacher)


@pytest.fixture(scope="module")
def keys_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(_key_file())
    return path


@pytest.fixture(scope="module")
def two(tenant_bundle: Path, mini_bundle: Path, mini_student: Path, keys_path: Path) -> Iterator[LiveServer]:
    """Collections 'docs' (two tenants) and 'plain' (the tiny bundle), one student shared, scoped and legacy keys."""
    specs = (CollectionSpec(name="docs", index=tenant_bundle, student=mini_student),
             CollectionSpec(name="plain", index=mini_bundle, student=mini_student))
    service = ServiceSettings(index=tenant_bundle, student=mini_student, collections=specs, keys_file=keys_path,
                              api_keys=LEGACY, watch_interval_s=0.05, metrics_token=METRICS_TOKEN)
    with serve_app(create_app(service)) as server:
        yield server


def _auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS.get(who, who)}"}


def _ids(hits: list[dict[str, Any]]) -> list[str | None]:
    """Each hit's document, by whichever field it carries (None: only its score)."""
    out: list[str | None] = []
    for hit in hits:
        if "id" in hit:
            out.append(hit["id"])
        elif "title" in hit:
            out.append(BY_TITLE[hit["title"]])
        elif "text" in hit:
            out.append(BY_TEXT[hit["text"]])
        elif "metadata" in hit:
            out.append(next(d for d, t in TENANT_OF.items() if t == hit["metadata"]["tenant"]))
        else:
            out.append(None)
    return out


def test_two_collections_answer_by_name_and_share_one_student(two: LiveServer) -> None:
    tops = []
    for name in ("docs", "plain"):
        response = two.client.post(f"/collections/{name}/search", json={"query": "ocean tides and the moon"},
                                   headers=_auth("ops"))
        assert response.status_code == 200, response.text
        tops.append(response.json()["results"][0]["id"])
    assert tops[0] == tops[1]  # the same documents in the same space, by one student: the same answer
    listed = two.client.get("/collections", headers=_auth("ops")).json()["collections"]
    assert [(c["name"], c["state"]) for c in listed] == [("docs", "ready"), ("plain", "ready")]
    assert two.client.get("/collections/plain", headers=_auth("ops")).json()["count"] == len(DOCS)
    assert len(_app_of(two).state.collections.students) == 1  # one student directory: loaded once
    scraped = two.client.get("/metrics", headers=_auth(METRICS_TOKEN)).text
    for name in ("docs", "plain"):
        assert f'tandem_collection_ready{{collection="{name}"}} 1.0' in scraped
        assert f'tandem_collection_documents{{collection="{name}"}} {float(len(DOCS))}' in scraped


def test_search_without_a_default_collection_is_a_404_naming_the_rule(two: LiveServer) -> None:
    response = two.client.post("/search", json={"query": "tides"}, headers=_auth("ops"))
    assert response.status_code == 404
    assert "/collections/{name}/search" in response.json()["message"]


def test_a_collection_the_key_may_not_see_is_a_404_like_one_that_is_not_served(two: LiveServer) -> None:
    hidden = two.client.post("/collections/plain/search", json={"query": "tides"}, headers=_auth("acme"))
    missing = two.client.post("/collections/nope/search", json={"query": "tides"}, headers=_auth("acme"))
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"] == missing.json()["error"] == "not_found"
    assert two.client.get("/collections/plain", headers=_auth("acme")).status_code == 404
    names = [c["name"] for c in two.client.get("/collections", headers=_auth("acme")).json()["collections"]]
    assert names == ["docs"]
    # the legacy key opens everything, as before scoped keys
    legacy = two.client.post("/collections/plain/search", json={"query": "tides"}, headers=_auth(LEGACY))
    assert legacy.status_code == 200


def test_embeddings_are_allowed_per_key_and_model_names_a_collection(two: LiveServer) -> None:
    body = {"input": "how do tides work", "model": "docs"}
    assert two.client.post("/v1/embeddings", json=body, headers=_auth("acme")).status_code == 403
    assert two.client.post("/v1/embeddings", json=body, headers=_auth("globex")).status_code == 200
    plain = {**body, "model": "plain"}
    assert two.client.post("/v1/embeddings", json=plain, headers=_auth("globex")).status_code == 404
    assert two.client.post("/v1/embeddings", json=plain, headers=_auth("ops")).status_code == 200


def test_each_tenant_finds_its_own_documents(two: LiveServer) -> None:
    for tenant in TENANTS:
        response = two.client.post("/collections/docs/search", json={"query": "a", "mode": "dense", "top_k": 20},
                                   headers=_auth(tenant))
        ids = [h["id"] for h in response.json()["results"]]
        assert sorted(ids) == sorted(d for d, t in TENANT_OF.items() if t == tenant)


_FIELDS = ("tenant", "year")
_conditions = st.one_of(
    st.builds(lambda t: {"field": "tenant", "eq": t}, st.sampled_from(TENANTS)),
    st.builds(lambda ts: {"field": "tenant", "in": ts}, st.lists(st.sampled_from(TENANTS), min_size=1, max_size=2)),
    st.builds(lambda b: {"field": "tenant", "exists": b}, st.booleans()),
    st.builds(lambda y: {"field": "year", "gte": y}, st.integers(1990, 2030)),
    st.builds(lambda y: {"field": "year", "lt": y}, st.integers(1990, 2030)),
    st.just({"field": "missing", "eq": 1}),  # an unknown field: a 422, never a wider search
)
_filters = st.recursive(_conditions, lambda inner: st.one_of(
    st.builds(lambda xs: {"or": xs}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda xs: {"and": xs}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda x: {"not": x}, inner),
), max_leaves=6)
_bodies = st.fixed_dictionaries(
    {"query": st.sampled_from(["tides", "ocean tides and the moon", "python json parse", "a", "the bread oven"])},
    optional={
        "mode": st.sampled_from(["dense", "lexical", "hybrid"]),
        "filter": _filters,
        "offset": st.integers(0, 25),
        "top_k": st.integers(1, 30),
        "fields": st.lists(st.sampled_from(["id", "score", "title", "text", "metadata"]), min_size=1, max_size=5,
                           unique=True),
        "fusion": st.sampled_from(["rrf", "convex"]),
        "min_score": st.floats(-1.0, 1.0),
    },
)
SENT = {"requests": 0, "hits": 0, "leaks": 0}


@settings(max_examples=LEAK_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(tenant=st.sampled_from(TENANTS), body=_bodies)
def test_a_tenant_key_never_receives_another_tenants_document(two: LiveServer, tenant: str,
                                                             body: dict[str, Any]) -> None:
    if body.get("mode") != "hybrid":
        body.pop("fusion", None)
    response = two.client.post("/collections/docs/search", json=body, headers=_auth(tenant))
    SENT["requests"] += 1
    assert response.status_code in (200, 422), response.text
    if response.status_code == 422:
        assert "missing" in json.dumps(body) or "fusion" in body, response.text
        return
    hits = response.json()["results"]
    ids = _ids(hits)
    SENT["hits"] += len(hits)
    leaked = [d for d in ids if d is not None and TENANT_OF[d] != tenant]
    SENT["leaks"] += len(leaked)
    assert not leaked, (body, leaked)
    assert len(hits) <= sum(1 for t in TENANT_OF.values() if t == tenant)  # score-only hits are bounded too


def test_the_property_ran_its_examples() -> None:
    print(f"leak property: {SENT['requests']} requests, {SENT['hits']} hits, {SENT['leaks']} leaks")
    assert SENT["leaks"] == 0


def test_a_key_whose_filter_names_a_field_the_collection_lacks_is_refused_by_id(
        tenant_bundle: Path, mini_bundle: Path, mini_student: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(_key_file('\n[[key]]\nid = "wrong-scope"\nkey = "wrong-scope-key-0123"\ncollections = ["plain"]\n'
                              'filter = {field = "tenant", eq = "acme"}\n'))
    specs = (CollectionSpec(name="docs", index=tenant_bundle, student=mini_student),
             CollectionSpec(name="plain", index=mini_bundle, student=mini_student))
    app = create_app(ServiceSettings(index=tenant_bundle, student=mini_student, collections=specs, keys_file=keys))
    refused = app.state.keys.current.refused
    assert len(refused) == 1 and "'wrong-scope'" in refused[0] and "'tenant'" in refused[0]
    assert "wrong-scope-key-0123" not in refused[0]
    with serve_app(app) as server:
        response = server.client.post("/collections/plain/search", json={"query": "tides"},
                                      headers=_auth("wrong-scope-key-0123"))
        assert response.status_code == 403


MALFORMED = [  # (key file, the line its error names)
    ('[[key]]\nid = "a"\nkey = "aaaaaaaaaaaa"\ncollections = ["*"]\n\n[[key]]\nid = "b"\nkey = "bbbbbbbbbbbb"\n', 6),
    ('[[key]]\nid = "a"\nkey = "aaaaaaaaaaaa"\ncollections = ["*"]\nfilter = {field = "t" eq = 1}\n', 5),
    ('[[key]]\nid = "a"\nkey = "aaaaaaaaaaaa"\ncollections = ["*"\n', 4),
]


@pytest.mark.parametrize(("text", "line"), MALFORMED)
def test_a_malformed_key_file_is_refused_naming_the_line(mini_bundle: Path, mini_student: Path, tmp_path: Path,
                                                         text: str, line: int) -> None:
    """The service refuses each file at start, naming its line and never a key (the error `tandem serve` prints)."""
    keys = tmp_path / "keys.toml"
    keys.write_text(text)
    with pytest.raises(InputError) as refused:
        create_app(ServiceSettings(index=mini_bundle, student=mini_student, keys_file=keys))
    assert f"line {line}" in str(refused.value)
    assert "aaaaaaaaaaaa" not in str(refused.value) and "bbbbbbbbbbbb" not in str(refused.value)


def test_tandem_serve_refuses_a_malformed_key_file_naming_the_line(mini_bundle: Path, mini_student: Path,
                                                                   tmp_path: Path) -> None:
    """The real entry point, once (the refusal is the same code for every file above): exits non-zero, prints the
    line, not the key."""
    text, line = MALFORMED[0]
    keys = tmp_path / "keys.toml"
    keys.write_text(text)
    env = {**os.environ, "TANDEM_KEYS_FILE": str(keys), "TANDEM_PORT": "0"}
    done = service_fast.run(["serve", "--index", str(mini_bundle), "--student", str(mini_student)], env=env)
    assert done.returncode != 0
    assert f"line {line}" in done.stderr + done.stdout, done.stderr[-2000:]
    assert "bbbbbbbbbbbb" not in done.stderr + done.stdout


def test_keys_rotate_under_load_with_no_failed_request(two: LiveServer, keys_path: Path) -> None:
    """A steady client with a key in every version of the file; the file is rewritten atomically (a new key added,
    then removed) while it searches: every request answers 200, and the new key works only while it is there."""
    source = _app_of(two).state.keys
    statuses: list[int] = []
    stop, answered = threading.Event(), threading.Event()

    def steady() -> None:
        with local_client(two.url, timeout=30.0) as client:
            for _ in range(2000):
                if stop.is_set():
                    break
                response = client.post("/collections/docs/search", json={"query": "tides", "top_k": 3},
                                       headers=_auth("globex"))
                statuses.append(response.status_code)
                answered.set()

    thread = threading.Thread(target=steady)
    thread.start()
    new = "new-key-0123456789"
    try:
        # the rotations start once the steady client searches (on a loaded machine its first answer may otherwise
        # come after the last rotation, and the test would check nothing)
        assert answered.wait(timeout=60), "the steady client never got an answer"
        for round_ in range(6):
            extra = f'\n[[key]]\nid = "new"\nkey = "{new}"\ncollections = ["plain"]\n' if round_ % 2 == 0 else ""
            before = source.reloads
            tmp = keys_path.with_suffix(".tmp")
            tmp.write_text(_key_file(extra))
            os.replace(tmp, keys_path)  # atomic: a reader sees the old file or the new one
            _until(lambda b=before: source.reloads > b)  # type: ignore[misc]
            status = two.client.post("/collections/plain/search", json={"query": "tides"},
                                     headers=_auth(new)).status_code
            assert status == (200 if round_ % 2 == 0 else 403)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}


def _app_of(server: LiveServer) -> Any:
    """The FastAPI app the server runs (serve_app hands it to uvicorn's config)."""
    return server.server.config.app


def _until(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the key file was not reloaded"
        time.sleep(0.02)
