"""Score distillation against the corpus, and the ranking agreement that validates it.

L2 alignment treats every direction of the teacher's space alike; retrieval only sees the
scores against the corpus's documents. Score distillation (EmbedDistill; Menon et al.,
"In defense of dual-encoders") adds a softmax cross-entropy between the teacher's and the
student's score distributions over the teacher's own document vectors, which are exactly
what the student's queries are searched against in asymmetric mode.

Small corpora are scored in full; larger ones through each text's teacher top-k plus a
random sample, so a step's cost stays bounded.
"""

from __future__ import annotations

import numpy as np
import torch

TOP_K = 32  # teacher neighbours kept per training text when the corpus is sampled
CHUNK = 4096  # texts scored against the corpus at once when precomputing neighbours


def top_k(vectors: np.ndarray, bank: torch.Tensor, k: int) -> np.ndarray:
    """Indices [n, k] of each vector's k highest-scoring rows of `bank`, best first."""
    k = min(k, bank.shape[0])
    out = np.empty((len(vectors), k), dtype=np.int64)
    for start in range(0, len(vectors), CHUNK):
        chunk = torch.from_numpy(vectors[start : start + CHUNK]).to(bank.device)
        out[start : start + CHUNK] = (chunk @ bank.T).topk(k, dim=1).indices.cpu().numpy()
    return out


class ScoreDistiller:
    """KL(teacher ‖ student) over softmax(scores / temperature) against the teacher's document vectors."""

    def __init__(
        self, documents: np.ndarray, temperature: float, max_candidates: int, device: torch.device
    ) -> None:
        self.bank = torch.from_numpy(np.ascontiguousarray(documents, dtype=np.float32)).to(device)
        self.temperature = temperature
        self.max_candidates = max_candidates
        self.neighbours: np.ndarray | None = None

    @property
    def sampled(self) -> bool:
        return self.bank.shape[0] > self.max_candidates

    def prepare(self, targets: np.ndarray) -> None:
        """Precompute each training text's teacher neighbours (only needed when the corpus is sampled)."""
        self.neighbours = top_k(targets, self.bank, TOP_K) if self.sampled else None

    def candidates(self, rows: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
        if not self.sampled:
            return self.bank
        assert self.neighbours is not None, "prepare() the training targets first"
        near = np.unique(self.neighbours[rows])
        others = np.ones(self.bank.shape[0], dtype=bool)
        others[near] = False
        far = rng.choice(np.flatnonzero(others), size=max(self.max_candidates - len(near), 0), replace=False)
        return self.bank[torch.from_numpy(np.concatenate([near, far])).to(self.bank.device)]

    def loss(self, student: torch.Tensor, teacher: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Mean over the batch of KL(p_teacher ‖ p_student), both softmaxes over the candidates."""
        log_p_teacher = torch.log_softmax(teacher @ candidates.T / self.temperature, dim=-1)
        log_p_student = torch.log_softmax(student @ candidates.T / self.temperature, dim=-1)
        return (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(dim=-1).mean()


def overlap_at_k(student: np.ndarray, teacher: np.ndarray, bank: torch.Tensor, k: int = 10) -> float:
    """Mean fraction of the teacher's top k documents that the student's query also ranks in its top k."""
    mine = top_k(student, bank, k)
    theirs = top_k(teacher, bank, k)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(mine, theirs, strict=True)]))
