"""Schemathesis against the live service's own OpenAPI document, for valid (positive) and invalid
(negative) inputs: no 5xx, only documented statuses and content types, responses that match the
schema declared for their status, and schema-invalid requests refused. Bounded (examples per
operation, no deadline, derandomized) to stay well under a minute and never flake.

Not checked: positive_data_acceptance, because schemathesis 4 merges the request's `oneOf` into
the base schema loosely and generates e.g. a negative top_k as "valid".

Driven through `APIOperation.as_strategy` rather than schemathesis' pytest plugin, whose lazy
fixture loader (`from_fixture`) does not run under pytest 9.

Run twice: against the open service, and against one with API keys and the admin token configured,
sending the right credential on every call, so the protected routes (/search behind its key, /admin/*
behind the admin token) are fuzzed past authentication and not only into a 401/403.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.server import LiveServer, serve_app

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 50  # per operation and generation mode
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]


@pytest.fixture(scope="module")
def http_session() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.trust_env = False  # straight to 127.0.0.1, whatever proxies the environment names
        yield session


API_KEY = "fuzz-api-key-0123456789"
ADMIN_TOKEN = "fuzz-admin-token-0123456789"


@pytest.fixture(scope="module")
def protected_server(tiny_bundle: Path, tiny_student: Path) -> Iterator[LiveServer]:
    settings = ServiceSettings(index=tiny_bundle, student=tiny_student, api_keys=API_KEY, admin_token=ADMIN_TOKEN,
                               watch_interval_s=0)
    with serve_app(create_app(settings)) as server:
        yield server


def _credentials(path: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN if path.startswith('/admin/') else API_KEY}"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_api_conforms_to_its_schema(live_server: LiveServer, http_session: requests.Session,
                                    mode: GenerationMode) -> None:
    _fuzz(live_server, http_session, mode, authenticated=False)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_protected_api_conforms_to_its_schema(protected_server: LiveServer, http_session: requests.Session,
                                              mode: GenerationMode) -> None:
    _fuzz(protected_server, http_session, mode, authenticated=True)


def _fuzz(live_server: LiveServer, http_session: requests.Session, mode: GenerationMode,
          authenticated: bool) -> None:
    schema = schemathesis.openapi.from_url(f"{live_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {"POST /search", "GET /healthz", "GET /readyz"}
    statuses: list[tuple[str, int]] = []

    @given(case=st.one_of(*(op.as_strategy(generation_mode=mode) for op in operations)))
    @settings(max_examples=MAX_EXAMPLES * len(operations), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def fuzz(case: schemathesis.Case) -> None:
        headers = _credentials(case.path) if authenticated else None
        response = case.call_and_validate(base_url=live_server.url, session=http_session, checks=CHECKS,
                                          headers=headers)
        statuses.append((case.path, response.status_code))

    fuzz()
    if authenticated and mode is GenerationMode.POSITIVE:  # past authentication: answers other than 401/403
        for path in ("/search", "/admin/reload", "/admin/status"):
            assert any(p == path and s not in (401, 403) for p, s in statuses), path
