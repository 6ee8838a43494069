"""Score distillation and ranking agreement: the properties training relies on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.contract import l2_normalize
from models.distill.training.schedule import lr_factor
from models.distill.training.scores import TOP_K, ScoreDistiller, overlap_at_k, top_k

RNG = np.random.default_rng(0)
DOCS = l2_normalize(RNG.normal(size=(200, 16))).astype(np.float32)
QUERIES = l2_normalize(RNG.normal(size=(8, 16))).astype(np.float32)


def _distiller(max_candidates: int = 10_000, temperature: float = 0.05) -> ScoreDistiller:
    return ScoreDistiller(DOCS, temperature, max_candidates, torch.device("cpu"))


def test_the_loss_is_zero_when_the_student_matches_and_grows_as_it_strays() -> None:
    scores = _distiller()
    teacher = torch.from_numpy(QUERIES)
    bank = scores.candidates(np.arange(8), RNG)
    assert scores.loss(teacher, teacher, bank).item() == pytest.approx(0.0, abs=1e-6)
    near = torch.nn.functional.normalize(teacher + 0.1 * torch.randn_like(teacher), dim=-1)
    far = torch.nn.functional.normalize(teacher + 1.0 * torch.randn_like(teacher), dim=-1)
    assert 0 < scores.loss(near, teacher, bank).item() < scores.loss(far, teacher, bank).item()


def test_the_loss_gives_gradients_to_the_student_only() -> None:
    student = torch.from_numpy(QUERIES[::-1].copy()).requires_grad_()
    teacher = torch.from_numpy(QUERIES)
    scores = _distiller()
    scores.loss(student, teacher, scores.candidates(np.arange(8), RNG)).backward()
    assert student.grad is not None and student.grad.abs().sum() > 0


def test_a_small_corpus_is_scored_in_full() -> None:
    scores = _distiller()
    scores.prepare(QUERIES)
    assert not scores.sampled and scores.candidates(np.arange(8), RNG).shape == (200, 16)


def test_a_large_corpus_is_sampled_around_each_texts_neighbours() -> None:
    scores = _distiller(max_candidates=100)
    scores.prepare(QUERIES)
    candidates = scores.candidates(np.array([0, 1]), RNG).numpy()
    assert scores.sampled and len(candidates) == 100
    rows = {tuple(np.round(v, 6)) for v in candidates}
    neighbours = top_k(QUERIES[:2], torch.from_numpy(DOCS), TOP_K)
    assert all(tuple(np.round(DOCS[i], 6)) in rows for i in neighbours.ravel())


def test_top_k_is_sorted_best_first() -> None:
    found = top_k(QUERIES, torch.from_numpy(DOCS), 5)
    expected = np.argsort(-(QUERIES @ DOCS.T), axis=1)[:, :5]
    assert (found == expected).all()


def test_overlap_is_one_for_the_teacher_itself_and_lower_for_noise() -> None:
    bank = torch.from_numpy(DOCS)
    assert overlap_at_k(QUERIES, QUERIES, bank) == 1.0
    noise = l2_normalize(RNG.normal(size=QUERIES.shape)).astype(np.float32)
    assert overlap_at_k(noise, QUERIES, bank) < 0.5


def test_learning_rate_decays_linearly_and_restarts_per_cycle() -> None:
    single = [lr_factor(s, 100, 1, 0.1) for s in range(100)]
    assert single[0] == 1.0 and single[-1] == pytest.approx(0.109) and np.all(np.diff(single) < 0)
    cycles = [lr_factor(s, 100, 2, 0.1) for s in range(100)]
    assert cycles[0] == cycles[50] == 1.0 and cycles[49] < 0.2
