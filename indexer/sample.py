"""The agreement sample of each segment a writer adds (issue 45): what `tandem index check` and the service score.

Every writer that adds a segment (build, update, follow, compact) calls this once its version's manifest is complete
in staging, before it publishes: for each new segment, pseudo-queries of up to `TANDEM_AGREEMENT_SAMPLE` (default
models.agreement.draw.DEFAULT_SAMPLE; 0: none) of its documents, the teacher's vectors of them and the teacher's
top-10 over the staged version, written into the segment as models.bundle.sample's files and listed in the manifest
it returns (so verification covers them). The teacher encodes ~100 short queries: seconds on a CPU, in the precision
the writer's own teacher ran in, with the very teacher that writer loaded where it kept it (models.encoders.
teacher_cache; a build that imported its vectors loads it for that alone). A compaction's segment keeps its inputs'
samples (their queries whose document is still live, subsampled), with the top-10 searched again, and no teacher.

The top-10 is searched in the staged version, which maps every segment's first stage: the one cost of the sample
that follows the version's size, not the change's, in time (each query reads its cells from the page cache or the
disk) but not in memory, since each query's pages are dropped after it (TANDEM_AGREEMENT_SAMPLE=0 leaves it out).
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.agreement.draw import DEFAULT_SAMPLE, draw_queries, draw_rows, seed_of
from models.bundle.manifest import BundleManifest, SegmentInfo
from models.bundle.sample import Sample, SampleRecord, read_sample, sample_names, write_sample
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore
from models.bundle.version import Bundle, in_segment
from models.encoders.registry import ModelCard
from models.encoders.teacher_cache import release_teacher, shared_teacher
from models.errors import InputError
from models.hashing import sha256_file
from models.search.query import dense_hits

log = logging.getLogger(__name__)

SAMPLE_SETTING = "TANDEM_AGREEMENT_SAMPLE"
TOP_K = 10
SEARCH_BATCH = 1  # sample queries searched at a time (VectorIndex.unmap_pages after each)


def sample_size() -> int:
    """Queries per new segment's sample, from TANDEM_AGREEMENT_SAMPLE (0 turns samples off)."""
    raw = os.environ.get(SAMPLE_SETTING, "").strip()
    if not raw:
        return DEFAULT_SAMPLE
    try:
        size = int(raw)
    except ValueError:
        size = -1
    if size < 0:
        raise InputError(f"{SAMPLE_SETTING}={raw!r}: give a whole number of queries, 0 or more (0: no sample)")
    return size


def add_samples(staging: Path, manifest: BundleManifest, names: Collection[str], card: ModelCard,
                device: str | None = None, keep_teacher: bool = False, precision: str = "fp32",
                batch_tokens: int | None = None) -> BundleManifest:
    """Write the sample of each segment of `manifest` named in `names` into `staging`; the manifest listing them
    (the caller writes it). The teacher is let go once it has encoded the queries, before the staged version is
    loaded for their top-10, so that a build's peak memory holds one of the two, not both (a 10M version's first
    stage is 1 GB, the teacher about as much); `keep_teacher` keeps it loaded for the next call (a follower, or a
    demo that distills next). `precision` and `batch_tokens` are the writer's own teacher's, so that the sample
    encodes with the teacher the writer loaded (models.encoders.teacher_cache) instead of loading another."""
    size = sample_size()
    segments = [s for s in manifest.parts if s.name in names]
    if not size or not segments:
        return manifest
    drawn: dict[str, tuple[list[str], list[str]]] = {}
    for info in segments:
        store = DocStore(staging / in_segment(info, DOCSTORE_FILE))
        try:
            drawn[info.name] = draw_queries(draw_rows(info.count, size, info.name), store.get, info.name)
        finally:
            store.close()
    texts = [q for queries, _ in drawn.values() for q in queries]
    vectors = shared_teacher(card.path, device, precision, batch_tokens).encode_queries(texts) if texts else \
        np.zeros((0, card.dim), np.float32)
    if not keep_teacher:
        release_teacher()
    samples: dict[str, Drawn] = {}
    start = 0
    for name, (queries, sources) in drawn.items():
        samples[name] = Drawn(queries, sources, vectors[start : start + len(queries)])
        start += len(queries)
    return _written(staging, manifest, samples)


def merge_samples(source: Path, base: BundleManifest, staging: Path, manifest: BundleManifest,
                  merged: list[SegmentInfo] | None = None, into: SegmentInfo | None = None) -> BundleManifest:
    """A compaction's sample: the queries of the base's `merged` segments (all of them by default) whose source
    document is live in the segment `into` of the compacted version (`manifest`; by default its one segment),
    subsampled to the sample size; the manifest listing it (the caller writes it)."""
    size = sample_size()
    inputs = base.parts if merged is None else merged
    samples = [s for s in (read_sample(source, base, info) for info in inputs) if s is not None]
    if not size or not samples:
        return manifest
    if into is None:
        (info,) = manifest.parts
    else:
        info = into
    queries = [q for s in samples for q in s.record.queries]
    sources = [src for s in samples for src in s.record.sources]
    vectors = np.concatenate([s.vectors for s in samples])
    store = DocStore(staging / in_segment(info, DOCSTORE_FILE))
    try:
        live = store.rows_of(sources)
    finally:
        store.close()
    keep = [i for i, src in enumerate(sources) if src in live]
    if len(keep) > size:
        keep = sorted(random.Random(seed_of(info.name)).sample(keep, size))
    drawn = Drawn([queries[i] for i in keep], [sources[i] for i in keep], vectors[keep])
    return _written(staging, manifest, {info.name: drawn})


@dataclass(frozen=True)
class Drawn:
    """A sample before the teacher's top-10 is searched: its queries, their source ids and teacher vectors."""

    queries: list[str]
    sources: list[str]
    vectors: np.ndarray


def _written(staging: Path, manifest: BundleManifest, drawn: dict[str, Drawn]) -> BundleManifest:
    """Search the staged version with each sample's teacher vectors (as stored: float16) for its top-10, write the
    samples, and return the manifest listing their files."""
    samples: dict[str, Sample] = {}
    # first stages mapped, their pages dropped after each query (a 10M IVF held 1 GB in the heap); rescoring rows
    # copied, not mapped: a 10M version's 640 rows a query mapped 378 MB through the map
    bundle = Bundle(staging, lexical=False, manifest=manifest, mapped=True)
    readers = [r for r in (s.vectors.read_rows_unmapped() for s in bundle.segments) if r is not None]
    try:
        for name, d in drawn.items():
            x = d.vectors.astype(np.float16).astype(np.float32)
            hits = []
            for start in range(0, len(x), SEARCH_BATCH):  # a batch at a time, its mapped pages let go after it
                hits += dense_hits(bundle, x[start : start + SEARCH_BATCH], TOP_K)
                for segment in bundle.segments:
                    segment.vectors.unmap_pages()
            record = SampleRecord(teacher_fingerprint=manifest.teacher.fingerprint, version=manifest.version,
                                  queries=d.queries, sources=d.sources,
                                  teacher_top=[[h.doc.id for h in found] for found in hits])
            samples[name] = Sample(record=record, vectors=x)
    finally:
        for reader in readers:
            reader.close()
        bundle.close()
    files = dict(manifest.files)
    by_name: dict[str, SegmentInfo] = {s.name: s for s in manifest.parts}
    for name, sample in samples.items():
        info = by_name[name]
        directory = staging if info.path == "." else staging / info.path
        write_sample(directory, sample)
        for listed in sample_names(info):
            files[listed] = sha256_file(staging / listed)
        log.info("segment %s: agreement sample of %d queries", name, len(sample))
    return manifest.model_copy(update={"files": files})
