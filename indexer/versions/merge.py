"""A compaction that keeps some segments (indexer.versions.merge_policy): the rest merged into one new segment.

The new version starts as an update's does, hard links to its base's files (indexer.versions.segments.link_version),
less those of the segments it merges. Their live documents are streamed into the new segment's docstore, their teacher
vectors from their embedding-store entries into one entry for it, and the segment's first stage, lexical and
payload indexes are written as an update writes its segment (indexer.versions.segments.segment_indexes), in the space
the
first segment fixed (models.bundle.vectors.space): nothing is fitted again, so the kept segments' scores and the merged
one's stay comparable. Disk and time follow the merged segments' rows, not the corpus's; memory is the streaming
build's (the first stage of the merged segment and a chunk).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import shutil
import time
from pathlib import Path

from indexer.intake.ingest import CHUNK as INGEST_CHUNK
from indexer.publish import publish
from indexer.sample import merge_samples
from indexer.versions.live import live_documents, live_vectors
from indexer.versions.merge_policy import MergePlan
from indexer.versions.next_version import finish, stored_precision, with_segments
from indexer.versions.request import VersionRequest
from indexer.versions.segments import link_version, segment_indexes
from indexer.writer import write_version_manifest
from models.bundle.manifest import SEGMENTS_DIRECTORY, BundleManifest, EmbeddingSource, SegmentInfo
from models.bundle.storage.docstore import DOCSTORE_FILE, write_docstore
from models.bundle.vectors.space import Space
from models.bundle.versions import new_version_name
from models.corpus import CorpusHasher
from models.embeddings.store import EmbeddingStore, store_key
from models.encoders.registry import ModelCard
from models.hashing import sha256_file

log = logging.getLogger(__name__)


def merge(req: VersionRequest, source_dir: Path, base: BundleManifest, plan: MergePlan, card: ModelCard,
          store: EmbeddingStore, sourced: list[SegmentInfo], encoded: int) -> BundleManifest:
    """Publish `base` with `plan.merged` (as `sourced`: each naming a store entry with its vectors) rewritten as
    one segment after the kept ones, their deleted rows dropped; a merge with no live row drops them."""
    started = time.perf_counter()
    dropped = {s.name for s in plan.merged}
    gone = {n for s in plan.merged for n in base.segment_files(s)} | {s.tombstones for s in plan.merged
                                                                       if s.tombstones is not None}
    inputs = with_segments(base, sourced)
    with publish(req.target, what="compaction") as (staging, version):
        files = {n: h for n, h in base.files.items() if n not in gone}
        link_version(source_dir, base.model_copy(update={"files": files}), staging)
        name = version or new_version_name()
        directory = staging / SEGMENTS_DIRECTORY / name
        directory.mkdir(parents=True)
        hasher = CorpusHasher()
        kept_rows = itertools.chain.from_iterable(live_documents(source_dir, inputs))
        count = write_docstore(directory / DOCSTORE_FILE, hasher.passing(kept_rows), chunk=INGEST_CHUNK)
        parts = [s for s in base.parts if s.name not in dropped]
        segment: SegmentInfo | None = None
        if count:
            key = store_key(card.fingerprint, card.max_seq_length, hasher.hexdigest())
            precision = stored_precision(sourced)
            if not store.complete(key):
                store.put_stream(key, live_vectors(source_dir, inputs, store), {
                    "source": "compacted", "teacher": card.fingerprint, "max_seq_length": card.max_seq_length,
                    "precision": precision})
            source = EmbeddingSource(kind="imported", store_key=key) if precision is None else EmbeddingSource(
                kind="encoded", store_key=key, precision=precision, device=base.embeddings.device,
                engine=base.embeddings.engine)
            segment, names, docs = segment_indexes(directory, count, lambda: store.iter_chunks(key), base,
                                                   Space.of(source_dir, base), name, source)
            docs.close()
            parts.append(segment)
            files.update({f"{segment.path}/{n}": sha256_file(directory / n) for n in names})
        else:  # every merged row was deleted: the segments are dropped, no segment replaces them
            shutil.rmtree(directory)
            with contextlib.suppress(OSError):  # empty unless a kept segment lives there too
                (staging / SEGMENTS_DIRECTORY).rmdir()
        live = sum(s.count - s.deleted for s in parts)
        manifest = with_segments(base, parts, count=live, files=files)
        changed = {"deleted": sum(s.deleted for s in plan.merged), "encoded": encoded}
        manifest = finish(manifest, base, source_dir, version, started, changed, action="compact")
        if segment is not None:
            manifest = merge_samples(source_dir, base, staging, manifest, plan.merged, segment)
        write_version_manifest(staging, manifest)
    log.info("compacted %s: %s, %d documents merged into segment %s, %d deleted rows dropped; published %s in "
             "%.1fs", source_dir, plan.describe(), count, name, changed["deleted"], req.target.describe(version),
             time.perf_counter() - started)
    return manifest

