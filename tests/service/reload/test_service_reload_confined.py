"""Admin reloads load only what they should (issue 24, item 3), and errors name no host path.

On the tiny models (tests/fixtures/tiny_service.py): these tests check which files a reload opens, never relevance."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from models.bundle.manifest import BUNDLE_MANIFEST
from models.bundle.storage.docstore import DocStore
from models.bundle.version import Bundle
from models.bundle.versions import set_current
from models.hashing import sha256_file
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.server import LiveServer, serve_app
from tests.service.reload.test_service_reload import reload, serving, version, wait_for

pytestmark = pytest.mark.slow


def _edit_manifest(bundle: Path, edit: dict[str, object] | None = None, drop: str | None = None) -> None:
    manifest = json.loads((bundle / BUNDLE_MANIFEST).read_text())
    files = manifest["files"]
    if drop is not None:
        del files[drop]
    files.update(edit or {})
    (bundle / BUNDLE_MANIFEST).write_text(json.dumps(manifest))


def _names_no_host_path(text: str, *paths: Path) -> None:
    for path in paths:
        assert str(path) not in text
    assert "/tmp" not in text and "/etc" not in text


@pytest.fixture
def root(mini_v1_v2_root: Path) -> Path:
    return mini_v1_v2_root


@pytest.fixture(scope="module")
def bad_root(mini_bundle: Path, mini_v2_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root serving v1, with v2 and one broken copy of v2 per way a manifest can lie."""
    root = tmp_path_factory.mktemp("confined") / "bundles"
    shutil.copytree(mini_bundle, root / "v1")
    shutil.copytree(mini_v2_bundle, root / "v2")
    set_current(root, "v1")
    for i, name in enumerate(EVIL_NAMES):
        shutil.copytree(mini_v2_bundle, root / f"v3-evil{i}")
        _edit_manifest(root / f"v3-evil{i}", {name: "0" * 64})
    for name in UNLISTED:
        shutil.copytree(mini_v2_bundle, root / f"v3-unlisted-{name}")
        _edit_manifest(root / f"v3-unlisted-{name}", drop=name)
    short = root / "v3-short"
    shutil.copytree(mini_v2_bundle, short)
    con = sqlite3.connect(short / "docs.sqlite")
    con.execute("DELETE FROM docs WHERE row = (SELECT MAX(row) FROM docs)")
    con.commit()
    con.close()
    _edit_manifest(short, {"docs.sqlite": sha256_file(short / "docs.sqlite")})
    linked = root / "v3-link"
    shutil.copytree(mini_v2_bundle, linked)
    (linked / "docs.sqlite").unlink()
    (linked / "docs.sqlite").symlink_to(root / "v2" / "docs.sqlite")
    (root / "link").symlink_to(mini_bundle, target_is_directory=True)
    return root


@pytest.fixture(scope="module")
def confined(bad_root: Path, mini_student: Path) -> Iterator[LiveServer]:
    with serving(bad_root, mini_student) as server:
        yield server


EVIL_NAMES = ["../../../../../../etc/hostname", "/etc/hostname", "sub/index.faiss"]
UNLISTED = ["docs.sqlite", "index.faiss"]


def test_reload_outside_the_root_is_403_naming_no_path(confined: LiveServer, bad_root: Path,
                                                       mini_bundle: Path) -> None:
    for target in (mini_bundle, Path("/etc"), bad_root / "link", bad_root / ".." / ".." / mini_bundle.name,
                   Path("/")):
        response = reload(confined, target)
        assert response.status_code == 403, (target, response.text)
        assert "TANDEM_BUNDLE_DIRS" in response.json()["message"]
        _names_no_host_path(response.text, target, bad_root, mini_bundle)
    assert version(confined) == "v1"


def test_bundle_dirs_allow_list(root: Path, mini_v2_bundle: Path, mini_student: Path) -> None:
    with serving(root, mini_student, bundle_dirs=f"{root}:{mini_v2_bundle.parent}") as server:
        response = reload(server, mini_v2_bundle)
        assert response.status_code == 200, response.text
        assert version(server) == mini_v2_bundle.name


@pytest.mark.parametrize("i", range(len(EVIL_NAMES)))
def test_manifest_file_names_must_be_plain(confined: LiveServer, bad_root: Path, i: int) -> None:
    response = reload(confined, bad_root / f"v3-evil{i}")
    assert response.status_code == 409, response.text
    assert "plain file name" in response.json()["message"]
    _names_no_host_path(response.text, bad_root)
    assert version(confined) == "v1"


@pytest.mark.parametrize("name", UNLISTED)
def test_manifest_must_list_what_the_loader_reads(confined: LiveServer, bad_root: Path, name: str) -> None:
    response = reload(confined, bad_root / f"v3-unlisted-{name}")
    assert response.status_code == 409, response.text
    assert f"does not list {name}" in response.json()["message"]
    _names_no_host_path(response.text, bad_root)
    assert version(confined) == "v1"


def test_docstore_row_count_is_checked(confined: LiveServer, bad_root: Path) -> None:
    response = reload(confined, bad_root / "v3-short")
    assert response.status_code == 409, response.text
    assert "docs.sqlite holds 18 documents, manifest says 19" in response.json()["message"]
    _names_no_host_path(response.text, bad_root)
    assert version(confined) == "v1"


def test_a_symlinked_file_is_refused(confined: LiveServer, bad_root: Path) -> None:
    response = reload(confined, bad_root / "v3-link")
    assert response.status_code == 409, response.text
    assert "not a regular file" in response.json()["message"]
    assert version(confined) == "v1"


def test_readyz_and_search_name_no_host_path_after_a_failed_start(root: Path, mini_student: Path,
                                                                  tmp_path: Path) -> None:
    (root / "v1" / "index.faiss").write_bytes(b"not a faiss index" * 64)
    _edit_manifest(root / "v1", {"index.faiss": sha256_file(root / "v1" / "index.faiss")})  # FAISS must refuse it
    settings = ServiceSettings(index=root, student=mini_student, watch_interval_s=0)
    with serve_app(create_app(settings), wait_ready=False) as server:
        wait_for(lambda: server.client.get("/readyz").json().get("status") == "failed", "the load fails")
        ready = server.client.get("/readyz")
        assert ready.status_code == 503
        assert "unreadable index files" in ready.json()["error"]
        search = server.client.post("/search", json={"query": "tides"})
        assert search.status_code == 503
        for text in (ready.text, search.text):
            _names_no_host_path(text, tmp_path)
            assert "faiss" not in text.lower().replace("index.faiss", "")


def test_docstore_path_with_uri_characters_stays_read_only(mini_bundle: Path, tmp_path: Path) -> None:
    odd = tmp_path / "we#ird?x%41"
    shutil.copytree(mini_bundle, odd)
    bundle = Bundle(odd)
    try:
        assert bundle.count == 20 and bundle.segments[0].docs.count() == 20
    finally:
        bundle.close()
    store = DocStore(odd / "docs.sqlite")
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store._con.execute("DELETE FROM docs")
    finally:
        store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd.name]  # nothing created beside it


def test_set_current_is_followed_inside_the_root(root: Path, mini_student: Path) -> None:
    with serving(root, mini_student) as server:
        set_current(root, "v2")
        assert reload(server).status_code == 200
        assert version(server) == "v2"
