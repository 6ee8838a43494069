"""Index builds with the real teacher and FAISS: round trips, quantizations, imports, atomic publish."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from indexer.versions.compact import compact
from indexer.versions.merge_policy import MergePolicy
from indexer.versions.request import VersionRequest
from indexer.versions.update import UpdateRequest, update
from models.bundle.manifest import BundleManifest
from models.bundle.staging import staged
from models.bundle.version import Bundle, read_bundle_manifest
from models.contract import TeacherRef
from models.corpus import read_corpus
from models.embeddings.store import EmbeddingStore
from models.encoders.precision import cpu_flags
from models.encoders.teacher import TeacherEncoder
from models.errors import ContractMismatch, InputError
from models.search import dense_hits
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.tiny_home import TINY_DIM

DEFAULT_SCIFACT = Path(__file__).resolve().parents[3] / "shared/data/scifact"
SCIFACT = Path(os.environ.get("TANDEM_SCIFACT_DIR", DEFAULT_SCIFACT))


@pytest.fixture(scope="module")
def teacher(teacher_dir: Path) -> TeacherEncoder:
    return TeacherEncoder(teacher_dir)


@pytest.fixture(scope="module")
def probe_vectors(teacher: TeacherEncoder) -> np.ndarray:
    return teacher.encode_queries(list(PROBES))


def test_bundle_round_trip(tiny_bundle: Path, tiny_corpus: Path, probe_vectors: np.ndarray) -> None:
    manifest = read_bundle_manifest(tiny_bundle)
    assert manifest.count == len(DOCS) and manifest.dim == 768 and manifest.quantization.value == "float"
    assert manifest.embeddings.kind == "encoded"
    assert {"index.faiss", "docs.sqlite"} <= set(manifest.files)
    assert manifest.lexical is not None and manifest.fusion is not None  # every new bundle has a lexical index
    assert {n for n in manifest.files if n.startswith("lexical/")} == {
        f"lexical/{name}" for name in ("terms.bin", "terms.offsets.npy", "postings.offsets.npy", "postings.rows.npy",
                                       "postings.tf.npy", "lengths.npy", "terms.max_tf.npy", "terms.min_length.npy")}
    bundle = Bundle(tiny_bundle)
    assert bundle.ids() == [d.id for d in read_corpus(tiny_corpus)]
    hits = dense_hits(bundle, probe_vectors, k=3)
    assert [h[0].doc.id for h in hits] == list(PROBES.values())
    assert all(h[0].score > h[1].score for h in hits)
    assert hits[0][0].doc.title == "Baking bread"


VARIANTS = [(256, "int8"), (256, "binary"), (128, "binary"), (512, "float")]


@pytest.mark.parametrize(("dim", "quantization"), VARIANTS)
def test_other_dims_and_quantizations_reuse_embeddings(
    tiny_bundle: Path, tiny_corpus: Path, bundles_dir: Path, probe_vectors: np.ndarray, no_agreement_sample: None,
    dim: int, quantization: str, caplog: pytest.LogCaptureFixture,
) -> None:
    out = bundles_dir / f"tiny-{dim}-{quantization}"
    with caplog.at_level(logging.INFO, logger="indexer.build"):
        manifest = build(BuildRequest(corpus=tiny_corpus, out=out, dim=dim, quantization=quantization))
    assert "reusing 20 cached teacher embeddings" in caplog.text
    assert manifest.embeddings.store_key == read_bundle_manifest(tiny_bundle).embeddings.store_key
    bundle = Bundle(out)
    hits = dense_hits(bundle, probe_vectors, k=len(DOCS))
    assert [h[0].doc.id for h in hits] == list(PROBES.values())
    assert all(len(h) == len(DOCS) for h in hits)  # every document stays reachable
    if quantization == "binary":
        assert {"calibration.npy", "rescore.u8.npy"} <= set(manifest.files)


def test_refuses_to_overwrite_without_force(tiny_bundle: Path, tiny_corpus: Path) -> None:
    with pytest.raises(InputError, match="--force"):
        build(BuildRequest(corpus=tiny_corpus, out=tiny_bundle))


def test_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    with pytest.raises(RuntimeError), staged(out, force=False) as staging:
        (staging / "partial").write_text("half")
        raise RuntimeError("crash mid-build")
    assert list(tmp_path.iterdir()) == []


def test_force_replaces_atomically(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    for version in ("1", "2"):
        with staged(out, force=True) as staging:
            (staging / "v").write_text(version)
    assert (out / "v").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]


@pytest.mark.slow  # the build resolves the teacher model first
def test_bad_options_fail_before_encoding(tiny_corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="quantization"):
        build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "x", quantization="int4"))
    with pytest.raises(InputError, match="--dim 1000"):
        build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "x", dim=1000))


def test_import_checks_shape_norm_and_ids(tandem_home: Path, no_agreement_sample: None, tiny_corpus: Path,
                                         tmp_path: Path) -> None:
    docs = read_corpus(tiny_corpus)
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((len(docs), 768)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = [d.id for d in docs]

    def attempt(v: np.ndarray, id_list: list[str]) -> BundleManifest:
        np.save(tmp_path / "e.npy", v)
        (tmp_path / "ids.json").write_text(json.dumps(id_list))
        return build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "b", embeddings=tmp_path / "e.npy",
                                  ids=tmp_path / "ids.json", force=True, store=tmp_path / "store"))

    with pytest.raises(InputError, match="shape"):
        attempt(vecs[:, :384], ids)
    with pytest.raises(InputError, match="norm"):
        attempt(vecs * 2, ids)
    with pytest.raises(InputError, match="non-finite"):
        bad = vecs.copy()
        bad[3, 5] = np.nan
        attempt(bad, ids)
    with pytest.raises(InputError, match="not in the corpus"):
        attempt(vecs, [*ids[:-1], "stranger"])
    with pytest.raises(InputError, match="no embedding"):
        attempt(vecs[:-1].copy(), ids[:-1])
    with pytest.raises(InputError, match="duplicate id"):
        attempt(vecs, [*ids[:-1], ids[0]])
    with pytest.raises(InputError, match=f"{len(ids) - 1} rows but .*ids.json lists {len(ids)} ids \\(1 more"):
        attempt(vecs[:-1].copy(), ids)
    with pytest.raises(InputError, match=f"{len(ids)} rows but .*ids.json lists {len(ids) - 1} ids"):
        attempt(vecs, ids[:-1])
    reversed_ids = ids[::-1]
    manifest = attempt(vecs[::-1].copy(), reversed_ids)
    assert manifest.embeddings.kind == "imported"
    stored = EmbeddingStore(tmp_path / "store").load(manifest.embeddings.store_key or "")
    assert stored is not None and np.allclose(stored, vecs, atol=1e-3)  # reordered to corpus order




def test_bundle_refuses_other_teacher(tiny_bundle: Path) -> None:
    bundle = Bundle(tiny_bundle)
    other = TeacherRef(name="other", fingerprint="0" * 64, dim=768)
    with pytest.raises(ContractMismatch, match="fingerprint"):
        bundle.check_student(other)
    with pytest.raises(ContractMismatch, match="384-d"):
        bundle.check_student(bundle.teacher.model_copy(update={"dim": 384}))


def test_tampered_bundle_is_refused(tiny_bundle: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_bundle, copy)
    (copy / "index.faiss").unlink()
    with pytest.raises(ContractMismatch, match=r"missing index\.faiss"):
        Bundle(copy)
    (copy / "manifest.json").write_text("{}")
    with pytest.raises(ContractMismatch, match="invalid index bundle manifest"):
        Bundle(copy)


@pytest.mark.skipif(not (SCIFACT / "reference").is_dir(), reason="SciFact reference embeddings not present")
def test_teacher_reproduces_reference_embeddings(teacher: TeacherEncoder) -> None:
    ids = json.loads((SCIFACT / "reference/all-mpnet-base-v2.corpus.ids.json").read_text())
    ref = np.load(SCIFACT / "reference/all-mpnet-base-v2.corpus.f16.npy", mmap_mode="r")
    docs = {d.id: d for d in read_corpus(SCIFACT / "corpus.jsonl")}
    rows = [0, 17, 1000, 2500, 4000, len(ids) - 1]
    ours = teacher.encode_documents([docs[str(ids[r])].passage() for r in rows])
    theirs = np.asarray(ref[rows], dtype=np.float32)
    cos = (ours * theirs).sum(1) / np.linalg.norm(theirs, axis=1)
    assert cos.min() >= 0.9999


def test_token_budget_batches_give_the_same_vectors(tiny_teacher: Path) -> None:
    """`--batch-tokens` regroups texts by padded size; each text's vector stays what it was. Padding and masks are
    mechanics, so the tiny MPNet teacher (mean-pooled as the real one) stands in for the real one here."""
    texts = [d[2] * (1 + i % 4) for i, d in enumerate(DOCS)]
    budget = TeacherEncoder(tiny_teacher, batch_tokens=256)
    plain = TeacherEncoder(tiny_teacher)
    assert len({len(t) for t in texts}) > 1  # texts of several padded sizes, regrouped by the budget
    assert (budget.encode_documents(texts) * plain.encode_documents(texts)).sum(axis=1).min() >= 0.9999


def test_auto_precision_records_what_this_cpu_picks(tiny_home: Path, tiny_corpus: Path, no_agreement_sample: None,
                                                    tmp_path: Path) -> None:
    """`--precision auto` is resolved before encoding: the manifest records bf16 or fp32, never auto. Bookkeeping,
    so the teacher is the tiny one (tests/fixtures/tiny_home.py)."""
    manifest = build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "auto", precision="auto", device="cpu"))
    flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    expected = "bf16" if {"avx512_bf16", "amx_bf16"} & flags else "fp32"
    assert (manifest.embeddings.precision, manifest.embeddings.device) == (expected, "cpu")
    assert read_bundle_manifest(tmp_path / "auto").embeddings.precision == expected


def test_precision_is_recorded_and_keyed_apart(tiny_bundle: Path, tiny_corpus: Path, no_agreement_sample: None,
                                               tmp_path: Path) -> None:
    """bf16 vectors get their own store entry and say so in the manifest; fp32 stays the reference. No agreement
    sample, which nothing here reads (its queries would load and run the real teacher in bf16 once more; samples:
    tests/indexer/test_agreement_check.py)."""
    manifest = build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "bf16", precision="bf16"))
    reference = read_bundle_manifest(tiny_bundle).embeddings
    assert (manifest.embeddings.precision, manifest.embeddings.device, manifest.embeddings.engine) == \
        ("bf16", "cpu", "local")
    assert (reference.precision, reference.engine) == ("fp32", "local")
    assert manifest.embeddings.store_key != reference.store_key
    n = len(DOCS)
    cosine = (Bundle(tmp_path / "bf16").segments[0].vectors.index.reconstruct_n(0, n)
              * Bundle(tiny_bundle).segments[0].vectors.index.reconstruct_n(0, n)).sum(axis=1)
    assert cosine.min() >= 0.99
    with pytest.raises(InputError, match="fp16 needs a CUDA device"):
        build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "fp16", precision="fp16", device="cpu"))


def test_auto_on_a_base_of_imported_vectors_is_this_cpus_pick(tiny_home: Path, tiny_corpus: Path,
                                                              no_agreement_sample: None, tmp_path: Path) -> None:
    """Imported vectors record no precision, nor does their compaction: an update (or a follower) encodes its texts
    in fp32 by default and, with auto, in what this CPU picks (bf16 where it has native bf16), recorded on the new
    segment. Bookkeeping, so the teacher is the tiny one (tests/fixtures/tiny_home.py)."""
    docs = read_corpus(tiny_corpus)
    vecs = np.random.default_rng(0).standard_normal((len(docs), TINY_DIM)).astype(np.float32)
    np.save(tmp_path / "e.npy", vecs / np.linalg.norm(vecs, axis=1, keepdims=True))
    (tmp_path / "ids.json").write_text(json.dumps([d.id for d in docs]))
    store = tmp_path / "store"  # not the session's: these random vectors must never stand for the teacher's
    build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "imported", embeddings=tmp_path / "e.npy",
                       ids=tmp_path / "ids.json", store=store))
    changes = tmp_path / "changes.jsonl"
    changes.write_text(json.dumps({"_id": "fresh", "title": "Fresh", "text": "A new text about tides."}) + "\n")
    picked = "bf16" if {"avx512_bf16", "amx_bf16"} & cpu_flags(Path("/proc/cpuinfo").read_text()) else "fp32"
    compacted = compact(VersionRequest(base=tmp_path / "imported", out=tmp_path / "compacted", store=store),
                        MergePolicy(full=True))
    assert compacted is not None
    assert compacted.embeddings.kind == "imported"  # still none of the teacher's precisions of ours
    for base in ("imported", "compacted"):
        for requested, out, expected in ((None, "default", "fp32"), ("auto", "auto", picked)):
            manifest = update(UpdateRequest(changes=changes, base=tmp_path / base, out=tmp_path / f"{base}-{out}",
                                            precision=requested, device="cpu", store=store))
            assert manifest.segments is not None and manifest.segments[-1].embeddings is not None
            assert manifest.segments[-1].embeddings.precision == expected


def test_an_update_encodes_in_the_precision_its_base_records(tiny_home: Path, tiny_corpus: Path, tmp_path: Path,
                                                             no_agreement_sample: None,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """`index update` keeps a version's vectors in one precision: by default (and with auto) the base's; another
    is allowed with a warning and recorded on the new segment. Bookkeeping, so the teacher is the tiny one
    (tests/fixtures/tiny_home.py); how close bf16 vectors are to fp32 is asserted on the real teacher above."""
    build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "bf16", precision="bf16"))
    changes = tmp_path / "changes.jsonl"
    changes.write_text(json.dumps({"_id": "fresh", "title": "Fresh", "text": "A new text about tides."}) + "\n")
    for requested, out, expected in ((None, "kept", "bf16"), ("auto", "auto", "bf16"), ("fp32", "other", "fp32")):
        manifest = update(UpdateRequest(changes=changes, base=tmp_path / "bf16", out=tmp_path / out,
                                        precision=requested))
        assert manifest.segments is not None and manifest.segments[-1].embeddings is not None
        assert manifest.segments[-1].embeddings.precision == expected
    assert "encoded in bf16; --precision fp32" in caplog.text
