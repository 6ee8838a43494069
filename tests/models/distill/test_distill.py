"""Distillation data, presets, ridge init and the pipeline's refusals (no training here)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from models.bundle.manifest import BUNDLE_MANIFEST
from models.contract import l2_normalize
from models.corpus import Document
from models.distill.pipeline import DistillRequest, run_distill
from models.distill.presets import PRESETS, Preset, resolve_preset
from models.distill.texts.data import MIN_VARIANT_WORDS, build_training_data, variants
from models.distill.texts.queries import read_train_queries
from models.distill.training.ridge import fit_ridge, l2_loss
from models.errors import ContractMismatch, InputError
from models.pseudo_queries import SPAN_WORDS, clean, pseudo_queries, sentences
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.student import TEST_PRESET, TEST_SEED

CORPUS = [Document(id=i, title=t, text=x) for i, t, x in DOCS]
PRESET = Preset(name="t", queries_per_doc=4, val_docs=3)


def _all_texts(data, docs=CORPUS):
    out = {}
    for name, split in (("train", data.train), ("val", data.val)):
        out[name] = [docs[r].passage() for r in split.passages] + split.queries
    return out


def _key(text: str) -> str:
    return clean(text).casefold()


def test_texts_are_non_empty_and_unique() -> None:
    texts = _all_texts(build_training_data(CORPUS, PRESET, seed=0))
    everything = texts["train"] + texts["val"]
    assert all(t.strip() for t in everything)
    assert len({_key(t) for t in everything}) == len(everything)


def test_validation_is_disjoint_and_holds_out_whole_documents() -> None:
    data = build_training_data(CORPUS, PRESET, seed=0)
    assert data.val.passages and data.val.queries
    assert not set(data.val.passages) & set(data.train.passages)
    texts = _all_texts(data)
    assert not {_key(t) for t in texts["val"]} & {_key(t) for t in texts["train"]}
    held_out = [CORPUS[r].passage() for r in data.val.passages]
    # no pseudo-query of a held-out document reaches training
    assert not [q for q in data.train.queries if any(q in passage for passage in held_out)]


def test_generation_is_deterministic_and_seeded() -> None:
    a = build_training_data(CORPUS, PRESET, seed=3)
    b = build_training_data(CORPUS, PRESET, seed=3)
    c = build_training_data(CORPUS, PRESET, seed=4)
    assert a == b
    assert (a.val.passages, a.train.queries) != (c.val.passages, c.train.queries)


def test_pseudo_queries_are_titles_sentences_and_short_spans() -> None:
    text = "The moon pulls the sea twice a day. " * 3 + " ".join(f"w{i}" for i in range(60))
    doc = Document(id="d", title="Tides", text=text)
    queries = pseudo_queries(doc, 8, random.Random(0))
    assert queries[0] == "Tides"
    assert 1 < len(queries) <= 8
    whole = sentences(text)
    for q in queries[1:]:
        assert q in whole or (SPAN_WORDS[0] <= len(q.split()) <= SPAN_WORDS[1] and q in text)


def test_queries_per_doc_caps_generation() -> None:
    for n in (1, 2, 5):
        data = build_training_data(CORPUS, Preset(name="t", queries_per_doc=n, val_docs=2), seed=0)
        assert len(data.train.queries) + len(data.val.queries) <= n * len(CORPUS)


def test_extra_queries_join_training_and_validation() -> None:
    extra = [f"question number {i} about tides" for i in range(50)]
    data = build_training_data(CORPUS, PRESET, seed=0, extra_queries=extra)
    joined = set(data.train.queries) | set(data.val.queries)
    assert set(extra) <= joined
    assert set(extra) & set(data.val.queries)  # some are held out to validate on
    # real queries come last on each side, and are counted, so training can repeat them
    assert data.train.real + data.val.real == len(extra) and data.val.real > 0
    assert set(data.train.queries[-data.train.real :]) | set(data.val.queries[-data.val.real :]) == set(extra)
    assert build_training_data(CORPUS, PRESET, seed=0).train.real == 0


def test_repeat_last_repeats_the_real_queries_only() -> None:
    from models.distill.texts.dataset import Examples

    examples = Examples([[1], [2], [3], [4]], np.arange(8, dtype=np.float32).reshape(4, 2))
    repeated = examples.repeat_last(2, 3)
    assert repeated.ids == [[1], [2], [3], [4], [3], [4], [3], [4]]
    assert np.array_equal(repeated.targets[4:6], examples.targets[2:]) and len(repeated.targets) == 8
    assert examples.repeat_last(0, 3) is examples and examples.repeat_last(2, 1) is examples


def test_max_queries_caps_pseudo_queries_but_keeps_real_ones() -> None:
    extra = [f"real question {i}" for i in range(20)]
    capped = build_training_data(CORPUS, PRESET.model_copy(update={"max_queries": 10}), seed=0, extra_queries=extra)
    real = [q for q in capped.train.queries if q in extra]
    assert len(capped.train.queries) - len(real) == 10
    assert len(real) + len([q for q in capped.val.queries if q in extra]) == len(extra)


def test_soup_members_share_validation_and_real_queries_but_draw_their_own_pseudo_queries() -> None:
    extra = [f"real question {i} about tides" for i in range(30)]
    preset = PRESET.model_copy(update={"max_queries": 40})
    first, second = (build_training_data(CORPUS, preset, seed=0, extra_queries=extra, member=m) for m in (0, 1))
    assert first == build_training_data(CORPUS, preset, seed=0, extra_queries=extra)  # member 0: as without members
    assert second.val == first.val and second.train.passages == first.train.passages
    assert second.train.real == first.train.real
    assert second.train.queries[-second.train.real :] == first.train.queries[-first.train.real :]
    pseudo = [set(d.train.queries[: len(d.train.queries) - d.train.real]) for d in (first, second)]
    assert pseudo[0] != pseudo[1] and len(pseudo[1]) == 40
    texts = _all_texts(second)
    assert not {_key(t) for t in texts["val"]} & {_key(t) for t in texts["train"]}


def test_average_states_means_floats_and_refuses_disagreeing_integers() -> None:
    import torch

    from models.distill.training.soup import average_states, member_seed

    a = {"w": torch.tensor([1.0, 3.0]), "ids": torch.tensor([0, 1])}
    b = {"w": torch.tensor([3.0, 5.0]), "ids": torch.tensor([0, 1])}
    soup = average_states([a, b])
    assert torch.equal(soup["w"], torch.tensor([2.0, 4.0])) and torch.equal(soup["ids"], a["ids"])
    with pytest.raises(ValueError, match="ids"):
        average_states([a, {"w": b["w"], "ids": torch.tensor([1, 0])}])
    assert member_seed(7, 0) == 7 and member_seed(7, 1) != member_seed(7, 2) != 7


def test_a_single_document_corpus_is_refused() -> None:
    with pytest.raises(InputError, match="at least 2 documents"):
        build_training_data(CORPUS[:1], PRESET, seed=0)


def test_presets_resolve_by_name_and_reject_unknown() -> None:
    assert resolve_preset("quick") is PRESETS["quick"]
    assert resolve_preset(TEST_PRESET) is TEST_PRESET
    with pytest.raises(InputError, match="unknown preset 'fast'"):
        resolve_preset("fast")


def test_presets_load_from_json_files_with_named_errors(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(TEST_PRESET.model_copy(update={"loss": "cosine"}).model_dump_json())
    assert resolve_preset(str(path)) == TEST_PRESET.model_copy(update={"loss": "cosine"})
    path.write_text('{"name": "bad", "epochs": 0, "loss": "l1"}')
    with pytest.raises(InputError, match=r"mine\.json: invalid preset: epochs: .*; loss: "):
        resolve_preset(str(path))
    with pytest.raises(InputError, match="cannot read the preset"):
        resolve_preset(str(tmp_path / "missing.json"))


def test_variants_crop_and_mask_within_the_query() -> None:
    query = "the gravitational pull of the moon raises and lowers sea levels twice a day"
    for seed in range(20):
        out = variants(query, random.Random(seed))
        assert out and len(out) <= 2 and query not in out
        for variant in out:
            words = variant.split()
            assert len(words) >= MIN_VARIANT_WORDS
            assert all(w in query.split() for w in words)
        cropped = out[0]
        assert cropped in query  # contiguous
    assert variants("too short", random.Random(0)) == []


def test_augmentation_adds_variants_to_training_only() -> None:
    plain = build_training_data(CORPUS, PRESET, seed=0)
    augmented = build_training_data(CORPUS, PRESET.model_copy(update={"augment": 1.0}), seed=0)
    assert augmented.val == plain.val
    assert set(plain.train.queries) < set(augmented.train.queries)
    extra = set(augmented.train.queries) - set(plain.train.queries)
    assert all(any(w in q.split() for q in plain.train.queries for w in e.split()) for e in extra)


def test_train_queries_drop_the_test_split(tmp_path: Path) -> None:
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n2\td1\t1\n")
    path = tmp_path / "queries.jsonl"
    path.write_text("".join(json.dumps({"_id": str(i), "text": f"query {i}"}) + "\n" for i in range(4)))
    assert read_train_queries(path) == ["query 0", "query 1", "query 3"]


def test_bad_train_queries_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "queries.jsonl"
    path.write_text('{"_id": "1", "text": "fine"}\n{"_id": "2"}\n')
    with pytest.raises(InputError, match=r"queries\.jsonl:2"):
        read_train_queries(path)


def test_ridge_recovers_a_linear_map() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 32))
    x, x_val = rng.normal(size=(500, 16)), rng.normal(size=(100, 16))
    t, t_val = l2_normalize(x @ w + 0.5), l2_normalize(x_val @ w + 0.5)
    fit = fit_ridge(x, t, x_val, t_val)
    assert fit.weight.shape == (32, 16) and fit.bias.shape == (32,)
    assert fit.val_loss == pytest.approx(l2_loss(x_val @ fit.weight.T + fit.bias, t_val))
    assert fit.val_loss < 0.2  # unit targets: a useless map scores about 1.4


@pytest.mark.slow
def test_distill_refuses_a_bundle_of_another_teacher(tiny_bundle: Path, tiny_corpus: Path, tmp_path: Path) -> None:
    fake = tmp_path / "other-teacher-bundle"
    shutil.copytree(tiny_bundle, fake)
    manifest = json.loads((fake / BUNDLE_MANIFEST).read_text())
    manifest["teacher"]["fingerprint"] = "0" * 64
    (fake / BUNDLE_MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ContractMismatch, match="was built with teacher"):
        run_distill(DistillRequest(corpus=tiny_corpus, index=fake, out=tmp_path / "s", preset=TEST_PRESET))


@pytest.mark.slow
def test_distill_refuses_to_overwrite_without_force(tiny_student: Path, tiny_bundle: Path, tiny_corpus: Path) -> None:
    with pytest.raises(InputError, match="already exists"):
        run_distill(DistillRequest(corpus=tiny_corpus, index=tiny_bundle, out=tiny_student, preset=TEST_PRESET,
                                   seed=TEST_SEED))


def test_probe_documents_are_trained_on_with_the_test_seed() -> None:
    data = build_training_data(CORPUS, TEST_PRESET, seed=TEST_SEED)
    held_out = {CORPUS[r].id for r in data.val.passages}
    assert not held_out & set(PROBES.values())


def test_alignment_losses_agree_on_unit_vectors() -> None:
    torch = pytest.importorskip("torch")
    from models.distill.training.loss import alignment_loss

    t = torch.nn.functional.normalize(torch.randn(8, 16), dim=-1)
    s = torch.nn.functional.normalize(t + 0.3 * torch.randn(8, 16), dim=-1)
    l2, cos = alignment_loss(s, t, "l2"), alignment_loss(s, t, "cosine")
    # For unit vectors ‖s − t‖² = 2 (1 − cos): the two losses rank students alike.
    assert float(((s - t).norm(dim=-1) ** 2).mean()) == pytest.approx(2 * float(cos), rel=1e-5)
    assert float(l2) > 0 and float(alignment_loss(t, t, "l2")) == pytest.approx(0.0, abs=1e-6)


def test_patience_counts_epochs_since_the_best() -> None:
    from models.distill.training.trainer import TrainResult, _patience_spent

    preset = PRESET.model_copy(update={"patience": 2})
    assert not _patience_spent(TrainResult(epochs=3, best_epoch=2), preset)
    assert _patience_spent(TrainResult(epochs=4, best_epoch=2), preset)
    assert not _patience_spent(TrainResult(epochs=9, best_epoch=0), PRESET)  # no patience: never
