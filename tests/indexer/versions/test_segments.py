"""Segmented versions (issue 37): a base and its updates search as a fresh build of the same documents, compaction
makes that fresh build, and a SIGKILL at any file-system step of an update, a compaction or a follower leaves the
served version intact and the new one whole or absent, with every change file applied once."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from indexer.follow import FollowRequest, follow
from indexer.sample import SAMPLE_SETTING
from indexer.verify import verify_one
from indexer.versions.compact import compact
from indexer.versions.merge_policy import MergePolicy
from indexer.versions.request import VersionRequest
from indexer.versions.update import UpdateRequest, update
from models.bundle.sample import SAMPLE_FILES
from models.bundle.version import Bundle, read_bundle_manifest
from models.bundle.versions import list_versions, read_current, set_current
from models.encoders.teacher import TeacherEncoder
from models.errors import InputError
from models.hashing import sha256_file
from models.search import Mode, SearchOptions, dense_hits, documents, parse_filter, search
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.kill_points import Pristine, kill_everywhere, run_killed_at
from tests.fixtures.kill_points import kill_dir as kill_dir

# No agreement samples (tests/fixtures/tiny_home.py no_agreement_sample): nothing here reads one, and each writer would
# encode its sample's queries and search the staged version for them (compaction merging its inputs' samples);
# samples, and what updates and compactions do with them: tests/indexer/test_agreement_check.py.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_agreement_sample")]

QUERIES = [*PROBES, "French chess defence", "wind and kites", "green tea", "honey"]


def _lines(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _segmented(root: Path, work: Path, **build_options: Any) -> list[str]:
    """A root whose CURRENT is a base and three updates (adds, a replaced text, a metadata-only change, deletes,
    one of a document an update added); returns the live ids in row order."""
    build(BuildRequest(corpus=work / "corpus.jsonl", root=root, version="v1", metadata_extra=True, **build_options))
    _lines(work / "u1.jsonl", [{"_id": "kites", "text": "Wind lifts the kite over the beach."},
                               {"_id": "chess", "title": "Chess openings",
                                "text": "The French Defence answers e4 with e6."},
                               {"_id": "git", "delete": True}])
    update(UpdateRequest(changes=work / "u1.jsonl", root=root, version="v2"))
    bake = DOCS[0]
    _lines(work / "u2.jsonl", [{"_id": bake[0], "title": bake[1], "text": bake[2], "lang": "fr"},
                               {"_id": "bees", "delete": True}])
    update(UpdateRequest(changes=work / "u2.jsonl", root=root, version="v3"))
    _lines(work / "u3.jsonl", [{"_id": "tea", "text": "Green tea is steamed, black tea oxidised."},
                               {"_id": "kites", "delete": True}])
    update(UpdateRequest(changes=work / "u3.jsonl", root=root, version="v4"))
    return Bundle(read_current(root)).ids()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    _lines(tmp_path / "corpus.jsonl", [{"_id": i, "title": t, "text": x, "lang": "en"} for i, t, x in DOCS])
    return tmp_path


def _fresh_corpus(version: Path, out: Path) -> Path:
    """The live documents of a version, in its row order, as a corpus file."""
    bundle = Bundle(version)
    try:
        docs = documents(bundle, bundle.live_rows())
    finally:
        bundle.close()
    return _lines(out, [{"_id": d.id, "title": d.title, "text": d.text, **d.meta()} for d in docs])


def test_a_base_and_three_updates_search_as_a_fresh_build(tiny_home: Path, tiny_teacher: Path, work: Path) -> None:
    ids = _segmented(work / "root", work)
    assert ids[-3:] == ["chess", "bake", "tea"] and "git" not in ids and "bees" not in ids and "kites" not in ids
    fresh = work / "fresh"
    build(BuildRequest(corpus=_fresh_corpus(read_current(work / "root"), work / "live.jsonl"), out=fresh,
                       metadata_extra=True))
    segmented, whole = Bundle(read_current(work / "root")), Bundle(fresh)
    assert [len(segmented.segments), len(whole.segments)] == [4, 1]
    assert segmented.ids() == whole.ids() == ids
    vectors = TeacherEncoder(tiny_teacher).encode_queries(QUERIES)
    for got, want in zip(dense_hits(segmented, vectors, 10), dense_hits(whole, vectors, 10), strict=True):
        assert [h.doc.id for h in got] == [h.doc.id for h in want]
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
    fields = frozenset(segmented.manifest.metadata_fields)
    for mode, flt, offset, floor in ((Mode.LEXICAL, None, 0, None), (Mode.HYBRID, None, 0, None),
                                     (Mode.LEXICAL, {"field": "lang", "eq": "fr"}, 0, None),
                                     (Mode.HYBRID, {"field": "lang", "in": ["fr", "en"]}, 2, None),
                                     (Mode.DENSE, {"not": {"field": "lang", "eq": "fr"}}, 3, 0.05),
                                     (Mode.LEXICAL, None, 1, 0.5)):
        options = SearchOptions(top_k=10, mode=mode, offset=offset, min_score=floor,
                                filter=None if flt is None else parse_filter(flt, fields))
        assert_same_hits(search(segmented, vectors, QUERIES, options, 4).hits,
                         search(whole, vectors, QUERIES, options, 4).hits, (mode, flt))
    segmented.close()
    # unfiltered BM25 leaves the deleted rows out by their masks: no array of every live row is built (and kept
    # with the version)
    lexical = Bundle(read_current(work / "root"))
    search(lexical, None, QUERIES, SearchOptions(top_k=10, mode=Mode.LEXICAL), 4)
    assert sum(live is not None for live in lexical.live) and all(
        "rows" not in vars(live) for live in lexical.live if live is not None)
    lexical.close()
    whole.close()


def test_compaction_is_a_fresh_build_of_the_live_documents(tiny_home: Path, work: Path) -> None:
    """With the space refitted: binary codes centered and spun, a PCA rotation, all fitted on the live rows."""
    root = work / "root"
    ids = _segmented(root, work, quantization="binary", rotation="pca", dim=64)
    manifest = compact(VersionRequest(root=root, version="v5"), MergePolicy(full=True))
    assert manifest is not None and manifest.base is not None
    assert manifest.segments is None and manifest.count == len(ids)
    assert (manifest.base.action, manifest.base.version, manifest.base.deleted) == ("compact", "v4", 5)
    fresh = work / "fresh"
    build(BuildRequest(corpus=root / "v5" / "corpus.jsonl", out=fresh, metadata_extra=True, quantization="binary",
                       rotation="pca", dim=64))
    compacted = read_bundle_manifest(root / "v5")
    built = read_bundle_manifest(fresh)
    # byte for byte, but for the agreement sample: a compaction keeps its inputs' (indexer.sample), a build draws one
    assert {n: h for n, h in compacted.files.items() if n not in ("corpus.jsonl", *SAMPLE_FILES)} == \
        {n: h for n, h in built.files.items() if n not in SAMPLE_FILES}
    assert sha256_file(root / "v5" / "corpus.jsonl") == built.corpus.sha256
    assert Bundle(root / "v5").ids() == ids
    verify_one(root / "v5")
    assert "1 segment, 0 deleted rows" in verify_one(root / "v5")


def test_sigkill_anywhere_in_an_update_or_a_compaction(tiny_home: Path, work: Path, kill_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The changes here need no teacher (a deletion and a metadata-only change), so each run is short; so does no
    agreement sample (torch in a forked child of a process that ran it hangs). The roots live in `kill_dir`; each job
    runs once from the pristine root and every point is checked as tests/fixtures/kill_points.py says: every
    version still verified, the untouched ones by identity with the pristine copy."""
    monkeypatch.setenv(SAMPLE_SETTING, "0")
    _segmented(kill_dir / "pristine", work)
    pristine = Pristine(kill_dir / "pristine")
    root = kill_dir / "root"
    bake = DOCS[0]
    changes = _lines(work / "changes.jsonl", [{"_id": bake[0], "title": bake[1], "text": bake[2], "lang": "de"},
                                             {"_id": "tides", "delete": True}])
    jobs: dict[str, Callable[[], object]] = {  # module-level functions, so that they pickle (kill_points)
        "update": partial(update, UpdateRequest(changes=changes, root=root, version="v5")),
        "compact": partial(compact, VersionRequest(root=root, version="v5"), MergePolicy(full=True)),
        "merge": partial(compact, VersionRequest(root=root, version="v5"))}  # the policy: v1 kept, the rest merged

    def check() -> None:
        current = read_current(root)
        assert current.name in {"v4", "v5"}
        versions = list_versions(root)
        assert current.name in versions
        pristine.verify_versions(root)  # a version is whole, or not there at all

    for name, job in jobs.items():
        points = kill_everywhere(job, check, lambda: pristine.restore(root))
        assert points > 5, name
        assert read_current(root).name == "v5"
    pristine.assert_intact()


def test_a_follower_killed_anywhere_applies_each_change_file_once(tiny_home: Path, work: Path, kill_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SAMPLE_SETTING, "0")  # no teacher in the forked children (see the test above)
    build(BuildRequest(corpus=work / "corpus.jsonl", root=kill_dir / "pristine", version="v1", metadata_extra=True))
    pristine = Pristine(kill_dir / "pristine")
    changes = work / "changes"
    changes.mkdir()
    bake, tides = DOCS[0], DOCS[6]
    _lines(changes / "0001.jsonl", [{"_id": bake[0], "title": bake[1], "text": bake[2], "lang": "fr"},
                                    {"_id": "git", "delete": True}])
    _lines(changes / "0002.jsonl", [{"_id": "bees", "delete": True}])  # applied twice, it would fail
    _lines(changes / "0003.jsonl", [{"_id": tides[0], "title": tides[1], "text": tides[2], "lang": "es"}])
    root = kill_dir / "root"
    request = FollowRequest(root=root, changes_dir=changes, once=True, max_segments=2)
    expected = [d[0] for d in DOCS if d[0] not in {"git", "bees", "bake", "tides"}] + ["bake", "tides"]

    def reset() -> None:
        pristine.restore(root)

    def check() -> None:
        current = read_current(root)
        pristine.verify(current)  # v1 untouched, or the new version verified whole
        state = read_bundle_manifest(current).follow
        # each batch whole or not at all (max_segments 2: a batch of one file, then a compaction)
        assert state is None or (state.last, state.files) in {(f"000{n}.jsonl", n) for n in (1, 2, 3)}

    points = kill_everywhere(partial(follow, request), check, reset)
    assert points > 10
    for n in (points // 3, 2 * points // 3):  # killed part way, then started again: each file once
        reset()
        assert not run_killed_at(n, lambda: follow(request))
        assert follow(request).applied in range(4)  # what the killed run had not published yet
        final = read_bundle_manifest(read_current(root))
        assert final.follow is not None and (final.follow.last, final.follow.files) == ("0003.jsonl", 3)
        assert len(final.parts) <= request.max_segments  # compacted before a batch would pass the bound
        bundle = Bundle(read_current(root))
        assert bundle.ids() == expected
        assert {d.id: d.meta().get("lang") for d in documents(bundle, bundle.live_rows())}["tides"] == "es"
        bundle.close()
        assert follow(request).applied == 0  # nothing left, nothing applied again
    pristine.assert_intact()


def test_a_bad_change_file_stops_the_follower_naming_its_line(tiny_home: Path, work: Path) -> None:
    root = work / "root"
    build(BuildRequest(corpus=work / "corpus.jsonl", root=root, version="v1"))
    changes = work / "changes"
    changes.mkdir()
    _lines(changes / "0001.jsonl", [{"_id": "git", "delete": True}])
    (changes / "0002.jsonl").write_text('{"_id": "x", "text": "fine"}\n{not json\n')
    with pytest.raises(InputError, match=r"0002\.jsonl:2"):
        follow(FollowRequest(root=root, changes_dir=changes, once=True))
    assert read_current(root).name == "v1" and list_versions(root) == ["v1"]  # nothing of the batch published


def _as_built_before_segments(bundle: Path, out: Path) -> Path:
    """A copy of `bundle` whose lexical index is bm25s's, as the code before segments built it."""
    import bm25s
    from bm25s.tokenization import Tokenized

    from models.bundle.lexical.postings import Analyzer
    from models.bundle.manifest import LexicalInfo
    from models.bundle.storage.docstore import DocStore

    shutil.copytree(bundle, out)
    shutil.rmtree(out / "lexical")
    store = DocStore(out / "docs.sqlite")
    docs = store.range(0, store.count())
    store.close()
    analyzer, vocab = Analyzer(LexicalInfo()), {"": 0}
    ids = [[vocab.setdefault(s, len(vocab)) for s in analyzer.stems(d.passage())] or [0] for d in docs]
    retriever = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    retriever.index(Tokenized(ids=ids, vocab=vocab), create_empty_token=False, show_progress=False)
    retriever.save(str(out / "lexical"), show_progress=False)
    manifest = read_bundle_manifest(out)
    files = {n: h for n, h in manifest.files.items() if not n.startswith("lexical/")}
    files |= {f"lexical/{p.name}": sha256_file(p) for p in (out / "lexical").iterdir()}
    old = manifest.model_copy(update={"files": files, "lexical": LexicalInfo(engine="bm25s", vocab=len(vocab))})
    (out / "manifest.json").write_text(old.model_dump_json(exclude_none=True))
    return out


def test_a_bundle_built_before_segments_serves_as_before_and_its_first_update_rewrites_it(
        tiny_home: Path, tiny_teacher_bundle: Path, work: Path) -> None:
    tiny_bundle = tiny_teacher_bundle
    old = _as_built_before_segments(tiny_bundle, work / "old")
    verify_one(old)
    before, now = Bundle(old), Bundle(tiny_bundle)
    assert type(before.lexical).__name__ == "Bm25sIndex"
    options = SearchOptions(top_k=5, mode=Mode.LEXICAL)
    for a, b in zip(search(before, None, QUERIES, options, 4).hits, search(now, None, QUERIES, options, 4).hits,
                    strict=True):
        assert [h.doc.id for h in a] == [h.doc.id for h in b]  # bm25s's scores, and the postings' alike
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-5)
    before.close()
    now.close()
    (work / "gone.txt").write_text("git\n")
    rewritten = update(UpdateRequest(delete_ids=work / "gone.txt", base=old, out=work / "v2"))
    assert rewritten.segments is None and rewritten.lexical is not None and rewritten.lexical.engine == "postings"
    (work / "more.txt").write_text("bees\n")
    segmented = update(UpdateRequest(delete_ids=work / "more.txt", base=work / "v2", out=work / "v3"))
    assert segmented.segments is not None and [s.deleted for s in segmented.parts] == [1]


def test_a_follower_rewrites_a_bundle_built_before_segments_once_then_adds_segments(
        tiny_home: Path, tiny_teacher_bundle: Path, work: Path) -> None:
    """As `index update` does: a version whose lexical index is bm25s's cannot take a postings segment (the service
    refuses the mix), so the follower's first batch starts from a whole rewrite of it."""
    root = work / "root"
    root.mkdir()
    _as_built_before_segments(tiny_teacher_bundle, root / "v1")
    set_current(root, "v1")
    changes = work / "changes"
    changes.mkdir()
    _lines(changes / "0001.jsonl", [{"_id": "git", "delete": True}])
    _lines(changes / "0002.jsonl", [{"_id": "kites", "title": "Kite flying", "text": "Wind lifts the kite."}])
    request = FollowRequest(root=root, changes_dir=changes, once=True, compact=False)
    assert follow(request).applied == 2
    current = read_current(root)
    verify_one(current)
    manifest = read_bundle_manifest(current)
    assert {s.lexical.engine for s in manifest.parts if s.lexical is not None} == {"postings"}
    assert manifest.follow is not None and (manifest.follow.last, manifest.follow.files) == ("0002.jsonl", 2)
    bundle = Bundle(current)
    try:
        assert bundle.ids() == [d[0] for d in DOCS if d[0] != "git"] + ["kites"]
        [hit] = search(bundle, None, ["kite wind"], SearchOptions(top_k=1, mode=Mode.LEXICAL), 4).hits
        assert hit[0].doc.id == "kites"
    finally:
        bundle.close()
    _lines(changes / "0003.jsonl", [{"_id": "bees", "delete": True}])
    assert follow(request).applied == 1  # a tombstone on the rewritten version, no second rewrite
    assert read_bundle_manifest(read_current(root)).deleted == 2


def test_a_follower_keeps_the_vector_of_a_document_an_earlier_file_of_its_batch_added(tiny_home: Path,
                                                                                      work: Path) -> None:
    """Two files in one publish: the second changes only the metadata of a document the first added, so its
    vector is the one the first file's segment stored (the teacher encodes it once)."""
    root = work / "root"
    build(BuildRequest(corpus=work / "corpus.jsonl", root=root, version="v1", metadata_extra=True))
    changes = work / "changes"
    changes.mkdir()
    kite = {"_id": "kites", "title": "Kite flying", "text": "Wind lifts the kite over the beach."}
    _lines(changes / "0001.jsonl", [{**kite, "lang": "en"}])
    _lines(changes / "0002.jsonl", [{**kite, "lang": "fr"}])
    assert follow(FollowRequest(root=root, changes_dir=changes, once=True, compact=False)).applied == 2
    manifest = read_bundle_manifest(read_current(root))
    assert manifest.base is not None and (manifest.base.added, manifest.base.replaced, manifest.base.encoded) == \
        (1, 1, 1)
    bundle = Bundle(read_current(root))
    try:
        first, second = bundle.segments[1].vectors.index, bundle.segments[2].vectors.index
        assert np.array_equal(first.reconstruct_n(0, 1), second.reconstruct_n(0, 1))
        [doc] = documents(bundle, bundle.live_rows()[-1:])
        assert (doc.id, doc.meta()["lang"]) == ("kites", "fr")
    finally:
        bundle.close()


def assert_same_hits(got: list, want: list, context: object) -> None:
    """Some hits, and per query the same documents in the same order with the same scores."""
    assert any(got), context
    for a, b in zip(got, want, strict=True):
        assert [h.doc.id for h in a] == [h.doc.id for h in b], context
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-5, atol=1e-5,
                                   err_msg=str(context))
