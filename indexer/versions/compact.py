"""`tandem index compact`: a version's segments merged as a merge policy plans (indexer.versions.merge_policy).

By default large segments with few deleted rows are kept and the rest merged into one new segment in the version's
space (indexer.versions.merge); when the first segment is not kept, or with `--all`, every segment is merged into one,
as a fresh build of the live documents would be, which this module writes: the live documents are read segment by
segment in row order into a new docstore and corpus.jsonl, their teacher vectors from each segment's
embedding-store entry into one entry of the compacted corpus, and the streaming build's writer (indexer.writer)
makes the rest from that entry: what the first segment fixed (the PCA rotation, the int8 calibration, the binary
center) is fitted again on the live documents, the lexical postings are rebuilt, tombstones are gone. Memory is
the streaming build's: the first stage and a chunk. A merged segment whose vectors are not in the store is encoded
again by the teacher (logged).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from indexer.encoding.encode import TeacherRun, encode_into, local_teacher
from indexer.intake.ingest import CHUNK as INGEST_CHUNK
from indexer.intake.ingest import Passages
from indexer.publish import publish
from indexer.rootlock import writer_step
from indexer.sample import merge_samples
from indexer.versions.live import has_vectors, live_documents, live_vectors
from indexer.versions.merge import merge
from indexer.versions.merge_policy import MergePolicy
from indexer.versions.next_version import base_info, stored_precision, with_segments
from indexer.versions.request import VersionRequest, base_dir
from indexer.writer import CORPUS_FILE, write_doc_indexes, write_manifest, write_vectors, write_version_manifest
from models.bundle.legacy import takes_segments
from models.bundle.manifest import BundleManifest, CorpusInfo, EmbeddingSource, SegmentInfo
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore, write_docstore
from models.bundle.vectors.index_spec import IndexSpec, IndexType, resolve_spec
from models.bundle.version import in_segment, read_bundle_manifest
from models.corpus import CorpusHasher, Document, corpus_key
from models.embeddings.store import EmbeddingStore, store_key
from models.encoders.registry import ModelCard
from models.hashing import sha256_file

log = logging.getLogger(__name__)


def compact(req: VersionRequest, policy: MergePolicy | None = None) -> BundleManifest | None:
    """Publish the base version compacted as `policy` plans (indexer.versions.merge_policy; by default large clean
    segments kept, the rest merged; `MergePolicy(full=True)`: every segment merged into one); None, publishing nothing,
    when the plan has nothing to do. Into a root, under its writer lock from reading the base to moving CURRENT
    (indexer.rootlock)."""
    req.check()
    policy = policy or MergePolicy()
    policy.check()
    with writer_step(req.root):
        source_dir = base_dir(req)
        base = read_bundle_manifest(source_dir)
        # a bundle built before segments takes none: it is rewritten whole
        plan = policy.plan(base) if takes_segments(base) else MergePolicy(full=True).plan(base)
        if plan.idle:
            log.info("nothing to compact in %s: %d segments, %d deleted rows; %s", source_dir, len(base.parts),
                     base.deleted, plan.describe())
            return None
        started = time.perf_counter()
        card, store, run = req.teacher_for(base)
        sourced, encoded = with_stored_vectors(source_dir, with_segments(base, plan.merged), store, card, run)
        if not plan.full:
            return merge(req, source_dir, base, plan, card, store, sourced.parts, encoded)
        return _compact(req, source_dir, base, card, store, sourced, encoded, started)


def _compact(req: VersionRequest, source_dir: Path, base: BundleManifest, card: ModelCard, store: EmbeddingStore,
             sourced: BundleManifest, encoded: int, started: float) -> BundleManifest:
    """Every segment merged into one, the space fitted again on the live documents."""
    with publish(req.target, what="compaction") as (staging, version):
        hasher = CorpusHasher()
        with (staging / CORPUS_FILE).open("w", encoding="utf-8") as corpus:
            docs = _recorded(live_documents(source_dir, base), hasher, corpus)
            # the build's transactions (INGEST_CHUNK documents each), so the same docstore bytes
            count = write_docstore(staging / DOCSTORE_FILE, docs, chunk=INGEST_CHUNK)
        key = store_key(card.fingerprint, card.max_seq_length, hasher.hexdigest())
        if not store.complete(key):
            store.put_stream(key, live_vectors(source_dir, sourced, store), {
                "source": "compacted", "teacher": card.fingerprint, "max_seq_length": card.max_seq_length,
                "precision": stored_precision(sourced.parts)})
        index = _index_spec(base, count)
        names = write_vectors(staging, count, lambda: store.iter_chunks(key), dim=base.dim,
                              quantization=base.quantization, rotation=base.rotation, index=index,
                              center=base.binary_center, spin=base.binary_spin)
        # the version's fields keep their types
        described, index_names = write_doc_indexes(staging, count, base.payload_fields)
        if base.fusion is not None:
            described["fusion"] = base.fusion  # a default chosen for this corpus survives its compactions
        corpus_info = CorpusInfo(path=CORPUS_FILE, sha256=sha256_file(staging / CORPUS_FILE), count=count,
                                 metadata_extra=base.corpus.metadata_extra)
        info = base_info(base, source_dir, "compact", deleted=base.deleted, encoded=encoded)
        precision = stored_precision(sourced.parts)
        source = EmbeddingSource(kind="imported", store_key=key) if precision is None else EmbeddingSource(
            kind="encoded", store_key=key, precision=precision, device=base.embeddings.device,
            engine=base.embeddings.engine)
        manifest = write_manifest(
            staging, [*names, DOCSTORE_FILE, CORPUS_FILE, *index_names], teacher=card.teacher_ref(), dim=base.dim,
            quantization=base.quantization, count=count, build_seconds=round(time.perf_counter() - started, 3),
            corpus=corpus_info, embeddings=source, version=version, base=info, rotation=base.rotation, index=index,
            binary_center=base.binary_center, binary_spin=base.binary_spin, follow=base.follow, **described)
        manifest = merge_samples(source_dir, base, staging, manifest)
        write_version_manifest(staging, manifest)
    log.info("compacted %s (%d segments, %d deleted rows) into %s: %d documents in %.1fs", source_dir,
             len(base.parts), info.deleted, req.target.describe(version), count, time.perf_counter() - started)
    return manifest


def _recorded(chunks: Iterable[list[Document]], hasher: CorpusHasher, corpus: TextIO) -> Iterator[Document]:
    """Each document, once the corpus key counts it and its corpus.jsonl line is written."""
    for chunk in chunks:
        for doc in chunk:
            hasher.update(doc)
            corpus.write(json.dumps(doc.to_json(), ensure_ascii=False) + "\n")
            yield doc


def with_stored_vectors(directory: Path, base: BundleManifest, store: EmbeddingStore, card: ModelCard,
                        run: TeacherRun) -> tuple[BundleManifest, int]:
    """`base`, each of whose segments names an embedding-store entry (or a float index) holding its vectors:
    a segment whose entry is gone is encoded again by the teacher. Returns it and how many texts were encoded."""
    parts: list[SegmentInfo] = []
    encoded = 0
    for segment in base.parts:
        if has_vectors(base, segment, store):
            parts.append(segment)
            continue
        log.warning("the vectors of segment %s are not in the embedding store: the teacher encodes its %d "
                    "documents again", segment.name, segment.count)
        docs = DocStore(directory / in_segment(segment, DOCSTORE_FILE))
        try:
            passages = Passages(docs, segment.count)
            precision = run.precision or "fp32"
            key = store_key(card.fingerprint, card.max_seq_length, corpus_key(
                doc for start in range(0, segment.count, INGEST_CHUNK)
                for doc in docs.range(start, min(start + INGEST_CHUNK, segment.count))), precision)
            runner = local_teacher(passages, card, run, precision)
            encode_into(store, key, segment.count, runner, card, run, precision)
        finally:
            docs.close()
        encoded += segment.count
        parts.append(segment.model_copy(update={"embeddings": EmbeddingSource(
            kind="encoded", store_key=key, precision=precision, device=run.device or "cpu", engine="local")}))
    return with_segments(base, parts), encoded


def _index_spec(base: BundleManifest, count: int) -> IndexSpec:
    """The version's index type for `count` documents: its parameters, but IVF's cells recomputed when the live
    documents are fewer than the cells it had."""
    spec = base.index
    if spec.type is IndexType.IVF and spec.ivf_nlist is not None and spec.ivf_nlist > count:
        log.warning("%d documents are fewer than the version's %d IVF cells: compacting into the default for them",
                    count, spec.ivf_nlist)
        return resolve_spec(spec.type.value, base.quantization, count)
    return spec
