"""Importing teacher embeddings computed elsewhere (a GPU or cluster job).

They are checked before anything trusts them: shape, finiteness, unit norm and exact id
coverage of the corpus; rows are reordered to corpus order.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from models.corpus import Document
from models.errors import InputError

NORM_TOLERANCE = 1e-2  # float16 storage of unit vectors is accurate to ~1e-3


def load_imported(embeddings: Path, ids_path: Path, docs: list[Document], dim: int) -> np.ndarray:
    """Return float32 [len(docs), dim] in corpus order, or raise InputError naming the problem."""
    try:
        vectors = np.load(embeddings, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise InputError(f"{embeddings}: not a readable .npy array ({exc})") from exc
    try:
        ids = json.loads(Path(ids_path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{ids_path}: not a readable JSON list of ids ({exc})") from exc
    if not isinstance(ids, list) or not all(isinstance(i, str | int) for i in ids):
        raise InputError(f"{ids_path}: expected a JSON list of document ids")
    ids = [str(i) for i in ids]
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise InputError(f"{embeddings}: shape {vectors.shape}, expected [n, {dim}] for this teacher")
    if vectors.shape[0] != len(ids):
        raise InputError(f"{embeddings}: {vectors.shape[0]} rows but {ids_path} lists {len(ids)} ids")
    position: dict[str, int] = {}
    for row, doc_id in enumerate(ids):
        if doc_id in position:
            raise InputError(f"{ids_path}: duplicate id {doc_id!r} at positions {position[doc_id]} and {row}")
        position[doc_id] = row
    missing = [d.id for d in docs if d.id not in position]
    if missing:
        raise InputError(f"{ids_path}: {len(missing)} corpus ids have no embedding (e.g. {missing[:3]})")
    extra = len(position) - len(docs)
    if extra:
        raise InputError(f"{ids_path}: {extra} ids are not in the corpus")
    out = np.asarray(vectors[[position[d.id] for d in docs]], dtype=np.float32)
    bad = ~np.isfinite(out).all(axis=1)
    if bad.any():
        raise InputError(f"{embeddings}: row {int(np.argmax(bad))} has non-finite values")
    norms = np.linalg.norm(out, axis=1)
    off = np.abs(norms - 1.0) > NORM_TOLERANCE
    if off.any():
        row = int(np.argmax(off))
        raise InputError(f"{embeddings}: vectors must be L2-normalized; doc {docs[row].id!r} has norm {norms[row]:.4f}")
    return out
