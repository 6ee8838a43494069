"""Hot reload end to end: real uvicorn, real bundles under a versioned root, real ONNX student, driven by httpx."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from models.bundle.manifest import BUNDLE_MANIFEST
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import set_current
from models.encoders.student import read_student_manifest
from models.hashing import sha256_file
from service.core.loader import SearcherLoader, check_compatible
from service.core.reload import Reloader
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.corpus import PROBES
from tests.fixtures.server import LiveServer, local_client, serve_app
from tests.fixtures.tiny_service import V2_DROPPED, V2_MARK

TOKEN = "test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEADLINE_S = 60.0


@pytest.fixture
def root(mini_v1_v2_root: Path) -> Path:
    """A bundle root with versions v1 (the mini bundle) and v2; CURRENT names v1. The tiny models: these tests check
    which version answers (v2 marks its titles and drops a document), never relevance."""
    return mini_v1_v2_root


@contextmanager
def serving(index: Path, student: Path, **settings: Any) -> Iterator[LiveServer]:
    values: dict[str, Any] = {"admin_token": TOKEN, "watch_interval_s": 0, **settings}
    with serve_app(create_app(ServiceSettings(index=index, student=student, port=0, **values))) as server:
        yield server


def search(server: LiveServer, query: str = "how do I make a loaf of bread rise") -> dict[str, Any]:
    response = server.client.post("/search", json={"query": query, "top_k": 3})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def version(server: LiveServer) -> str:
    return str(search(server)["index"]["version"])


def admin_status(server: LiveServer) -> dict[str, Any]:
    response = server.client.get("/admin/status", headers=AUTH)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def reload(server: LiveServer, path: Path | None = None) -> httpx.Response:
    body = {"path": str(path)} if path is not None else None
    return server.client.post("/admin/reload", json=body, headers=AUTH)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {DEADLINE_S:g} s: {what}")


# --- corrupted copies of a valid bundle -----------------------------------------------------------------

def flip_bytes(bundle: Path) -> str:
    path = bundle / "index.faiss"
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return "checksum mismatch"


def other_teacher(bundle: Path) -> str:
    manifest = json.loads((bundle / BUNDLE_MANIFEST).read_text())
    manifest["teacher"]["fingerprint"] = "0" * 64
    (bundle / BUNDLE_MANIFEST).write_text(json.dumps(manifest))
    return "fingerprint"


def unreadable_index(bundle: Path) -> str:
    """Garbage that the manifest's checksum vouches for: only the FAISS load can catch it."""
    (bundle / "index.faiss").write_bytes(b"not a faiss index" * 64)
    manifest = json.loads((bundle / BUNDLE_MANIFEST).read_text())
    manifest["files"]["index.faiss"] = sha256_file(bundle / "index.faiss")
    (bundle / BUNDLE_MANIFEST).write_text(json.dumps(manifest))
    return "unreadable index files"


def missing_docstore(bundle: Path) -> str:
    (bundle / "docs.sqlite").unlink()
    return "missing docs.sqlite"


CORRUPTIONS: dict[str, Callable[[Path], str]] = {
    "checksum": flip_bytes, "teacher": other_teacher, "unreadable": unreadable_index, "missing": missing_docstore,
}


# --- tests ------------------------------------------------------------------------------------------------

def test_serve_accepts_a_bundle_root(root: Path, mini_student: Path) -> None:
    bundle, _ = check_compatible(ServiceSettings(index=root, student=mini_student))
    assert bundle == read_bundle_manifest(root / "v1")


def test_search_names_the_version_in_service(root: Path, mini_student: Path) -> None:
    with serving(root, mini_student) as server:
        index = search(server)["index"]
        student = admin_status(server)["student"]
    assert index["version"] == "v1"
    assert index["build_time"] == read_bundle_manifest(root / "v1").build_time
    # /admin/status shows the student in service and what it was distilled from
    assert (student["path"], student["precision"]) == (str(mini_student.resolve()), "int8")
    trained_on = read_student_manifest(mini_student).trained_on
    assert trained_on is not None and student["trained_on"] == trained_on.model_dump(mode="json")
    assert student["trained_on"]["corpus_sha256"] == read_bundle_manifest(root / "v1").corpus.sha256


def test_reload_swaps_in_a_new_bundle(root: Path, mini_student: Path) -> None:
    with serving(root, mini_student) as server:
        assert not search(server)["results"][0]["title"].startswith(V2_MARK)  # v1's answer
        response = reload(server, root / "v2")
        assert response.status_code == 200, response.text
        outcome = response.json()
        assert (outcome["outcome"], outcome["current"]["version"], outcome["previous"]["version"]) == ("ok", "v2", "v1")
        answer = search(server)
        assert answer["index"]["version"] == "v2"
        assert answer["index"]["count"] == 19
        assert answer["results"][0]["title"].startswith(V2_MARK)
        assert V2_DROPPED not in [hit["id"] for hit in search(server, "Sicilian defence chess opening")["results"]]
        status = admin_status(server)
    assert status["current"]["version"] == "v2"
    assert [v["version"] for v in status["history"]] == ["v1"]
    assert status["last_reload"]["outcome"] == "ok"


def test_reload_without_a_body_follows_current(root: Path, mini_student: Path) -> None:
    with serving(root, mini_student) as server:
        set_current(root, "v2")  # the watcher is off here: only the explicit reload picks it up
        assert version(server) == "v1"
        response = reload(server)
        assert response.status_code == 200, response.text
        assert version(server) == "v2"


def test_reload_without_a_path_needs_a_bundle_root(mini_bundle: Path, mini_student: Path, tmp_path: Path) -> None:
    with serving(mini_bundle, mini_student) as server:
        response = reload(server)
        assert response.status_code == 422
        assert "not started on a bundle root" in response.json()["message"]
        response = reload(server, mini_bundle.parent / "nowhere")
        assert response.status_code == 422
        assert "not a directory" in response.json()["message"]
        for body in ({"path": 3}, {"path": ""}, {"path": "x" * 5000}, {"path": "x" * 300},
                     {"path": "a\u0000b"}, {"other": 1}, [1]):
            response = server.client.post("/admin/reload", json=body, headers=AUTH)
            assert response.status_code == 422, (body, response.text)


def test_invalid_bundle_is_refused_and_the_old_one_keeps_serving(root: Path, mini_student: Path) -> None:
    """Each corruption in a copy of v2 of its own, refused in turn by one server: a refusal changes nothing, so
    v1 answers after each as it did before the first."""
    bad = {case: root / f"v3-{case}" for case in sorted(CORRUPTIONS)}
    reasons = {}
    for case, path in bad.items():
        shutil.copytree(root / "v2", path)
        reasons[case] = CORRUPTIONS[case](path)
    with serving(root, mini_student) as server:
        before = search(server)
        for case, path in bad.items():
            response = reload(server, path)
            assert response.status_code == 409, (case, response.text)
            body = response.json()
            assert body["error"] == "reload_rejected", case
            assert reasons[case] in body["message"], case
            assert "still serving v1" in body["message"], case
            assert version(server) == "v1", case
            assert search(server)["results"] == before["results"], case  # v1's answer, as before the refusal
            last = admin_status(server)["last_reload"]
            assert (last["outcome"], last["current"]["version"]) == ("rejected", "v1"), case
            assert reasons[case] in last["error"], case


UNAUTHORIZED: list[tuple[dict[str, str], int]] = [
    ({}, 401), ({"Authorization": "Bearer wrong-token"}, 403), ({"Authorization": f"Basic {TOKEN}"}, 401),
    ({"Authorization": "Bearer"}, 401)]


def test_admin_routes_need_the_token(root: Path, mini_student: Path) -> None:
    """Every refused header on one server: a refusal changes nothing (the version served stays v1 after each)."""
    with serving(root, mini_student) as server:
        for headers, status in UNAUTHORIZED:
            for method, route in [("GET", "/admin/status"), ("POST", "/admin/reload"), ("POST", "/admin/rollback")]:
                response = server.client.request(method, route, headers=headers)
                assert response.status_code == status, (headers, route, response.text)
            assert version(server) == "v1", headers


def test_admin_is_disabled_without_a_token(root: Path, mini_student: Path) -> None:
    with serving(root, mini_student, admin_token=None) as server:
        response = server.client.post("/admin/reload", json={"path": str(root / "v2")}, headers=AUTH)
        assert response.status_code == 403
        assert "disabled" in response.json()["message"]
        assert version(server) == "v1"


def test_reload_outlasting_the_wait_answers_202_then_completes(root: Path, mini_student: Path) -> None:
    with serving(root, mini_student, reload_wait_s=1e-9) as server:
        response = reload(server, root / "v2")
        assert response.status_code == 202, response.text
        assert "GET /admin/status" in response.json()["message"]
        wait_for(lambda: (admin_status(server)["last_reload"] or {}).get("outcome") == "ok", "the reload completes")
        assert version(server) == "v2"
        assert admin_status(server)["reloads_pending"] == 0


def test_rollback_restores_the_previous_version(root: Path, mini_student: Path) -> None:
    with serving(root, mini_student) as server:
        before = search(server)
        assert reload(server, root / "v2").status_code == 200
        assert version(server) == "v2"
        assert search(server)["results"] != before["results"]  # v2 answers otherwise (its titles are marked)
        response = server.client.post("/admin/rollback", headers=AUTH)
        assert response.status_code == 200, response.text
        assert (response.json()["current"]["version"], response.json()["previous"]["version"]) == ("v1", "v2")
        assert version(server) == "v1"
        assert search(server)["results"] == before["results"]  # v1's answer again
        assert admin_status(server)["history"] == []
        response = server.client.post("/admin/rollback", headers=AUTH)
        assert response.status_code == 409
        assert "no previous version" in response.json()["message"]
        assert version(server) == "v1"


def test_history_keeps_at_most_keep_versions(root: Path, mini_student: Path) -> None:
    with serving(root, mini_student, keep_versions=1) as server:
        for target in ("v2", "v1", "v2"):
            assert reload(server, root / target).status_code == 200
        status = admin_status(server)
        assert status["current"]["version"] == "v2"
        assert [v["version"] for v in status["history"]] == ["v1"]
        assert server.client.post("/admin/rollback", headers=AUTH).status_code == 200
        assert version(server) == "v1"


def test_watcher_follows_the_current_pointer(root: Path, mini_student: Path) -> None:
    bad = root / "v3-bad"
    shutil.copytree(root / "v2", bad)
    flip_bytes(bad)
    with serving(root, mini_student, watch_interval_s=0.05) as server:
        assert version(server) == "v1"
        set_current(root, "v2")
        wait_for(lambda: version(server) == "v2", "the watcher reloads v2 after CURRENT names it")
        set_current(root, "v3-bad")
        wait_for(lambda: (admin_status(server)["last_reload"] or {}).get("path") == str(bad),
                 "the watcher tries v3-bad after CURRENT names it")
        last = admin_status(server)["last_reload"]
        assert (last["trigger"], last["outcome"]) == ("watch", "rejected")
        assert "checksum mismatch" in last["error"]
        assert version(server) == "v2"


def test_requests_in_flight_during_reloads_all_succeed(root: Path, mini_student: Path) -> None:
    """Searches keep flowing while the bundle is swapped back and forth: no error, and only real versions."""
    with serving(root, mini_student, keep_versions=0) as server:
        stop = threading.Event()
        seen: list[tuple[int, str]] = []

        def hammer() -> None:
            with local_client(server.url, timeout=30.0) as client:
                while not stop.is_set():
                    for query in PROBES:
                        response = client.post("/search", json={"query": query, "top_k": 5})
                        version = response.json().get("index", {}).get("version", "") if response.is_success else ""
                        seen.append((response.status_code, version))

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for thread in threads:
            thread.start()
        try:
            for target in ("v2", "v1", "v2", "v1"):
                wait_for(lambda: len(seen) > 0, "searches are flowing")
                assert reload(server, root / target).status_code == 200
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
    assert seen
    assert {status for status, _ in seen} == {200}
    assert {v for _, v in seen} <= {"v1", "v2"}


def test_a_swapped_out_searcher_closes_only_after_its_requests(root: Path, mini_student: Path) -> None:
    """The drain guarantee, on the engine itself: a leased searcher stays usable after the swap, then closes."""
    settings = ServiceSettings(index=root, student=mini_student, keep_versions=0, watch_interval_s=0)
    loader = SearcherLoader(settings)
    reloader = Reloader(settings, loader)
    loader.start()
    try:
        wait_for(lambda: loader.state[0].value == "ready", "the initial load")
        with loader.lease() as old:
            outcome = reloader.reload(root / "v2").result(timeout=DEADLINE_S)
            assert outcome.outcome == "ok"
            assert loader.searcher().version == "v2"
            hits = old.batcher.submit(["tides"], 1, timeout_s=30.0).result(timeout=DEADLINE_S)  # still open
            assert hits.hits[0]

        def closed() -> bool:
            try:
                old.batcher.submit(["tides"], 1, timeout_s=30.0).result(timeout=DEADLINE_S)
            except RuntimeError:
                return True
            return False

        wait_for(closed, "the old searcher closes once its lease ends")
    finally:
        reloader.close()
        loader.close()
