"""An update that rewrites the whole bundle: how `tandem index update` changes a bundle built before segments.

Such a bundle's lexical index holds bm25s's scores, precomputed with its own statistics, which cannot be summed
with a later segment's (models.bundle.lexical.postings), so its first update writes every document again, as every
update did before segments: unchanged documents keep their vectors (from the embedding store entry of the base
corpus, else from a full-dimension float index), only new or changed texts go through the teacher. Replaced
documents keep their position, new ones are appended. The result is a one-segment bundle of today's format,
which later updates change by segments (indexer.versions.update). Which bundles it converts is
models.bundle.legacy.takes_segments (False: built before segments); the module says when both can go.
"""

from __future__ import annotations

import json
import logging
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from indexer.encoding.encode import TeacherRun, encode_into, local_teacher
from indexer.intake.ingest import Passages
from indexer.publish import publish
from indexer.versions.changes import Changes, read_changes
from indexer.versions.live import StoredRows
from indexer.versions.request import UpdateRequest
from indexer.writer import CORPUS_FILE, write_doc_indexes, write_manifest, write_vectors
from models.bundle.manifest import BaseInfo, BundleManifest, CorpusInfo, EmbeddingSource
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore, DocstoreWriter
from models.bundle.vectors.index_spec import Quantization
from models.bundle.vectors.rotation import Rotation
from models.bundle.version import Bundle, read_bundle_manifest
from models.corpus import CorpusHasher, Document, corpus_key
from models.embeddings.store import EmbeddingStore, store_key
from models.encoders.registry import ModelCard
from models.errors import InputError
from models.hashing import sha256_file

log = logging.getLogger(__name__)

READ_CHUNK = 10_000  # docstore rows read, and new rows merged, at a time


@dataclass
class Plan:
    """Where each row of the new corpus gets its vector: a base row (>= 0) or fresh text -(i + 1)."""

    sources: np.ndarray
    fresh: list[Document]
    counts: dict[str, int]
    base_key: str
    new_key: str


def plan_changes(bundle: Bundle, changes: Changes, out: DocstoreWriter, corpus_fh: TextIO) -> Plan:
    """Stream the base documents, apply the changes, write the new docstore and corpus.jsonl; plan the vectors."""
    deletes, upserts = dict(changes.deletes), {d.id: d for d in changes.upserts}
    counts = {"added": 0, "replaced": 0, "deleted": len(deletes), "unchanged": 0}
    base_hasher, new_hasher = CorpusHasher(), CorpusHasher()
    sources = array("q")  # 8 bytes a row, not a Python int each
    fresh: list[Document] = []
    batch: list[Document] = []

    def emit(doc: Document, source: int | None) -> None:
        if source is None:
            fresh.append(doc)
            source = -len(fresh)
        sources.append(source)
        new_hasher.update(doc)
        batch.append(doc)
        corpus_fh.write(json.dumps(doc.to_json(), ensure_ascii=False) + "\n")
        if len(batch) >= READ_CHUNK:
            out.add(batch)
            batch.clear()

    count = bundle.manifest.count
    for start in range(0, count, READ_CHUNK):
        for row, doc in enumerate(bundle.segments[0].docs.range(start, min(start + READ_CHUNK, count)), start):
            base_hasher.update(doc)
            if deletes.pop(doc.id, None) is not None:
                continue
            new = upserts.pop(doc.id, None)
            if new is None:
                emit(doc, row)
                continue
            counts["replaced" if new != doc else "unchanged"] += 1
            emit(new, row if new.passage() == doc.passage() else None)
    for doc_id, where in deletes.items():
        raise InputError(f"{where}: cannot delete {doc_id!r}: no such document in the base version")
    counts["added"] = len(upserts)
    for doc in upserts.values():  # dicts keep the changes file's order
        emit(doc, None)
    if not sources:
        raise InputError("the update would delete every document; build a new bundle instead")
    if batch:
        out.add(batch)
    return Plan(np.frombuffer(sources, dtype=np.int64), fresh, counts, base_hasher.hexdigest(),
                new_hasher.hexdigest())


class BaseVectors:
    """Full-dimension vectors of base rows, without the teacher: the store entry, or a 768-d float index."""

    def __init__(self, bundle: Bundle, card: ModelCard, store: EmbeddingStore, base_key: str) -> None:
        m = bundle.manifest
        keys = [k for k in (m.embeddings.store_key, store_key(card.fingerprint, card.max_seq_length, base_key)) if k]
        key = next((k for k in keys if store.complete(k)), None)
        self.stored = StoredRows(store, key, card.dim) if key is not None else None
        self.bundle = bundle
        self.from_index = False
        if key is not None:
            log.info("base vectors: %d from the embedding store (key %s)", m.count, key)
        elif m.quantization is Quantization.FLOAT and m.dim == card.dim and m.rotation is Rotation.NONE:
            self.from_index = True
            log.info("base vectors: not in the embedding store; reconstructed from the %d-d float index", m.dim)
        else:
            log.warning("base vectors: not in the embedding store and the index is %d-d %s; re-encoding every "
                        "document", m.dim, m.quantization.value)

    @property
    def available(self) -> bool:
        return self.stored is not None or self.from_index

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Vectors of base `rows` (ascending, as kept documents are), loading each shard once."""
        if self.stored is None:
            return self.bundle.segments[0].vectors.reconstruct(rows)  # a float index: the vectors as added
        return self.stored.take(rows)


def merged(plan: Plan, base: BaseVectors, fresh: np.ndarray) -> Iterator[np.ndarray]:
    """The new corpus's vectors in row order, chunk by chunk."""
    for start in range(0, len(plan.sources), READ_CHUNK):
        src = plan.sources[start : start + READ_CHUNK]
        out = np.empty((len(src), fresh.shape[1]), dtype=np.float32)
        kept = src >= 0
        if kept.any():
            out[kept] = base.take(src[kept])
        if (~kept).any():
            out[~kept] = fresh[-src[~kept] - 1]
        yield out


def rewrite(req: UpdateRequest, source_dir: Path) -> BundleManifest:
    """Publish the whole new corpus as one segment (the base's lexical index cannot take segments)."""
    started = time.perf_counter()
    # Change lines are parsed as the base corpus was: with --metadata-extra, a line's other keys stay metadata; and
    # the base's payload schema is kept, so a value of one of its fields must have the field's type.
    described_base = read_bundle_manifest(source_dir)
    extra = described_base.corpus.metadata_extra
    fields = described_base.payload_fields
    changes = read_changes(req.changes, req.delete_ids, extra_metadata=extra, fields=fields)
    bundle = Bundle(source_dir, lexical=False)  # its BM25 index is rebuilt, not read
    try:
        base = bundle.manifest
        card, store, run = req.teacher_for(base)
        with publish(req.target, what="update") as (staging, version):
            writer = DocstoreWriter(staging / DOCSTORE_FILE)
            try:
                with (staging / CORPUS_FILE).open("w", encoding="utf-8") as corpus_fh:
                    plan = plan_changes(bundle, changes, writer, corpus_fh)
            finally:
                writer.close()
            count = len(plan.sources)
            nlist = base.index.ivf_nlist
            if nlist is not None and nlist > count:
                raise InputError(f"the update leaves {count} documents, fewer than the base's {nlist} IVF cells; "
                                 "build a new bundle with a smaller --ivf-nlist")
            docs = DocStore(staging / DOCSTORE_FILE)
            try:
                new_key, encoded = _new_vectors(plan, bundle, card, store, docs, run)
            finally:
                docs.close()
            log.info("update of %s: %d added, %d replaced, %d deleted; encoded %d", source_dir,
                     plan.counts["added"], plan.counts["replaced"], plan.counts["deleted"], encoded)
            source = EmbeddingSource(kind="encoded" if encoded else base.embeddings.kind, store_key=new_key,
                                     precision=store.meta(new_key).get("precision", base.embeddings.precision),
                                     device=base.embeddings.device, engine=base.embeddings.engine)
            info = BaseInfo(version=base.version or source_dir.name, build_time=base.build_time, count=base.count,
                            added=plan.counts["added"], replaced=plan.counts["replaced"],
                            deleted=plan.counts["deleted"], encoded=encoded)
            names = write_vectors(staging, count, lambda: store.iter_chunks(new_key), dim=base.dim,
                                  quantization=base.quantization, rotation=base.rotation, index=base.index,
                                  center=base.binary_center, spin=base.binary_spin)
            # rebuilt: its BM25 index takes no segment; the payload columns keep the base's fields and types
            described, index_names = write_doc_indexes(staging, count, fields)
            if base.fusion is not None:
                described["fusion"] = base.fusion  # a default chosen for this corpus survives its updates
            corpus = CorpusInfo(path=CORPUS_FILE, sha256=sha256_file(staging / CORPUS_FILE), count=count,
                                metadata_extra=extra)  # the next update parses its lines the same way
            manifest = write_manifest(staging, [*names, DOCSTORE_FILE, CORPUS_FILE, *index_names],
                                      teacher=card.teacher_ref(),
                                      dim=base.dim, quantization=base.quantization, count=count,
                                      build_seconds=round(time.perf_counter() - started, 3), corpus=corpus,
                                      embeddings=source, version=version, base=info, rotation=base.rotation,
                                      index=base.index, binary_center=base.binary_center,
                                      binary_spin=base.binary_spin, **described)
    finally:
        bundle.close()
    log.info("published %s in %.1fs", req.target.describe(version), time.perf_counter() - started)
    return manifest


def _new_vectors(
    plan: Plan, bundle: Bundle, card: ModelCard, store: EmbeddingStore, docs: DocStore, run: TeacherRun
) -> tuple[str, int]:
    """Store the new corpus's vectors under its own key; returns the key and how many texts were encoded."""
    new_key = store_key(card.fingerprint, card.max_seq_length, plan.new_key)
    base = BaseVectors(bundle, card, store, plan.base_key)
    if not base.available:
        encode_into(store, new_key, len(plan.sources),
                    local_teacher(Passages(docs, len(plan.sources)), card, run, "fp32"), card, run, "fp32")
        return new_key, len(plan.sources)
    fresh = np.zeros((0, card.dim), dtype=np.float32)
    if plan.fresh:
        key = store_key(card.fingerprint, card.max_seq_length, corpus_key(plan.fresh))
        texts = [d.passage() for d in plan.fresh]
        encode_into(store, key, len(texts), local_teacher(texts, card, run, "fp32"), card, run, "fp32")
        fresh = np.concatenate(list(store.iter_chunks(key)))
    if not store.complete(new_key):
        store.put_stream(new_key, merged(plan, base, fresh), {
            "source": "updated", "teacher": card.fingerprint, "max_seq_length": card.max_seq_length,
            "base": bundle.manifest.embeddings.store_key, "precision": "fp32"})
    return new_key, len(plan.fresh)
