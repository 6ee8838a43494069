"""Export a trained static student: its folded token table as one .npy, with the same parity gate as a graph.

No ONNX here: serving a static student is a gather and a mean over a memory-mapped table
(models/encoders/static_table.py). The parity check runs the published directory through `StudentEncoder`, the
very path the service takes, against the torch model's vectors; there is no int8 graph, so the report's int8
figures are the table's too.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from models.bundle.staging import staged
from models.distill.exporting.export import FP32_MIN_COSINE
from models.distill.static import StaticModel
from models.distill.texts.tokens import Tokens, embed
from models.encoders.student import StudentEncoder
from models.encoders.student_manifest import STUDENT_MANIFEST, ParityReport, StudentManifest
from models.errors import ContractMismatch

log = logging.getLogger(__name__)

TABLE_FILE = "table.npy"


def export_static(
    model: StaticModel, tokenizer_dir: Path, manifest: StudentManifest, out: Path, parity_texts: Sequence[str],
    force: bool = False,
) -> StudentManifest:
    """Write the student directory atomically; `manifest` is completed with the architecture, table and parity."""
    started = time.perf_counter()
    manifest = manifest.model_copy(update={"architecture": "static", "table": TABLE_FILE})
    tokens = Tokens(Path(tokenizer_dir) / "tokenizer.json", manifest.max_seq_length)
    model = model.to("cpu").eval()
    with staged(Path(out), force) as staging:
        np.save(staging / TABLE_FILE, np.ascontiguousarray(model.folded_table(), dtype=np.float32))
        shutil.copyfile(Path(tokenizer_dir) / "tokenizer.json", staging / manifest.tokenizer)
        (staging / STUDENT_MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
        reference = embed(model, tokens, tokens.encode(parity_texts), model.forward, torch.device("cpu"))
        served = StudentEncoder(staging, precision="fp32").encode(parity_texts)
        cosines = np.sum(served * reference, axis=1)
        parity = ParityReport(texts=len(parity_texts), fp32_mean_cosine=float(cosines.mean()),
                              int8_mean_cosine=float(cosines.mean()), int8_min_cosine=float(cosines.min()))
        log.info("parity on %d held-out texts: table %.6f (min %.6f)", parity.texts, parity.fp32_mean_cosine,
                 parity.int8_min_cosine)
        if parity.fp32_mean_cosine < FP32_MIN_COSINE:
            raise ContractMismatch(f"the static table does not reproduce the torch student: mean cosine "
                                   f"{parity.fp32_mean_cosine:.5f} (needs ≥ {FP32_MIN_COSINE})")
        manifest = manifest.model_copy(update={"parity": parity})
        (staging / STUDENT_MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    log.info("static student exported to %s in %.1fs", out, time.perf_counter() - started)
    return manifest
