"""`tandem index build --segment-rows N`: a version written as several segments of at most N rows.

Why: a shard of the sharded service (models.search.shards) is a set of whole segments, so a corpus that outgrows
one box must be built as several. Each segment is what an update or a compaction writes (indexer.versions.segments):
its own docstore, first stage, lexical and payload indexes, and embedding-store entry, so later updates, compactions
and refreshes treat it as any other segment. Its index is the build's type sized for its own rows (an IVF's lists
follow the segment, not the corpus), scored in the version's space, which the first segment's rows fit.

The corpus is ingested and encoded once, whole (a killed build resumes as before); the split reads the ingested
docstore and the corpus's store entry back, one range of rows at a time.
"""

from __future__ import annotations

import itertools
import logging
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.versions.next_version import with_fields, with_segments
from indexer.versions.segments import segment_indexes
from models.bundle.manifest import SEGMENTS_DIRECTORY, BundleManifest, EmbeddingSource
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore, write_docstore
from models.bundle.vectors.index_spec import IndexSpec
from models.bundle.vectors.space import Space
from models.corpus import CorpusHasher, Document
from models.embeddings.store import EmbeddingStore, store_key
from models.encoders.registry import ModelCard
from models.errors import InputError
from models.hashing import sha256_file

log = logging.getLogger(__name__)

INGESTED = ".ingested"  # the whole corpus's docstore while the build splits it (never published)
READ_ROWS = 10_000  # documents read from the ingested docstore at a time


def row_ranges(count: int, rows: int | None) -> list[tuple[int, int]]:
    """[start, stop) of each segment: as few as hold at most `rows` each, their sizes within one of each other
    (so shards of whole segments come out even)."""
    if rows is None or count <= rows:
        return [(0, count)]
    parts = -(-count // rows)
    base, extra = divmod(count, parts)
    bounds = np.cumsum([0] + [base + (i < extra) for i in range(parts)])
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def check_segment_rows(rows: int | None) -> None:
    if rows is not None and rows < 1:
        raise InputError(f"--segment-rows must be at least 1, got {rows}")


def sliced(chunks: Iterable[np.ndarray], start: int, stop: int) -> Iterator[np.ndarray]:
    """Rows [start, stop) of a stream of row-ordered chunks."""
    at = 0
    for chunk in chunks:
        lo, hi = max(start - at, 0), min(stop - at, len(chunk))
        if lo < hi:
            yield chunk[lo:hi]
        at += len(chunk)
        if at >= stop:
            return


@dataclass
class Split:
    """The build's corpus (ingested docstore, store entry) being written as segments."""

    staging: Path
    store: EmbeddingStore
    key: str  # the whole corpus's store entry
    card: ModelCard
    source: EmbeddingSource  # the whole corpus's
    ranges: list[tuple[int, int]]
    first_source: EmbeddingSource | None = None  # the first segment's own store entry, once written

    @classmethod
    def set_aside(cls, staging: Path, store: EmbeddingStore, card: ModelCard, source: EmbeddingSource,
                  ranges: list[tuple[int, int]]) -> Split:
        """Move the ingested docstore aside and write the first segment's (rows of the first range) in its place;
        the first segment's vectors get a store entry of their own (an entry's rows are its segment's)."""
        assert source.store_key is not None
        (staging / INGESTED).mkdir()
        (staging / DOCSTORE_FILE).rename(staging / INGESTED / DOCSTORE_FILE)
        split = cls(staging, store, source.store_key, card, source, ranges)
        split.first_source = split._write(staging / DOCSTORE_FILE, *ranges[0])
        return split

    def first_vectors(self) -> Callable[[], Iterable[np.ndarray]]:
        start, stop = self.ranges[0]
        return lambda: sliced(self.store.iter_chunks(self.key), start, stop)

    def _write(self, path: Path, start: int, stop: int) -> EmbeddingSource:
        """The docstore of rows [start, stop) at `path`, and their vectors' store entry (keyed by their texts)."""
        hasher = CorpusHasher()
        write_docstore(path, hasher.passing(self._documents(start, stop)), chunk=READ_ROWS)
        precision = self.source.precision or "fp32"
        key = store_key(self.card.fingerprint, self.card.max_seq_length, hasher.hexdigest(), precision)
        if not self.store.complete(key):
            self.store.put_stream(key, sliced(self.store.iter_chunks(self.key), start, stop),
                                  {"source": "split", "teacher": self.card.fingerprint,
                                   "max_seq_length": self.card.max_seq_length, "precision": precision})
        return self.source.model_copy(update={"store_key": key})

    def _entry(self, source: EmbeddingSource) -> Callable[[], Iterable[np.ndarray]]:
        key = source.store_key
        assert key is not None
        return lambda: self.store.iter_chunks(key)

    def _documents(self, start: int, stop: int) -> Iterator[Document]:
        docs = DocStore(self.staging / INGESTED / DOCSTORE_FILE)
        try:
            for at in range(start, stop, READ_ROWS):
                yield from docs.range(at, min(at + READ_ROWS, stop))
        finally:
            docs.close()

    def finish(self, manifest: BundleManifest, spec: Callable[[int], IndexSpec]) -> BundleManifest:
        """Write every segment after the first (`manifest` describes the first alone) and return the version's
        manifest over all of them; the ingested docstore is removed. The version's `embeddings` stays the whole
        corpus's entry (what `tandem distill` reads its documents' targets from); each segment names its own."""
        first = manifest.parts[0].model_copy(update={"count": self.ranges[0][1], "embeddings": self.first_source})
        parts, files = [first], dict(manifest.files)
        payload, keys = manifest.payload, set(manifest.metadata_fields)
        space = Space.of(self.staging, manifest)
        for i, (start, stop) in enumerate(self.ranges[1:], start=1):
            name = f"{first.name}-{i}"
            directory = self.staging / SEGMENTS_DIRECTORY / name
            directory.mkdir(parents=True)
            source = self._write(directory / DOCSTORE_FILE, start, stop)
            info, names, docs = segment_indexes(directory, stop - start, self._entry(source), manifest, space, name,
                                                source, spec=spec(stop - start))
            try:
                keys.update(docs.metadata_fields())
            finally:
                docs.close()
            parts.append(info)
            files.update({f"{info.path}/{n}": sha256_file(directory / n) for n in names})
            payload = with_fields(payload, info.payload)
        shutil.rmtree(self.staging / INGESTED)
        log.info("written as %d segments of %s rows", len(parts), "/".join(str(b - a) for a, b in self.ranges))
        corpus = manifest.corpus.model_copy(update={"segments": len(parts)})
        return with_segments(manifest, parts, count=self.ranges[-1][1], files=files, payload=payload,
                             metadata_fields=sorted(keys), corpus=corpus)

