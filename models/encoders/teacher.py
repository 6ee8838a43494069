"""The teacher encoder: an HF model in torch, pooled and carried through its head as its card says, L2-normalized.

Used offline (index builds, distillation targets, evaluation). Queries and documents get their own
prompt (`encode_queries`, `encode_documents`), as sentence-transformers' encode_query and
encode_document do; tests/models/encoders/test_st_parity.py holds the two to the same vectors. Batches are
sorted by length so padding is small, and with a token budget (`batch_tokens`) short texts share large batches
while long ones go in small ones. CUDA runs fp16 from pinned host memory by default; CPU runs
fp32, the reference, or bf16 on request (docs/decisions.md#the-teachers-precision-fp32-by-default-bf16-on-request).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

from models.encoders.pooling import Head, exclude_prompt, pool
from models.encoders.precision import TEACHER_PRECISIONS
from models.encoders.registry import ModelCard, load_card

log = logging.getLogger(__name__)


def pick_device(device: str | None = None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def default_precision(device: torch.device) -> str:
    return "fp16" if device.type == "cuda" else "fp32"


def token_batches(lengths: Sequence[int], batch_size: int, batch_tokens: int | None) -> list[np.ndarray]:
    """Row indices in batches, longest texts first; with `batch_tokens`, each batch's padded size fits the budget."""
    order = np.argsort(lengths, kind="stable")[::-1]
    if batch_tokens is None:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    out, start = [], 0
    while start < len(order):
        longest = max(1, lengths[order[start]])
        n = max(1, min(len(order) - start, batch_tokens // longest))
        out.append(order[start : start + n])
        start += n
    return out


class TeacherEncoder:
    """Encodes texts into the teacher's normalized embedding space."""

    def __init__(
        self, model_dir: Path, device: str | None = None, max_seq_length: int | None = None,
        precision: str | None = None, batch_tokens: int | None = None,
    ) -> None:
        self.card: ModelCard = load_card(model_dir)
        self.device = pick_device(device)
        self.precision = precision or default_precision(self.device)
        if self.precision not in TEACHER_PRECISIONS:
            raise ValueError(f"unknown teacher precision {self.precision!r}; "
                             f"choose one of {', '.join(TEACHER_PRECISIONS)}")
        if self.precision == "fp16" and self.device.type != "cuda":
            raise ValueError("fp16 needs a CUDA device; on CPU use fp32 (the reference) or bf16")
        self.batch_tokens = batch_tokens
        self.max_seq_length = max_seq_length or self.card.max_seq_length
        hf_dir = self.card.hf_dir
        self.tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
        if self.card.lowercase:
            _lowercase(self.tokenizer)
        dtype = _DTYPES[self.precision]
        self.model = AutoModel.from_pretrained(str(hf_dir), dtype=dtype).to(self.device).eval()
        self.head = Head(self.card, Path(self.card.path)).to(self.device).eval()  # fp32, after pooling
        self._prompt_lengths: dict[str, int] = {}
        log.info("teacher %s on %s (%s), max_seq_length=%d, %s", self.card.name, self.device, self.precision,
                 self.max_seq_length, self.card.summary())

    @property
    def dim(self) -> int:
        return self.card.dim

    def encode_queries(self, texts: Sequence[str], batch_size: int = 32, progress: bool = False,
                       on_progress: Callable[[int], object] | None = None) -> np.ndarray:
        """Queries, with the query prompt: float32 [len(texts), dim] unit vectors, in input order."""
        return self._encode(texts, "query", batch_size, progress, on_progress)

    def encode_documents(self, texts: Sequence[str], batch_size: int = 32, progress: bool = False,
                         on_progress: Callable[[int], object] | None = None) -> np.ndarray:
        """Documents, with the document prompt: float32 [len(texts), dim] unit vectors, in input order.

        `progress` shows a bar; `on_progress(n)` lets a caller with its own bar follow along.
        """
        return self._encode(texts, "document", batch_size, progress, on_progress)

    def _prompt_length(self, prompt: str) -> int:
        """Tokens the prompt takes at the start of a text, as sentence-transformers counts them: the prompt
        tokenized alone, less a trailing special token (what include_prompt=False leaves out of pooling)."""
        if prompt not in self._prompt_lengths:
            ids = self.tokenizer([prompt], truncation=True, max_length=self.max_seq_length)["input_ids"][0]
            self._prompt_lengths[prompt] = len(ids) - (1 if ids and ids[-1] in self.tokenizer.all_special_ids else 0)
        return self._prompt_lengths[prompt]

    @torch.inference_mode()
    def _encode(
        self,
        texts: Sequence[str],
        role: Literal["query", "document"],
        batch_size: int,
        progress: bool,
        on_progress: Callable[[int], object] | None,
    ) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        prompt = self.card.prompt(role)
        texts = [prompt + t for t in texts] if prompt else list(texts)
        excluded = self._prompt_length(prompt) if prompt and not self.card.include_prompt else 0
        lengths = [len(ids) for ids in self.tokenizer(texts, truncation=True,
                                                         max_length=self.max_seq_length)["input_ids"]]
        bar = tqdm(total=len(texts), desc="teacher", unit="doc", disable=not progress, smoothing=0.1)
        pin = self.device.type == "cuda"
        for idx in token_batches(lengths, batch_size, self.batch_tokens):
            batch = self.tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_seq_length,
                return_tensors="pt",
            )
            ids, mask = batch["input_ids"], batch["attention_mask"]
            if pin:  # pinned pages let the copy to the GPU run asynchronously
                ids, mask = ids.pin_memory(), mask.pin_memory()
            ids, mask = ids.to(self.device, non_blocking=pin), mask.to(self.device, non_blocking=pin)
            hidden = self.model(input_ids=ids, attention_mask=mask)[0]
            kept = exclude_prompt(mask, excluded) if excluded else mask
            pooled = self.head(pool(hidden.float(), kept, self.card.pooling, full_mask=mask))
            out[idx] = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
            bar.update(len(idx))
            if on_progress is not None:
                on_progress(len(idx))
        bar.close()
        return out


def _lowercase(tokenizer: object) -> None:
    """Lowercase before the tokenizer's own normalizer, as sentence-transformers applies do_lower_case."""
    from tokenizers.normalizers import Lowercase
    from tokenizers.normalizers import Sequence as NormalizerSequence

    backend = tokenizer.backend_tokenizer  # type: ignore[attr-defined]
    current = backend.normalizer
    rest: list[object] = [] if current is None else [current]
    if isinstance(current, NormalizerSequence):
        rest = [n for n in current]  # type: ignore[attr-defined]  # a Sequence iterates its normalizers
    if not any(isinstance(n, Lowercase) for n in rest):
        backend.normalizer = NormalizerSequence([Lowercase(), *rest])
