"""A reloaded version shares the segments of the version it replaced, and those segment objects name the first
version's directory. Pruning that version must not break the second: every file a shared segment reads at query
time was opened when it loaded, the docstore's connection for filter scans included (it used to open at the first
filtered query, by the first version's path, after the prune: "unable to open database file")."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from indexer.versions.update import UpdateRequest, update
from models.bundle.version import Bundle
from models.bundle.versions import prune_versions, set_current
from models.search import SearchOptions, parse_filter, search
from models.search.query import Mode
from tests.fixtures.corpus import DOCS


@pytest.mark.usefixtures("no_agreement_sample")  # the update's sample would encode and search queries read nowhere
def test_a_version_sharing_segments_with_a_pruned_one_still_filters_and_reads_documents(
        meta_bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(meta_bundle, root / "v1")
    set_current(root, "v1")
    changes = tmp_path / "changes.jsonl"
    changes.write_text(json.dumps({"_id": "late", "title": "Late", "text": "a document added by v2",
                                   "metadata": {"topic": "late", "year": 1999}}) + "\n")
    update(UpdateRequest(changes=changes, root=root, version="v2"))

    first = Bundle(root / "v1")
    second = Bundle(root / "v2", reuse=first)
    assert second.reused >= 1 and any(s.directory.is_relative_to((root / "v1").resolve()) for s in second.segments)
    first.close()  # swapped out and retired, as a reload does
    set_current(root, "v2")
    assert prune_versions(root, keep=0) == ["v1"] and not (root / "v1").exists()

    expected = {doc_id for doc_id, _, _ in DOCS}
    shared = next(s for s in second.segments if s.directory.is_relative_to((root / "v1").resolve()))

    def query() -> tuple[list[str], set[str], int]:
        """From a thread that never touched the store: a lexical search under a filter, a scan of the shared
        segment's metadata (what a filter on a field its payload does not index runs), and its documents."""
        food = parse_filter({"field": "topic", "eq": "food"}, second.filter_fields)
        hits = search(second, None, ["bread loaf rise"], SearchOptions(top_k=10, mode=Mode.LEXICAL, filter=food),
                      oversample=4).hits[0]
        scanned = shared.docs.rows_where("json_extract(metadata, '$.topic') = ?", ["food"])
        read = {d.id for d in shared.docs.get(list(range(shared.count)))}
        return [h.doc.id for h in hits], read, len(scanned)

    with ThreadPoolExecutor(1) as fresh:
        hits, read, scanned = fresh.submit(query).result()
    assert read == expected
    assert hits == ["bake"] and scanned == 4  # every fifth of the 20 documents is about food
    second.close()
