"""The teacher-encoding stage that `index build` and `index update` share: how the teacher runs
(`TeacherRun`), a runner that encodes in this process (`local_teacher`), and filling an embedding-store
entry with a runner (`encode_into`). The Ray runner (indexer.encoding.ray_engine) takes the same `TeacherRun`;
which runner a build uses, and the precision a Ray cluster gives, are the build's (indexer.build).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from indexer.options import Engine
from models.embeddings.store import EmbeddingStore, ShardRunner, local_runner
from models.encoders.precision import AUTO, TEACHER_PRECISIONS
from models.encoders.registry import ModelCard
from models.encoders.teacher_cache import shared_teacher
from models.errors import InputError

if TYPE_CHECKING:
    from models.encoders.teacher import TeacherEncoder


@dataclass(frozen=True)
class TeacherRun:
    """How the teacher encodes: where, in what precision, on which engine."""

    device: str | None = None
    precision: str | None = None
    batch_size: int = 32
    batch_tokens: int | None = None
    engine: str = "local"
    ray_address: str | None = None
    ray_actors: int | None = None
    ray_threads: int = 1

    def check(self) -> None:
        if self.engine not in tuple(Engine):
            raise InputError(f"unknown engine {self.engine!r}; choose one of {', '.join(e.value for e in Engine)}")
        if self.precision is not None and self.precision not in (*TEACHER_PRECISIONS, AUTO):
            raise InputError(f"unknown --precision {self.precision!r}; choose {', '.join(TEACHER_PRECISIONS)} or "
                             f"{AUTO}")
        if self.batch_size < 1 or (self.batch_tokens is not None and self.batch_tokens < 1):
            raise InputError("--batch-size and --batch-tokens must be at least 1")
        if self.ray_threads < 1 or (self.ray_actors is not None and self.ray_actors < 1):
            raise InputError("--ray-actors and --ray-threads must be at least 1")
        if self.engine == Engine.LOCAL and self.precision == "fp16" and \
                not (self.device or local_device()).startswith("cuda"):
            raise InputError("--precision fp16 needs a CUDA device; on CPU use fp32 (the reference) or bf16")


def local_device() -> str:
    """Where the local engine runs the teacher by default: CUDA when torch sees it, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def encode_into(store: EmbeddingStore, key: str, count: int, runner: ShardRunner, card: ModelCard, run: TeacherRun,
                precision: str) -> None:
    """Encode the shards entry `key` lacks with `runner`, recording in its meta what computed them."""
    meta = {"source": "encoded", "teacher": card.fingerprint, "max_seq_length": card.max_seq_length,
            "precision": precision, "engine": run.engine,
            "device": getattr(runner, "device", None) or run.device or "cpu"}
    store.ensure(key, count, runner, meta)


def local_teacher(texts: Sequence[str], card: ModelCard, run: TeacherRun, precision: str,
                  keep: bool = False) -> ShardRunner:
    """Encode shards in this process; loads torch and the teacher only now. `keep`: the teacher stays loaded for
    the next call with the same settings (a follower, which encodes a change file a minute and spent about 4 s of
    each step loading it: docs/lab/2026-11-27-scale-10m-4.md) or a demo whose distillation follows in the same
    process; else it goes with the runner."""
    if keep:  # the process's one kept teacher (models.encoders.teacher_cache), shared with the sample's queries
        encoder = shared_teacher(card.path, run.device, precision, run.batch_tokens)
    else:
        encoder = _teacher(card.path, run.device, precision, run.batch_tokens)

    def encode(batch: Sequence[str], on_progress: Callable[[int], object]) -> np.ndarray:
        return encoder.encode_documents(batch, batch_size=run.batch_size, on_progress=on_progress)

    runner = local_runner(texts, encode)
    runner.device = encoder.device.type  # type: ignore[attr-defined]
    return runner


def _teacher(path: str, device: str | None, precision: str, batch_tokens: int | None) -> TeacherEncoder:
    from models.encoders.teacher import TeacherEncoder  # torch, only when the teacher encodes

    return TeacherEncoder(Path(path), device=device, precision=precision, batch_tokens=batch_tokens)

