"""The static student (issue 56): a token table trained from a tiny teacher, exported as one .npy, served by
StudentEncoder with the vectors the torch model computes, and searched through a truncated, binary bundle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from indexer.build import BuildRequest, build
from models.bundle.version import Bundle
from models.distill.exporting.export import FP32_MIN_COSINE
from models.distill.exporting.export_static import TABLE_FILE, export_static
from models.distill.pipeline import DistillRequest, run_distill
from models.distill.presets import PRESETS, Preset
from models.distill.static import StaticModel, initial_table, vocabulary_pass
from models.distill.texts.tokens import Tokens, embed
from models.encoders.registry import load_card
from models.encoders.student import StudentEncoder, load_tokenizer
from models.encoders.student_manifest import StudentManifest
from models.search import dense_hits
from tandem.provision import StudentEntry
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.student import TEST_PRESET, TEST_SEED
from tests.fixtures.tiny_models import StSpec, TinyModels

CPU = torch.device("cpu")
TEXTS = [*PROBES, *(f"{title} {text}" for _, title, text in DOCS[:4]), "  Spaced   out  ", "x"]


def test_a_static_preset_trains_no_int8_graph() -> None:
    assert PRESETS["static"].student == "static"
    with pytest.raises(ValueError, match="int8_epochs"):
        Preset(name="s", student="static", int8_epochs=1)


def test_the_served_table_computes_the_torch_students_vectors(tiny_models: TinyModels, tmp_path: Path) -> None:
    """The projection and per-token weights folded into the table, gathered and averaged by numpy, give the torch
    model's vectors, a text at a time (the /search path) and in padded batches alike."""
    card = load_card(tiny_models.st(StSpec(arch="bert", pooling="mean")))
    torch.manual_seed(0)
    model = StaticModel(initial_table(card, "embeddings", CPU), card.dim, name="tiny static")
    with torch.no_grad():
        model.token_weights.uniform_(0.2, 2.0)  # unequal weights: the fold must carry them
    manifest = StudentManifest(teacher=card.teacher_ref(), backbone=model.name,
                               backbone_fingerprint=card.fingerprint, max_seq_length=card.max_seq_length)
    out = tmp_path / "static"
    published = export_static(model, card.hf_dir, manifest, out, TEXTS)
    assert (published.architecture, published.table) == ("static", TABLE_FILE)
    assert not (out / published.onnx_int8).exists()

    tokens = Tokens(card.hf_dir / "tokenizer.json", card.max_seq_length)
    reference = embed(model, tokens, tokens.encode(TEXTS), model.forward, CPU)
    encoder = StudentEncoder(out, precision="int8")  # either precision serves the one table
    one_by_one = np.vstack([encoder.encode([text]) for text in TEXTS])
    np.testing.assert_allclose(one_by_one, reference, atol=2e-6)
    np.testing.assert_allclose(encoder.encode(TEXTS, batch_size=3), reference, atol=2e-6)
    _, counted = encoder.encode_counted(["one query"])
    assert counted == [len(tokens.encode(["one query"])[0])]
    encoder.close()


def test_the_vocabulary_pass_is_each_token_alone_through_the_teacher(tiny_models: TinyModels) -> None:
    """Model2Vec's distill without PCA: row t is the teacher's pooled output of [CLS] t [SEP], before normalizing."""
    card = load_card(tiny_models.st(StSpec(arch="bert", pooling="mean", normalize=False)))
    table = vocabulary_pass(card, CPU)
    from models.encoders.teacher import TeacherEncoder

    teacher = TeacherEncoder(Path(card.path), device="cpu")
    vocabulary = load_tokenizer(card.hf_dir / "tokenizer.json", 8)
    word = next(w for w in ("paris", "river", "the") if vocabulary.token_to_id(w) is not None)
    expected = teacher.encode_documents([word])[0]
    row = table[vocabulary.token_to_id(word)]
    np.testing.assert_allclose(row / np.linalg.norm(row), expected / np.linalg.norm(expected), atol=1e-5)


@pytest.mark.slow
def test_a_static_student_distills_and_searches_a_truncated_binary_bundle(
    tiny_models: TinyModels, tandem_home: Path, tiny_corpus: Path, tmp_path: Path
) -> None:
    """From a tiny teacher: vocabulary pass, ridge, a few steps of the transformer student's losses, export; its
    full-width vectors search a bundle built at half the width in binary, as any student's do (MRL + quantization)."""
    teacher = tiny_models.carded(StSpec(arch="mpnet", pooling="mean", hidden=128))
    bundle = tmp_path / "bundle"
    build(BuildRequest(corpus=tiny_corpus, out=bundle, dim=64, quantization="binary", teacher=teacher))
    preset = TEST_PRESET.model_copy(update={"name": "static", "student": "static", "int8_epochs": 0, "lr": 1e-3})
    out = tmp_path / "student"
    manifest = run_distill(DistillRequest(corpus=tiny_corpus, index=bundle, out=out, preset=preset, seed=TEST_SEED,
                                          teacher=teacher))
    card = load_card(teacher)
    assert (manifest.architecture, manifest.table, manifest.backbone_fingerprint) == ("static", TABLE_FILE,
                                                                                       card.fingerprint)
    assert manifest.training["steps"] and manifest.training["ridge_val_loss"] is not None
    assert manifest.parity is not None and manifest.parity.fp32_mean_cosine >= FP32_MIN_COSINE
    assert manifest.trained_on is not None and manifest.trained_on.documents == len(DOCS)
    assert "static: token table table.npy" in StudentEntry(out, manifest).describe()

    vectors = StudentEncoder(out).encode(list(PROBES))
    assert vectors.shape == (len(PROBES), card.dim)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    hits = dense_hits(Bundle(bundle), vectors, k=3)
    assert all(len(found) == 3 for found in hits)
