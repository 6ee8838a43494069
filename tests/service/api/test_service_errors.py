"""Failures inside the service: a bundle that cannot load, and an unexpected exception."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from fastapi import FastAPI

from models.bundle.manifest import BUNDLE_MANIFEST
from models.bundle.vectors.index import INDEX_FILE
from models.hashing import sha256_file
from service.http.app import create_app
from service.http.exception_handlers import install_error_handlers
from service.settings import ServiceSettings
from tests.fixtures.server import READY_TIMEOUT_S, serve_app


def test_unloadable_bundle_is_reported_not_served(mini_bundle: Path, mini_student: Path, tmp_path: Path) -> None:
    broken = tmp_path / "bundle"
    shutil.copytree(mini_bundle, broken)
    (broken / INDEX_FILE).write_bytes(b"not a faiss index")
    manifest = json.loads((broken / BUNDLE_MANIFEST).read_text())  # vouched for: only the FAISS load can tell
    manifest["files"][INDEX_FILE] = sha256_file(broken / INDEX_FILE)
    (broken / BUNDLE_MANIFEST).write_text(json.dumps(manifest))
    app = create_app(ServiceSettings(index=broken, student=mini_student))
    with serve_app(app, wait_ready=False) as server:
        deadline = time.monotonic() + READY_TIMEOUT_S
        ready = server.client.get("/readyz")
        while ready.json()["status"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
            ready = server.client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["status"] == "failed"
        assert "unreadable index files" in ready.json()["error"]
        assert server.client.get("/healthz").status_code == 200
        search = server.client.post("/search", json={"query": "tides"})
        assert search.status_code == 503
        assert search.json()["error"] == "not_ready"
        assert "failed to load" in search.json()["message"]
        assert server.client.post("/search", json={"query": " "}).status_code == 422


def test_unexpected_exception_is_a_generic_500() -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internal detail")

    with serve_app(app, wait_ready=False) as server:
        response = server.client.get("/boom")
    assert response.status_code == 500
    assert response.json() == {"error": "internal", "message": "internal server error"}
    assert "secret" not in response.text
