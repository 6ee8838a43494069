"""tandem's teacher encodes as sentence-transformers does: every pooling mode, prompts, Dense, truncation, lowercasing.

The reference is sentence-transformers itself (a test dependency): each setup is saved by its own
`save()` from a tiny random-weight BERT or MPNet encoder, then encoded by both. Queries take the
query prompt and documents the document prompt, as `encode(prompt_name=...)` takes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.encoders.encoder_setup import POOLING_MODES, Overrides
from models.encoders.registry import describe, write_card
from models.encoders.teacher import TeacherEncoder
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.tiny_models import StSpec, TinyModels

MIN_COSINE = 0.99999
PROMPTS = (("query", "query: "), ("passage", "passage: "))
QUERIES = [*PROBES, "How Does Bread RISE?", "x"]
DOCUMENTS = [f"{title} {text}" for _, title, text in DOCS[:8]] + [" ".join(text for _, _, text in DOCS[:4])]


def _reference(model_dir: Path, prompts: bool, truncate_dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu", truncate_dim=truncate_dim)
    queries = model.encode(QUERIES, prompt_name="query" if prompts else None, normalize_embeddings=True)
    documents = model.encode(DOCUMENTS, prompt_name="passage" if prompts else None, normalize_embeddings=True)
    return queries, documents


def _assert_parity(model_dir: Path, reference: tuple[np.ndarray, np.ndarray]) -> None:
    teacher = TeacherEncoder(model_dir, device="cpu")
    for ours, theirs in ((teacher.encode_queries(QUERIES), reference[0]),
                         (teacher.encode_documents(DOCUMENTS), reference[1])):
        assert ours.shape == theirs.shape
        cosines = np.sum(ours * theirs, axis=1)
        assert cosines.min() >= MIN_COSINE, cosines


@pytest.mark.parametrize("arch", ["bert", "mpnet"])
@pytest.mark.parametrize("pooling", POOLING_MODES)
@pytest.mark.parametrize("extras", ["plain", "prompts+dense"])
def test_every_pooling_mode_with_and_without_prompts_and_dense(
    tiny_models: TinyModels, arch: str, pooling: str, extras: str
) -> None:
    prompted = extras == "prompts+dense"
    spec = StSpec(arch=arch, pooling=pooling, prompts=PROMPTS if prompted else (), dense=48 if prompted else None)  # type: ignore[arg-type]
    model_dir = tiny_models.st(spec)
    card = describe(model_dir)
    assert card.pooling == pooling and card.dim == (48 if prompted else 64)
    assert (card.query_prompt, card.document_prompt) == (("query: ", "passage: ") if prompted else ("", ""))
    _assert_parity(model_dir, _reference(model_dir, prompted))


@pytest.mark.parametrize(("arch", "pooling"), [("bert", "cls"), ("mpnet", "mean"), ("bert", "weightedmean")])
def test_prompt_left_out_of_pooling(tiny_models: TinyModels, arch: str, pooling: str) -> None:
    model_dir = tiny_models.st(StSpec(arch=arch, pooling=pooling, prompts=PROMPTS, include_prompt=False))  # type: ignore[arg-type]
    assert describe(model_dir).include_prompt is False
    _assert_parity(model_dir, _reference(model_dir, prompts=True))


def test_a_legacy_directory_with_do_lower_case(tiny_models: TinyModels) -> None:
    """sentence-transformers 2.x's format (the default models'): boolean pooling keys, do_lower_case in
    sentence_bert_config.json, here over a cased tokenizer."""
    model_dir = tiny_models.st(StSpec(arch="mpnet", pooling="max", legacy=True, do_lower_case=True))
    card = describe(model_dir)
    assert (card.pooling, card.lowercase, card.max_seq_length) == ("max", True, 48)
    _assert_parity(model_dir, _reference(model_dir, prompts=False))


def test_truncate_dim(tiny_models: TinyModels) -> None:
    model_dir = tiny_models.copy(tiny_models.st(StSpec(pooling="mean", prompts=PROMPTS, dense=48)), "truncated")
    config_path = model_dir / "config_sentence_transformers.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "truncate_dim": 32}))
    assert describe(model_dir).dim == 32
    _assert_parity(model_dir, _reference(model_dir, prompts=True, truncate_dim=32))


def test_a_plain_hf_directory_with_pooling_and_prompts_given(tiny_models: TinyModels) -> None:
    """What `models add DIR --pooling cls --query-prompt …` records, against sentence-transformers told the same."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as st

    hf_dir = tiny_models.copy(tiny_models.hf("bert"), "plain-bert")
    write_card(describe(hf_dir, overrides=Overrides(pooling="cls", query_prompt="Represent this sentence: ",
                                                    document_prompt="")))
    reference = SentenceTransformer(modules=[st.Transformer(str(hf_dir)), st.Pooling(64, pooling_mode="cls")],
                                    prompts={"query": "Represent this sentence: "}, device="cpu")
    queries = reference.encode(QUERIES, prompt_name="query", normalize_embeddings=True)
    documents = reference.encode(DOCUMENTS, normalize_embeddings=True)
    _assert_parity(hf_dir, (queries, documents))
