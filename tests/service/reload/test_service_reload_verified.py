"""Reloads trust only what was verified (issue 42, item 5), with a real server: v1 served, v2 published by
`index update` (its first segment and space files hard links to v1's), then v2's files changed in place.

A shared file changed in place is refused on reload, naming it, while v1 keeps answering; the space files are
hashed on every reload even when the change restores size and mtime; the one thing identity cannot see (a write
in place that restores size and mtime of a segment file) is served from what was verified and loaded before, and
`tandem index verify` names it (docs/operations.md#verification). A corrupted bundle never becomes ready.

On the tiny models (tests/fixtures/tiny_service.py): "the old version keeps answering" is checked against its own
answers before the change, not against relevance."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from indexer.build import BuildRequest, build
from indexer.rootlock import current_name
from indexer.verify import verify
from indexer.versions.request import UpdateRequest
from indexer.versions.update import update
from models.bundle.vectors.index import INDEX_FILE
from models.bundle.vectors.rotation import ROTATION_FILE
from models.bundle.vectors.space import CALIBRATION_FILE
from models.bundle.versions import set_current
from models.errors import ContractMismatch
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.corpus import PROBES
from tests.fixtures.server import READY_TIMEOUT_S, LiveServer, serve_app
from tests.fixtures.tiny_service import MINI_DIM
from tests.service.reload.test_service_reload import reload, search, serving

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def published(mini_bundle: Path, mini_teacher: Path, tiny_corpus: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding v1 (int8 with a PCA rotation, so it has space files: calibration, rotation; built from the
    teacher vectors mini_bundle's build cached) and v2, published by `index update` (its first segment and space
    files hard links to v1's), with CURRENT put back to v1. Built once for the module: each test serves a copy."""
    root = tmp_path_factory.mktemp("verified") / "bundles"
    build(BuildRequest(corpus=tiny_corpus, root=root, version="v1", dim=MINI_DIM, quantization="int8", rotation="pca",
                       teacher=mini_teacher))
    changes = root.parent / "changes.jsonl"
    changes.write_text(json.dumps({"_id": "kites", "text": "Wind lifts the kite over the beach."}) + "\n")
    update(UpdateRequest(changes=changes, root=root, version="v2", teacher=mini_teacher))  # CURRENT → v2
    assert current_name(root) == "v2"
    set_current(root, "v1")
    return root


@pytest.fixture
def root(published: Path, tmp_path: Path) -> Path:
    """A copy of the published root whose CURRENT is v1; `cp -a` keeps v2's hard links to v1's files links (and
    every mtime), as the update made them."""
    copy = tmp_path / "bundles"
    subprocess.run(["cp", "-a", str(published), str(copy)], check=True)
    return copy


def _publish_v2(root: Path) -> Path:
    """What the update's publication does last (indexer.publish: CURRENT set to the version it placed), on the copy
    of a root where `index update` placed v2."""
    set_current(root, "v2")
    for name in (INDEX_FILE, ROTATION_FILE, CALIBRATION_FILE):
        assert (root / "v2" / name).stat().st_ino == (root / "v1" / name).stat().st_ino, f"{name} is shared"
    return root / "v2"


def _flip_in_place(path: Path, keep_mtime: bool) -> None:
    """Flip one byte of the very inode (r+b), its size kept; with `keep_mtime` its mtime is put back (os.utime)."""
    stat = path.stat()
    with path.open("r+b") as fh:
        fh.seek(stat.st_size // 2)
        byte = fh.read(1)
        fh.seek(stat.st_size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns if keep_mtime else stat.st_mtime_ns + 1_000_000))
    now = path.stat()
    assert (now.st_ino, now.st_size) == (stat.st_ino, stat.st_size)


def _ids(body: dict) -> list[str]:
    return [hit["id"] for hit in body["results"]]


def _answers(server: LiveServer) -> dict[str, list[str]]:
    """Each probe's ids, in order, and without the document v2 adds: what v1's vectors answer."""
    return {query: [i for i in _ids(search(server, query)) if i != "kites"][:2] for query in PROBES}


def _refused(server: LiveServer, name: str, answers: dict[str, list[str]]) -> None:
    response = reload(server)
    assert response.status_code == 409, response.text
    message = response.json()["message"]
    assert response.json()["error"] == "reload_rejected"
    assert f"v2: {name}: checksum mismatch" in message, message
    assert search(server)["index"]["version"] == "v1"  # the old version keeps serving
    assert _answers(server) == answers  # and answers as it did


def test_a_shared_file_changed_in_place_is_refused_by_name_and_the_old_version_serves(
        root: Path, mini_student: Path) -> None:
    with serving(root, mini_student) as server:
        assert search(server)["index"]["version"] == "v1"
        answers = _answers(server)
        v2 = _publish_v2(root)
        _flip_in_place(v2 / INDEX_FILE, keep_mtime=False)  # its mtime moves: the identity v1 verified is gone
        _refused(server, INDEX_FILE, answers)
        _flip_in_place(v2 / INDEX_FILE, keep_mtime=False)  # the byte back: hashed again, and now it matches
        response = reload(server)
        assert response.status_code == 200, response.text
        assert response.json()["current"]["version"] == "v2" and response.json()["current"]["shared_segments"] == 1


@pytest.mark.parametrize("name", [ROTATION_FILE, CALIBRATION_FILE])
def test_space_files_are_hashed_on_every_reload_even_when_size_and_mtime_are_restored(
        root: Path, mini_student: Path, name: str) -> None:
    with serving(root, mini_student) as server:
        answers = _answers(server)
        v2 = _publish_v2(root)
        _flip_in_place(v2 / name, keep_mtime=True)
        _refused(server, name, answers)


def test_the_limit_a_sneaky_write_to_a_shared_segment_is_not_read_and_index_verify_names_it(
        root: Path, mini_student: Path) -> None:
    with serving(root, mini_student) as server:
        answers = _answers(server)
        v2 = _publish_v2(root)
        _flip_in_place(v2 / INDEX_FILE, keep_mtime=True)  # same device, inode, size and mtime_ns
        response = reload(server)
        # Trusted by identity: the segment is not read again; v2 serves it as loaded (and verified) from v1.
        assert response.status_code == 200, response.text
        assert response.json()["current"]["shared_segments"] == 1
        assert _answers(server) == answers  # v1's segment as verified and loaded, not the flipped bytes
    with pytest.raises(ContractMismatch, match=f"{INDEX_FILE}: checksum mismatch"):
        verify(root)


def test_a_corrupted_bundle_is_verified_at_startup_and_never_ready(mini_bundle: Path, mini_student: Path,
                                                                   tmp_path: Path) -> None:
    broken = tmp_path / "bundle"
    shutil.copytree(mini_bundle, broken)
    _flip_in_place(broken / "docs.sqlite", keep_mtime=True)
    with serve_app(create_app(ServiceSettings(index=broken, student=mini_student)), wait_ready=False) as server:
        deadline = time.monotonic() + READY_TIMEOUT_S
        ready = server.client.get("/readyz")
        while ready.json()["status"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
            ready = server.client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "failed"
        assert "docs.sqlite: checksum mismatch" in ready.json()["error"]
        assert server.client.post("/search", json={"query": "tides"}).status_code == 503
