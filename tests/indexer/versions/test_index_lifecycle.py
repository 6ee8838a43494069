"""Index lifecycle: resumable builds with a shard log, versions behind CURRENT, updates, verification."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from indexer.build import BuildRequest, build
from indexer.verify import verify
from indexer.versions.changes import read_changes
from indexer.versions.update import UpdateRequest, update
from models.bundle.manifest import BUNDLE_MANIFEST
from models.bundle.version import Bundle, read_bundle_manifest
from models.bundle.versions import list_versions, read_current
from models.embeddings.shard_log import SHARD_LOG, ShardLog
from models.embeddings.store import EmbeddingStore
from models.encoders.teacher import TeacherEncoder
from models.errors import ContractMismatch, InputError
from models.search import FilterError, Mode, SearchOptions, dense_hits, documents, parse_filter, search
from models.search.query import matching_rows
from tests.fixtures.corpus import DOCS
from tests.fixtures.kill_points import Ran, run_cli


def _home(path: Path, teacher_dir: Path) -> Path:
    """A fresh TANDEM_HOME (empty embedding store) whose teacher role is the provisioned teacher."""
    (path / "models").mkdir(parents=True)
    (path / "models/roles.json").write_text(json.dumps({"teacher": str(teacher_dir)}))
    return path


def _forked_cli(tmp_path: Path, args: list[str], env: dict[str, str] | None = None,
                killed_at_append: int | None = None) -> Ran:
    """`tandem ARGS` in a fork of this process (tests/fixtures/kill_points.py `run_cli`, torch and FAISS on one
    thread, as the resumed build and the reference here), with `env` added to its environment; where
    `killed_at_append` is given, the child SIGKILLs itself as it opens the shard log to append its
    `killed_at_append`-th record (the ones before it recorded, that shard's vectors written but not yet logged)."""
    left = killed_at_append

    def hook(event: str, hook_args: tuple[object, ...]) -> None:
        nonlocal left
        if event == "open" and hook_args[1] == "a" and isinstance(hook_args[0], (str, os.PathLike)) \
                and os.path.basename(os.fspath(hook_args[0])) == SHARD_LOG and left is not None:
            left -= 1
            if left == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    return run_cli(tmp_path, args, {"TANDEM_LOG_LEVEL": "WARNING", **(env or {})}, lambda: sys.addaudithook(hook))


def _log_lines(home: Path) -> int:
    logs = list((home / "embeddings").glob(f"*/{SHARD_LOG}"))
    return len(logs[0].read_text().splitlines()) if logs else 0


def _build_killed_after(args: list[str], home: Path, shards: int) -> int:
    """Run a build that is SIGKILLed as it goes to append the log's (`shards` + 1)-th line; returns its lines."""
    own = shards - _log_lines(home)  # the records this run appends before the kill
    assert own >= 1, (shards, own)
    done = _forked_cli(home.parent, args, {"TANDEM_HOME": str(home)}, killed_at_append=own + 1)
    assert done.killed, f"build ended before the kill: {done.stderr[-2000:]}"
    return _log_lines(home)


@pytest.mark.slow
def test_killed_builds_resume_to_the_same_bundle(tmp_path: Path, tiny_corpus: Path, tiny_teacher: Path,
                                                no_agreement_sample: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed twice at random points and resumed: same vectors and ids, every shard encoded exactly once.

    Mechanics only, so the tiny teacher encodes (tests/fixtures/tiny_home.py); a shard takes it milliseconds,
    so each kill is at a shard-log append the build's own audit hook counts, not at a time a poll sees. The killed
    builds are `tandem index build` commands in forks of this process (`_forked_cli`: an interpreter's start and
    its torch import per build were most of the test); the resumed one and the reference, which no kill needs in a
    process of its own, run here, on one torch thread as the forks run, so that every shard's vectors are computed
    alike."""
    n = len(DOCS)
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    home, root = _home(tmp_path / "home", tiny_teacher), tmp_path / "root"
    args = ["index", "build", "--corpus", str(tiny_corpus), "--root", str(root), "--shard-size", "1",
            "--batch-size", "1", "--version", "v1"]
    kills = rng.randint(1, 6), rng.randint(1, 6)
    first = _build_killed_after(args, home, kills[0])
    second = _build_killed_after(args, home, first + kills[1])
    assert (first, second) == (kills[0], sum(kills)) and second < n, (kills, first, second)
    assert not root.exists() or not list_versions(root)  # nothing published by a killed build
    ref_home, ref_root = _home(tmp_path / "ref-home", tiny_teacher), tmp_path / "ref"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for build_home, build_root in ((home, root), (ref_home, ref_root)):  # resumed, then the reference
            monkeypatch.setenv("TANDEM_HOME", str(build_home))
            build(BuildRequest(corpus=tiny_corpus, root=build_root, version="v1", shard_size=1, batch_size=1))
    finally:
        torch.set_num_threads(threads)

    got, want = Bundle(read_current(root)), Bundle(read_current(ref_root))
    assert got.ids() == want.ids() == [d[0] for d in DOCS]
    got_vectors = got.segments[0].vectors.index.reconstruct_n(0, n)
    assert np.array_equal(got_vectors, want.segments[0].vectors.index.reconstruct_n(0, n))
    [entry] = list((home / "embeddings").iterdir())
    records = ShardLog(entry).read()
    assert sorted(r.shard for r in records) == list(range(n))  # each shard exactly once
    assert [(r.start, r.end) for r in sorted(records, key=lambda r: r.shard)] == [(i, i + 1) for i in range(n)]
    assert len({r.pid for r in records}) == 3  # the two killed runs and the resumed one each encoded some
    assert {r.event for r in records} <= {"encoded", "adopted"}
    resumed_vectors = EmbeddingStore(home / "embeddings").load(entry.name)
    reference_vectors = EmbeddingStore(ref_home / "embeddings").load(entry.name)
    assert resumed_vectors is not None and reference_vectors is not None
    assert np.array_equal(resumed_vectors, reference_vectors)


def test_publish_into_root_current_rollback_and_prune(tiny_home: Path, no_agreement_sample: None, tiny_corpus: Path,
                                                      tmp_path: Path) -> None:
    """Mechanics of versions under a root: the tiny teacher (tests/fixtures/tiny_home.py) encodes, once (the store
    keeps its vectors for the later builds), and no build loads it again for an agreement sample, which nothing here
    reads (samples: tests/indexer/test_agreement_check.py)."""
    root = tmp_path / "root"
    for version in ("v1", "v2", "v3"):
        manifest = build(BuildRequest(corpus=tiny_corpus, root=root, version=version, keep=1))
        assert manifest.version == version and read_current(root).name == version
    assert list_versions(root) == ["v2", "v3"]  # CURRENT plus one previous
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == [".lock"]  # no staging left over
    with pytest.raises(InputError, match="never overwritten"):
        build(BuildRequest(corpus=tiny_corpus, root=root, version="v3"))
    with pytest.raises(InputError, match="exactly one of --out"):
        build(BuildRequest(corpus=tiny_corpus, root=root, out=tmp_path / "x"))
    with pytest.raises(InputError, match="invalid bundle version name"):
        build(BuildRequest(corpus=tiny_corpus, root=root, version="../evil"))

    rollback = _forked_cli(tmp_path, ["index", "current", str(root), "--set", "v2"])
    assert rollback.returncode == 0, rollback.stderr
    assert read_current(root).name == "v2" and "* v2" in rollback.stdout
    build(BuildRequest(corpus=tiny_corpus, root=root, version="v4", keep=0))
    assert list_versions(root) == ["v4"]


def _write(path: Path, lines: Sequence[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


@pytest.mark.slow
def test_update_reuses_vectors_and_deleted_ids_never_return(
    tiny_bundle: Path, tiny_corpus: Path, teacher_dir: Path, no_agreement_sample: None, tmp_path: Path
) -> None:
    """The real teacher, since the added documents must be found by what they mean; no agreement sample, which
    nothing here reads and which was half of the test (the real teacher loaded for each writer's queries)."""
    root = tmp_path / "root"
    build(BuildRequest(corpus=tiny_corpus, root=root, version="v1"))
    kite = {"_id": "kites", "title": "Kite flying", "text": "Wind pushes against the tilted sail and lifts the kite."}
    chess = {"_id": "chess", "title": "Chess openings", "text": "The French Defence answers 1.e4 with e6."}
    changes = _write(tmp_path / "changes.jsonl", [kite, chess, {"_id": "git", "delete": True}, dict(
        _id="bake", title=DOCS[0][1], text=DOCS[0][2])])  # unchanged: kept, not re-encoded
    deletes = _write(tmp_path / "deletes.txt", ["# retired", "bees"])
    manifest = update(UpdateRequest(changes=changes, delete_ids=deletes, root=root, version="v2"))

    assert read_current(root).name == "v2" and manifest.version == "v2"
    assert manifest.base is not None
    assert (manifest.base.version, manifest.base.count) == ("v1", len(DOCS))
    assert (manifest.base.added, manifest.base.replaced, manifest.base.deleted, manifest.base.encoded) == (1, 1, 2, 2)
    base, new = Bundle(root / "v1"), Bundle(root / "v2")
    ids = new.ids()
    kept = [d[0] for d in DOCS if d[0] not in {"git", "bees", "chess"}]
    assert ids == [*kept, "kites", "chess"]  # the replaced and added documents in the new segment
    assert [s.name for s in manifest.parts] == ["v1", "v2"]
    assert [(s.count, s.deleted) for s in manifest.parts] == [(len(DOCS), 3), (2, 0)]
    for name in read_bundle_manifest(root / "v1").files:  # the base segment is shared by hard links, never copied
        assert os.stat(root / "v1" / name).st_ino == os.stat(root / "v2" / name).st_ino, name
    assert not (root / "v2" / "corpus.jsonl").exists()  # an update no longer writes the whole corpus
    new_vecs = new.segments[1].vectors.index.reconstruct_n(0, 2)
    teacher = TeacherEncoder(teacher_dir)
    fresh = teacher.encode_documents(["Kite flying " + kite["text"], "Chess openings " + chess["text"]])
    assert float(fresh[0] @ new_vecs[0]) > 0.999
    assert float(fresh[1] @ new_vecs[1]) > 0.999
    assert [h[0].doc.id for h in dense_hits(new, teacher.encode_queries(["what lifts a kite"]), k=1)] == ["kites"]
    assert [h[0].doc.id for h in dense_hits(new, teacher.encode_queries(["French defence"]), k=1)] == ["chess"]
    assert [h[0].doc.id for h in dense_hits(base, teacher.encode_queries(["French defence"]), k=1)] == ["chess"]
    source = manifest.parts[1].embeddings
    assert source is not None
    stored = EmbeddingStore().load(source.store_key or "")  # compaction finds its vectors
    assert stored is not None and np.allclose(stored, new_vecs, atol=1e-2)
    base.close()
    new.close()

    more = _write(tmp_path / "more.jsonl", [{"id": "tea", "text": "Green tea is steamed, black tea oxidised."},
                                            {"_id": "kites", "delete": True}])
    third = update(UpdateRequest(changes=more, root=root, version="v3"))
    assert third.base is not None and third.base.version == "v2" and third.base.encoded == 1
    assert [(s.name, s.count, s.deleted) for s in third.parts] == [("v1", len(DOCS), 3), ("v2", 2, 1), ("v3", 1, 0)]
    assert (root / "v2" / "tombstones" / "v2.npy").exists() is False  # v2 had no deletes in its own segment
    assert np.load(root / "v3" / "tombstones" / "v2.npy").tolist() == [0]
    ids3 = Bundle(root / "v3").ids()
    assert ids3 == [*kept, "chess", "tea"]
    assert verify(root, all_versions=True)[-1].endswith("[CURRENT]")
    assert "3 segments, 4 deleted rows" in verify(root)[0]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [True, False], ids=["metadata-extra", "plain"])
def test_update_parses_change_lines_as_the_base_was_built(tiny_home: Path, no_agreement_sample: None, tmp_path: Path,
                                                          extra: bool) -> None:
    """With --metadata-extra, an updated or added document keeps its extra keys as metadata (and a later update
    of the update still does); without it they are ignored, as the build ignored them, also for a bundle whose
    manifest predates the recorded choice. No agreement sample, which nothing here reads (each writer's would
    encode its queries and search the staged version: most of the test's time)."""
    lines = [{"_id": doc_id, "title": title, "text": text, "lang": "en"} for doc_id, title, text in DOCS[:4]]
    corpus = _write(tmp_path / "corpus.jsonl", lines)
    build(BuildRequest(corpus=corpus, out=tmp_path / "v1", metadata_extra=extra))
    manifest_path = tmp_path / "v1" / BUNDLE_MANIFEST
    assert read_bundle_manifest(tmp_path / "v1").corpus.metadata_extra is extra
    if not extra:  # as written before the choice was recorded: it loads, and means "not kept"
        old = json.loads(manifest_path.read_text())
        del old["corpus"]["metadata_extra"]
        manifest_path.write_text(json.dumps(old))
    bake = DOCS[0]
    changes = _write(tmp_path / "changes.jsonl", [
        {"_id": bake[0], "title": bake[1], "text": bake[2], "lang": "fr"},  # same text, new value of the key
        {"_id": "kites", "title": "Kite flying", "text": "Wind lifts the kite.", "lang": "fr"}])
    second = update(UpdateRequest(changes=changes, base=tmp_path / "v1", out=tmp_path / "v2"))
    assert second.corpus.metadata_extra is extra  # carried, so the next update reads its lines the same way
    assert second.base is not None and (second.base.replaced, second.base.encoded) == ((1, 1) if extra else (0, 1))
    more = _write(tmp_path / "more.jsonl", [{"id": "tea", "text": "Green tea is steamed.", "lang": "de"}])
    third = update(UpdateRequest(changes=more, base=tmp_path / "v2", out=tmp_path / "v3"))
    assert third.corpus.metadata_extra is extra

    bundle = Bundle(tmp_path / "v3")
    try:
        meta = {d.id: d.meta() for d in documents(bundle, bundle.live_rows())}
        if extra:
            assert {i: m["lang"] for i, m in meta.items()} == {
                "bake": "fr", "volcano": "en", "chess": "en", "python-json": "en", "kites": "fr", "tea": "de"}
            new_values = parse_filter({"field": "lang", "in": ["fr", "de"]}, set(third.metadata_fields))
            found = search(bundle, None, ["x"], SearchOptions(top_k=10, mode=Mode.LEXICAL, filter=new_values), 1)
            assert found.hits == [[]]  # "x" is no word of theirs; the filter itself:
            rows = matching_rows(bundle, new_values)
            assert sorted(d.id for d in documents(bundle, rows)) == ["bake", "kites", "tea"]
        else:
            assert all(m == {} for m in meta.values()) and "lang" not in third.metadata_fields
            with pytest.raises(FilterError, match="lang"):
                parse_filter({"field": "lang", "eq": "fr"}, set(third.metadata_fields))
    finally:
        bundle.close()


def test_update_rejects_bad_input_naming_file_and_line(tiny_bundle: Path, tmp_path: Path) -> None:
    def changes(*lines: object) -> Path:
        return _write(tmp_path / "changes.jsonl", list(lines))

    ok = {"_id": "a", "text": "x"}
    with pytest.raises(InputError, match=r"changes\.jsonl:2: invalid JSON"):
        read_changes(changes(ok, "{not json"), None)
    with pytest.raises(InputError, match=r"changes\.jsonl:3: id 'a' already changed at .*changes\.jsonl:1"):
        read_changes(changes(ok, {"_id": "b", "text": "y"}, {"_id": "a", "delete": True}), None)
    with pytest.raises(InputError, match=r"changes\.jsonl:1: 'delete' must be true"):
        read_changes(changes({"_id": "a", "delete": "yes"}), None)
    with pytest.raises(InputError, match=r"changes\.jsonl:1: missing 'text'"):
        read_changes(changes({"_id": "a", "title": "no text"}), None)
    with pytest.raises(InputError, match=r"deletes\.txt:2: id 'a' already changed"):
        read_changes(changes(ok), _write(tmp_path / "deletes.txt", ["z", "a"]))
    with pytest.raises(InputError, match="nothing to do"):
        read_changes(None, None)
    with pytest.raises(InputError, match=r"changes\.jsonl:1: cannot delete 'ghost'"):
        update(UpdateRequest(changes=changes({"_id": "ghost", "delete": True}), base=tiny_bundle,
                             out=tmp_path / "out"))
    everything = _write(tmp_path / "all.txt", [d[0] for d in DOCS])
    with pytest.raises(InputError, match="delete every document"):
        update(UpdateRequest(delete_ids=everything, base=tiny_bundle, out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()

    cli = _forked_cli(tmp_path, ["index", "update", "--base", str(tiny_bundle), "--out", str(tmp_path / "out"),
                                 "--changes", str(changes(ok, "[1, 2]"))])
    assert cli.returncode == 2 and "changes.jsonl:2: expected a JSON object" in cli.stderr
    assert "Traceback" not in cli.stderr


def test_verify_checks_files_counts_and_teacher(tiny_bundle: Path, tmp_path: Path) -> None:
    import shutil

    [line] = verify(tiny_bundle)
    assert line.startswith(f"ok {tiny_bundle}: {len(DOCS)} docs") and "matches" in line

    def tampered(name: str) -> Path:
        copy = tmp_path / name
        shutil.copytree(tiny_bundle, copy)
        return copy

    broken = tampered("bytes")
    with (broken / "docs.sqlite").open("r+b") as fh:
        fh.seek(200)
        fh.write(b"\xff")
    cli = _forked_cli(tmp_path, ["index", "verify", str(broken)])
    assert cli.returncode == 2 and "docs.sqlite: checksum mismatch" in cli.stderr, cli.stderr

    def rewrite(path: Path, **changes: object) -> None:
        manifest = read_bundle_manifest(path).model_copy(update=changes)
        (path / "manifest.json").write_text(manifest.model_dump_json())

    miscounted = tampered("count")
    rewrite(miscounted, count=len(DOCS) - 1)
    with pytest.raises(ContractMismatch, match=f"index holds {len(DOCS)} vectors, manifest says {len(DOCS) - 1}"):
        verify(miscounted)
    foreign = tampered("teacher")
    manifest = read_bundle_manifest(foreign)
    rewrite(foreign, teacher=manifest.teacher.model_copy(update={"fingerprint": "0" * 64}))
    with pytest.raises(ContractMismatch, match=r"manifest\.json: built with teacher fingerprint 0000"):
        verify(foreign)
    with pytest.raises(ContractMismatch, match="--all needs a bundle root"):
        verify(tiny_bundle, all_versions=True)
