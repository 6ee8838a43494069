"""`tandem index update`: a new bundle version from a base bundle plus upserts and deletes.

Unchanged documents keep their vectors (from the embedding store entry of the base corpus,
else from a full-dimension float index); only new or changed texts go through the teacher.
Replaced documents keep their position, new ones are appended, deleted ones are gone for good
because every later update starts from a version that no longer has them. The new corpus is
materialized as corpus.jsonl inside the bundle and its full vectors are stored under its own
corpus key, so `tandem distill`, `tandem eval` and other dims reuse them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.build import encode_documents
from indexer.changes import Changes, read_changes
from indexer.publish import Target, publish
from indexer.writer import write_bundle
from models.bundle import Bundle
from models.contract import check_same_teacher
from models.corpus import Document, corpus_key
from models.embedding_store import SHARD_SIZE, EmbeddingStore, store_key
from models.errors import InputError
from models.manifest import BaseInfo, BundleManifest, EmbeddingSource, Quantization
from models.registry import ModelCard, load_card, resolve
from models.versions import is_bundle_root, resolve_bundle

log = logging.getLogger(__name__)

READ_CHUNK = 10_000  # docstore rows per query (SQLite caps bound parameters)


@dataclass(frozen=True)
class UpdateRequest:
    changes: Path | None = None
    delete_ids: Path | None = None
    base: Path | None = None
    root: Path | None = None
    out: Path | None = None
    version: str | None = None
    keep: int | None = None
    force: bool = False
    teacher: Path | None = None
    batch_size: int = 32
    device: str | None = None
    store: Path | None = None
    shard_size: int = SHARD_SIZE

    @property
    def target(self) -> Target:
        return Target(out=self.out, root=self.root, version=self.version, keep=self.keep, force=self.force)


def base_dir(req: UpdateRequest) -> Path:
    """--base as a version name under --root, a bundle dir or a root; default: --root's CURRENT."""
    if req.base is None:
        if req.root is None:
            raise InputError("--out needs --base (the bundle to update)")
        if not is_bundle_root(req.root):
            raise InputError(f"{req.root} has no CURRENT version to update; publish one with "
                             "`tandem index build --root`")
        return resolve_bundle(req.root)
    if req.root is not None and len(req.base.parts) == 1 and (req.root / req.base).is_dir():
        return req.root / req.base
    if not Path(req.base).is_dir():
        raise InputError(f"--base {req.base}: not a bundle directory, bundle root or version under --root")
    return resolve_bundle(req.base)


def _documents(bundle: Bundle) -> list[Document]:
    count = bundle.manifest.count
    docs: list[Document] = []
    for start in range(0, count, READ_CHUNK):
        docs.extend(bundle.docs.get(list(range(start, min(start + READ_CHUNK, count)))))
    return docs


def _base_vectors(bundle: Bundle, docs: list[Document], card: ModelCard, store: EmbeddingStore) -> np.ndarray | None:
    """Full-dimension vectors of the base documents, if they can be had without the teacher."""
    key = store_key(card.fingerprint, card.max_seq_length, corpus_key(docs))
    vectors = store.load(key)
    if vectors is not None:
        log.info("base vectors: %d from the embedding store (key %s)", len(vectors), key)
        return vectors
    m = bundle.manifest
    if m.quantization is Quantization.FLOAT and m.dim == card.dim:
        log.info("base vectors: not in the embedding store; reconstructed from the %d-d float index", m.dim)
        return np.asarray(bundle.vectors.index.reconstruct_n(0, m.count), dtype=np.float32)
    log.warning("base vectors: not in the embedding store and the index is %d-d %s; re-encoding every document",
                m.dim, m.quantization.value)
    return None


def apply_changes(base_docs: list[Document], changes: Changes) -> tuple[list[Document], dict[str, int]]:
    """The new corpus in order, and counts of added / replaced / deleted / unchanged documents."""
    present = {d.id for d in base_docs}
    for doc_id, where in changes.deletes.items():
        if doc_id not in present:
            raise InputError(f"{where}: cannot delete {doc_id!r}: no such document in the base version")
    upserts = {d.id: d for d in changes.upserts}
    counts = {"added": 0, "replaced": 0, "deleted": len(changes.deletes), "unchanged": 0}
    out: list[Document] = []
    for doc in base_docs:
        if doc.id in changes.deletes:
            continue
        new = upserts.pop(doc.id, None)
        if new is None:
            out.append(doc)
            continue
        counts["replaced" if new != doc else "unchanged"] += 1
        out.append(new)
    counts["added"] = len(upserts)
    out.extend(upserts.values())  # dicts keep the changes file's order
    if not out:
        raise InputError("the update would delete every document; build a new bundle instead")
    return out, counts


def update(req: UpdateRequest) -> BundleManifest:
    started = time.perf_counter()
    if req.shard_size < 1:
        raise InputError(f"--shard-size must be at least 1, got {req.shard_size}")
    req.target.check()
    changes = read_changes(req.changes, req.delete_ids)
    source_dir = base_dir(req)
    bundle = Bundle(source_dir)
    try:
        base = bundle.manifest
        card = load_card(resolve("teacher", req.teacher))
        check_same_teacher(card.teacher_ref(), base.teacher, what="teacher model")
        base_docs = _documents(bundle)
        docs, counts = apply_changes(base_docs, changes)
        nlist = base.index.ivf_nlist
        if nlist is not None and nlist > len(docs):
            raise InputError(f"the update leaves {len(docs)} documents, fewer than the base's {nlist} IVF cells; "
                             "build a new bundle with a smaller --ivf-nlist")
        store = EmbeddingStore(req.store, shard_size=req.shard_size)
        old_vectors = _base_vectors(bundle, base_docs, card, store)
    finally:
        bundle.close()
    reuse: dict[str, np.ndarray] = {}
    if old_vectors is not None:
        reuse = {d.id: old_vectors[i] for i, d in enumerate(base_docs)}
    by_id = {d.id: d for d in base_docs}
    todo = [d for d in docs if d.id not in reuse or by_id[d.id].passage() != d.passage()]
    log.info("update of %s: %d added, %d replaced, %d deleted; encoding %d", source_dir, counts["added"],
             counts["replaced"], counts["deleted"], len(todo))
    fresh: dict[str, np.ndarray] = {}
    if todo:
        key = store_key(card.fingerprint, card.max_seq_length, corpus_key(todo))
        encoded = store.load(key)
        if encoded is None:
            encoded = encode_documents(store, key, todo, card, req.batch_size, req.device)
        fresh = {d.id: encoded[i] for i, d in enumerate(todo)}
    vectors = np.stack([fresh[d.id] if d.id in fresh else reuse[d.id] for d in docs]).astype(np.float32)
    new_key = store_key(card.fingerprint, card.max_seq_length, corpus_key(docs))
    if store.load(new_key) is None:
        store.put(new_key, vectors, {"source": "updated", "teacher": card.fingerprint,
                                     "max_seq_length": card.max_seq_length, "base": base.embeddings.store_key})
    source = EmbeddingSource(kind="encoded" if todo else base.embeddings.kind, store_key=new_key)
    info = BaseInfo(version=base.version or source_dir.name, build_time=base.build_time, count=base.count,
                    added=counts["added"], replaced=counts["replaced"], deleted=counts["deleted"], encoded=len(todo))
    with publish(req.target) as (staging, version):
        manifest = write_bundle(staging, docs, vectors, dim=base.dim, quantization=base.quantization, card=card,
                                source=source, started=started, version=version, base=info,
                                rotation=base.rotation, index=base.index)
    log.info("published %s in %.1fs", req.target.describe(version), time.perf_counter() - started)
    return manifest
