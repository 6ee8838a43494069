"""Hot reloads of segmented versions (issue 37): a version that adds a segment shares the loaded ones and loads
only its new one, under load, with no failed request; compaction and rollback reload as ever; a corrupted new
segment is refused.

Mechanics only, so the tiny models serve (tests/fixtures/tiny_service.py): new documents are found by their words
(lexical), and "still serving what it served" is every probe's answer, compared with v2's own before the refusal."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from indexer.build import BuildRequest, build
from indexer.versions.compact import compact
from indexer.versions.merge_policy import MergePolicy
from indexer.versions.request import VersionRequest
from indexer.versions.update import UpdateRequest, update
from models.bundle.versions import set_current
from tests.fixtures.corpus import PROBES
from tests.fixtures.server import LiveServer
from tests.fixtures.tiny_service import MINI_DIM
from tests.service.reload.test_service_reload import AUTH, reload, search, serving
from tests.service.runtime.test_service_processes import under_load

pytestmark = pytest.mark.slow


def _ids(server_search: dict) -> list[str]:
    return [h["id"] for h in server_search["results"]]


def _lexical(server: LiveServer, query: str) -> list[str]:
    """The tiny student knows too few words for new documents: BM25 finds them by theirs."""
    response = server.client.post("/search", json={"query": query, "top_k": 3, "mode": "lexical"})
    assert response.status_code == 200, response.text
    return _ids(response.json())


def _reloaded(server: LiveServer) -> tuple[str, int, int, int]:
    """Reload CURRENT: the version now in service, its segments, those shared with the one before, deleted rows."""
    response = reload(server)
    assert response.status_code == 200, response.text
    current = response.json()["current"]
    return current["version"], current["segments"], current["shared_segments"], current["deleted"]


def test_reloads_share_loaded_segments_and_load_only_new_ones(tiny_corpus: Path, mini_teacher: Path,
                                                              mini_student: Path, tmp_path: Path) -> None:
    root = tmp_path / "bundles"  # the mini bundle's build (its teacher vectors cached by the store: no encoding)
    build(BuildRequest(corpus=tiny_corpus, root=root, version="v1", teacher=mini_teacher, dim=MINI_DIM,
                       quantization="float"))
    changes = tmp_path / "changes.jsonl"
    changes.write_text(json.dumps({"_id": "kites", "text": "Wind lifts the kite over the beach."}) + "\n"
                       + json.dumps({"_id": "git", "delete": True}) + "\n")
    with serving(root, mini_student) as server, under_load(server.url) as answers:
        update(UpdateRequest(changes=changes, root=root, version="v2", teacher=mini_teacher))
        assert _reloaded(server) == ("v2", 2, 1, 1)
        assert _lexical(server, "kite beach")[0] == "kites"
        assert "git" not in _lexical(server, "git rebase replays commits")

        compact(VersionRequest(root=root, version="v3", teacher=mini_teacher), MergePolicy(full=True))
        assert _reloaded(server) == ("v3", 1, 0, 0)
        assert _lexical(server, "kite beach")[0] == "kites"

        rollback = server.client.post("/admin/rollback", headers=AUTH)
        assert rollback.status_code == 200 and rollback.json()["current"]["version"] == "v2"
        served = {query: _ids(search(server, query)) for query in PROBES}  # v2's answers
        assert "git" not in {doc for ids in served.values() for doc in ids}

        more = tmp_path / "more.jsonl"
        more.write_text(json.dumps({"_id": "tea", "text": "Green tea is steamed, black tea oxidised."}) + "\n")
        update(UpdateRequest(changes=more, base=root / "v2", root=root, version="v4", teacher=mini_teacher))
        corrupt = root / "v4" / "segments" / "v4" / "docs.sqlite"
        data = bytearray(corrupt.read_bytes())
        data[-10] ^= 0xFF
        corrupt.write_bytes(bytes(data))
        set_current(root, "v4")
        response = reload(server)
        assert response.status_code == 409, response.text
        assert response.json()["error"] == "reload_rejected" and "checksum mismatch" in response.json()["message"]
        assert search(server)["index"]["version"] == "v2"  # still serving what it served
        assert {query: _ids(search(server, query)) for query in PROBES} == served
    assert answers, "the load ran"
    failed = [a for a in answers if not isinstance(a, httpx.Response) or a.status_code != 200]
    assert failed == []
