"""Schemathesis against the live service's own OpenAPI document, for valid (positive) and invalid
(negative) inputs: no 5xx, only documented statuses and content types, responses that match the
schema declared for their status, and schema-invalid requests refused. Bounded (examples per
operation, no deadline, derandomized) to stay well under a minute and never flake.

Not checked: positive_data_acceptance, because schemathesis 4 merges the request's `oneOf` into
the base schema loosely and generates e.g. a negative top_k as "valid".

Driven through `APIOperation.as_strategy` rather than schemathesis' pytest plugin, whose lazy
fixture loader (`from_fixture`) does not run under pytest 9.

Every case goes to two services: the open one, and one with API keys and the admin token configured,
sending the right credential on every call, so the protected routes (/search behind its key, /admin/*
behind the admin token) are fuzzed past authentication and not only into a 401/403.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.bundle.lexical.postings import Lexical
from models.bundle.version import Bundle
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.server import LiveServer, serve_app

if TYPE_CHECKING:
    import schemathesis
    from schemathesis import APIOperation
    from schemathesis.checks import CheckFunction

pytestmark = pytest.mark.slow


MAX_EXAMPLES = 50  # per operation and generation mode


def _checks() -> list[CheckFunction]:
    from schemathesis.checks import (
        content_type_conformance,
        negative_data_rejection,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    return [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
            negative_data_rejection]


@pytest.fixture(scope="module")
def http_session() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.trust_env = False  # straight to 127.0.0.1, whatever proxies the environment names
        yield session


API_KEY = "fuzz-api-key-0123456789"
ADMIN_TOKEN = "fuzz-admin-token-0123456789"


@pytest.fixture(scope="module")
def protected_server(mini_bundle: Path, mini_student: Path) -> Iterator[LiveServer]:
    settings = ServiceSettings(index=mini_bundle, student=mini_student, api_keys=API_KEY, admin_token=ADMIN_TOKEN,
                               watch_interval_s=0)
    with serve_app(create_app(settings)) as server:
        yield server


@dataclass(frozen=True)
class _Schemas:
    """Each service's own document, read once for the module: the open one's operations generate the cases, and the
    protected one's (the same operations, with the bearer scheme and its 401/403) judge its answers."""

    operations: list[APIOperation]
    protected: dict[str, APIOperation]


def _key(operation: APIOperation) -> str:
    return f"{operation.method.upper()} {operation.path}"


def _operations(server: LiveServer) -> list[APIOperation]:
    """Every operation of the service's own document (each must be readable: an invalid one fails here)."""
    import schemathesis
    from schemathesis.core.result import Ok

    operations = []
    for result in schemathesis.openapi.from_url(f"{server.url}/openapi.json").get_all_operations():
        assert isinstance(result, Ok), result
        operations.append(result.ok())
    return operations


@pytest.fixture(scope="module")
def schemas(mini_server: LiveServer, protected_server: LiveServer) -> _Schemas:
    operations = _operations(mini_server)
    protected = {_key(op): op for op in _operations(protected_server)}
    assert {_key(op) for op in operations} >= {"POST /search", "GET /healthz", "GET /readyz"}
    assert set(protected) == {_key(op) for op in operations}  # the same API, behind keys
    return _Schemas(operations, protected)


def _credentials(path: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN if path.startswith('/admin/') else API_KEY}"}


@pytest.mark.parametrize("mode", ["positive", "negative"])  # schemathesis' GenerationMode, by value
def test_api_conforms_to_its_schema(mini_server: LiveServer, protected_server: LiveServer, schemas: _Schemas,
                                    http_session: requests.Session, mode: str) -> None:
    """Each case is sent to both services: as drawn to the open one, and with the right credential to the protected
    one, judged by the protected document. Both used to draw the same derandomized cases each for itself: drawing
    them is most of the cost (schemathesis' negative bodies above all), the requests little."""
    from schemathesis import GenerationMode

    generation = GenerationMode(mode)
    checks = _checks()
    statuses: list[tuple[str, int]] = []

    @given(case=st.one_of(*(op.as_strategy(generation_mode=generation) for op in schemas.operations)))
    @settings(max_examples=MAX_EXAMPLES * len(schemas.operations), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def fuzz(case: schemathesis.Case) -> None:
        case.call_and_validate(base_url=mini_server.url, session=http_session, checks=checks)
        behind = schemas.protected[_key(case.operation)].Case(
            method=case.method, path_parameters=case.path_parameters, headers=case.headers, cookies=case.cookies,
            query=case.query, body=case.body, media_type=case.media_type, _meta=case._meta)
        response = behind.call_and_validate(base_url=protected_server.url, session=http_session, checks=checks,
                                            headers=_credentials(case.path))
        statuses.append((case.path, response.status_code))

    fuzz()
    if generation is GenerationMode.POSITIVE:  # past authentication: answers other than 401/403
        for path in ("/search", "/admin/reload", "/admin/status"):
            assert any(p == path and s not in (401, 403) for p, s in statuses), path


# Hostile request bodies (issue 42): hypothesis draws /search bodies whose filters and options hold what a careless
# or hostile client sends (non-finite numbers, 1e999, lone surrogates, integers past 64 bits, nesting past every
# cap, in lists past theirs, offsets past the hits bound, repeated and many query words), against the real
# server over the metadata bundle. None may answer 5xx, and each request's work stays within its caps, counted:
# postings scored (at most the distinct-stem cap times the postings of the query's stems), filter values looked
# up (at most the per-filter cap), and no docstore scan (every field of that bundle is typed).
HUGE = "@@1e999@@"  # rendered as the JSON number 1e999, which Python's json reads as infinity
_SCALARS = st.one_of(st.integers(-3, 2030), st.integers(2**63 - 2, 2**64), st.floats(allow_nan=True),
                     st.just(HUGE), st.sampled_from(["food", "earth", "2020-01-15", "\ud800", "a\udfffb", ""]),
                     st.booleans(), st.none())
_FIELDS = st.sampled_from(["year", "topic", "published", "open", "doi", "source", "nope", "\ud800"])
_OPS = st.sampled_from(["eq", "gt", "gte", "lt", "lte", "exists", "like"])
_LEAVES = st.one_of(
    st.builds(lambda f, op, v: {"field": f, op: v}, _FIELDS, _OPS, _SCALARS),
    st.builds(lambda f, v, n: {"field": f, "in": [v] * n}, _FIELDS, _SCALARS, st.sampled_from([0, 1, 1024, 1025])),
    st.builds(lambda f, vs: {"field": f, "in": vs}, _FIELDS, st.lists(_SCALARS, max_size=8)),
)
_FILTERS = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.builds(lambda xs: {"and": xs}, st.lists(inner, max_size=4)),
    st.builds(lambda xs: {"or": xs}, st.lists(inner, max_size=4)),
    st.builds(lambda x: {"not": x}, inner),
    st.builds(lambda x, n: _nested(x, n), inner, st.sampled_from([15, 17, 40, 5000])),
), max_leaves=8)
_WORDS = st.sampled_from(["blood", "moon", "tide", "the", "zqa", "\ud800", "1e999", "[{"])
_BODIES = st.fixed_dictionaries({"query": st.lists(_WORDS, min_size=1, max_size=340).map(" ".join)}, optional={
    "filter": _FILTERS, "mode": st.sampled_from(["dense", "lexical", "hybrid"]),
    "top_k": st.one_of(st.integers(-1, 1001), st.just(HUGE)), "offset": st.integers(-1, 10_001),
    "min_score": _SCALARS, "alpha": _SCALARS, "fields": st.just(["id", "score", "metadata"]),
})


@dataclass(frozen=True)
class _Nested:
    """`inner` under `levels` nots, written out only as text: neither hypothesis's printer nor json.dumps could
    recurse through thousands of levels, which is the point of sending them."""

    levels: int
    inner: object


def _nested(inner: object, levels: int) -> _Nested:
    return _Nested(levels, inner)


def _render(body: object) -> str:
    """JSON as a client may send it: NaN and Infinity as Python writes them, lone surrogates escaped, 1e999."""
    pieces: dict[str, str] = {}

    def nest(obj: object) -> str:
        if not isinstance(obj, _Nested):
            raise TypeError(obj)
        key = f"@@nest{len(pieces)}@@"
        pieces[key] = '{"not": ' * obj.levels + _render(obj.inner) + "}" * obj.levels
        return key

    text = json.dumps(body, default=nest)
    for key, piece in pieces.items():
        text = text.replace(f'"{key}"', piece)
    return text.replace(f'"{HUGE}"', "1e999")


@pytest.fixture(scope="module")
def meta_app_server(mini_meta_bundle: Path, mini_student: Path) -> Iterator[tuple[LiveServer, Bundle]]:
    app = create_app(ServiceSettings(index=mini_meta_bundle, student=mini_student, watch_interval_s=0))
    with serve_app(app) as server:
        yield server, app.state.loader.searcher().bundle


def test_hostile_search_bodies_never_cost_a_5xx_nor_unbounded_work(meta_app_server: tuple[LiveServer, Bundle]) -> None:
    server, bundle = meta_app_server
    lexical = bundle.require_lexical()
    assert isinstance(lexical, Lexical)
    max_values = ServiceSettings.model_fields["max_filter_values"].default  # the server runs with the defaults
    statuses: list[int] = []

    @given(body=_BODIES)
    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def fuzz(body: dict[str, object]) -> None:
        scored, looked_up = lexical.postings_scored, _looked_up(bundle)
        scans = [s.docs.scans for s in bundle.segments]
        response = server.client.post("/search", content=_render(body), headers={"content-type": "application/json"})
        statuses.append(response.status_code)
        assert response.status_code in (200, 422), (response.status_code, response.text[:300])
        assert response.headers["content-type"] == "application/json"
        lexical_ran = response.status_code == 200 and body.get("mode", "dense") != "dense"
        stems = lexical.analyzer.terms(str(body["query"])) if lexical_ran else {}
        # at most each distinct stem's postings once per segment (pruning and filters read fewer), however often
        # the query repeats it; nothing on a 422
        assert lexical.postings_scored - scored <= sum(len(p.index.postings(s)[0]) for p in lexical.parts
                                                       for s in stems)
        assert _looked_up(bundle) - looked_up <= (max_values if response.status_code == 200 else 0) * len(
            bundle.segments)
        assert [s.docs.scans for s in bundle.segments] == scans

    fuzz()
    assert {200, 422} <= set(statuses)  # both answers were reached


def _looked_up(bundle: Bundle) -> int:
    return sum(s.payload.values_looked_up for s in bundle.segments if s.payload is not None)
