"""The teacher-layer student (Wang & Lyu): the teacher's first and last layers, distilled, exported and searched;
from the default teacher, and from tiny BERT and MPNet teachers of other poolings and a Dense head."""

from __future__ import annotations

from pathlib import Path

import pytest

from indexer.build import BuildRequest, build
from models.bundle.version import Bundle
from models.distill.exporting.export import FP32_MIN_COSINE, INT8_MIN_COSINE
from models.distill.pipeline import DistillRequest, run_distill
from models.distill.presets import Preset
from models.encoders.registry import load_card, resolve
from models.encoders.student import StudentEncoder
from models.search import dense_hits
from tests.fixtures.corpus import PROBES
from tests.fixtures.student import TEST_PRESET, TEST_SEED
from tests.fixtures.tiny_models import StSpec, TinyModels


def test_layer_indices_are_the_first_and_last_k() -> None:
    assert Preset(name="t", teacher_layers=1).layer_indices(12) == [0, 11]
    assert Preset(name="t", teacher_layers=2).layer_indices(12) == [0, 1, 10, 11]
    assert Preset(name="t", teacher_layers=4).layer_indices(6) == [0, 1, 2, 3, 4, 5]  # overlapping: all


@pytest.mark.slow
def test_teacher_layer_student_distills_exports_and_finds_the_probes(
    tiny_bundle: Path, tiny_corpus: Path, tiny_student: Path, tmp_path: Path
) -> None:
    """The real teacher cut to its first and last layers: relevance (the probes) and its activation outliers (int8
    nodes kept fp32) need the real one. One fp32 epoch, and the teacher's targets for the pseudo-queries are the
    ones the tiny student's distillation (same corpus, seed and queries) left in the store: the teacher is not
    loaded again. How the layers are kept, pooled and exported is asserted on tiny teachers below."""
    preset = TEST_PRESET.model_copy(update={"name": "layers", "student": "teacher-layers", "teacher_layers": 1,
                                            "epochs": 1, "int8_epochs": 0})
    out = tmp_path / "layers"
    manifest = run_distill(DistillRequest(corpus=tiny_corpus, index=tiny_bundle, out=out, preset=preset,
                                          seed=TEST_SEED))
    teacher = load_card(resolve("teacher"))
    assert manifest.backbone == f"{teacher.name} layers [0, 11]"
    assert manifest.backbone_fingerprint == teacher.fingerprint
    assert manifest.training["ridge_val_loss"] is None  # no projection to fit
    assert manifest.parity is not None and manifest.parity.int8_fp32_nodes  # activation outliers stay fp32
    assert manifest.parity is not None
    assert manifest.parity.fp32_mean_cosine >= FP32_MIN_COSINE and manifest.parity.int8_mean_cosine >= INT8_MIN_COSINE
    encoder = StudentEncoder(out, precision="int8")
    hits = dense_hits(Bundle(tiny_bundle), encoder.encode(list(PROBES)), k=3)
    # Two layers after three steps: every probe's document within its top 3, most of them first.
    assert all(doc in {h.doc.id for h in found} for doc, found in zip(PROBES.values(), hits, strict=True))
    assert sum(found[0].doc.id == doc for doc, found in zip(PROBES.values(), hits, strict=True)) >= len(PROBES) - 1


@pytest.mark.parametrize(("arch", "pooling", "dense"), [("bert", "cls", 64), ("mpnet", "mean", None)])
def test_teacher_layers_of_a_bert_or_mpnet_teacher_keep_its_pooling_and_head(
    tiny_models: TinyModels, tandem_home: Path, tiny_corpus: Path, tmp_path: Path, arch: str, pooling: str,
    dense: int | None,
) -> None:
    """Wang & Lyu from any BERT-family teacher: its first and last layers, pooled as it pools, through its own
    Dense head (trained on, not replaced), exported with the pooling in the graph."""
    teacher = tiny_models.st(StSpec(arch=arch, pooling=pooling, dense=dense,  # type: ignore[arg-type]
                                    prompts=(("query", "query: "), ("passage", "passage: "))))
    bundle = tmp_path / "bundle"
    build(BuildRequest(corpus=tiny_corpus, out=bundle, dim=64, teacher=teacher))
    preset = TEST_PRESET.model_copy(update={"name": "layers", "student": "teacher-layers", "teacher_layers": 1,
                                            "epochs": 1, "int8_epochs": 0})  # what is kept, not how it trains
    manifest = run_distill(DistillRequest(corpus=tiny_corpus, index=bundle, out=tmp_path / "student", preset=preset,
                                          seed=TEST_SEED, teacher=teacher))
    card = load_card(teacher)
    assert manifest.backbone == f"{card.name} layers [0, 2]"  # of 3
    assert (manifest.backbone_pooling, manifest.teacher.fingerprint) == (pooling, card.fingerprint)
    assert manifest.training["ridge_val_loss"] is None  # nothing to fit: the teacher's own head
    assert manifest.parity is not None and manifest.parity.fp32_mean_cosine >= FP32_MIN_COSINE
    vectors = StudentEncoder(tmp_path / "student", precision="fp32").encode(list(PROBES))
    assert vectors.shape == (len(PROBES), 64)
    assert len(dense_hits(Bundle(bundle), vectors, k=3)[0]) == 3
