"""`tandem index build`: corpus → teacher embeddings (cached) → FAISS bundle, published atomically.

The build streams: the corpus goes into the staging docstore in one pass, the teacher (or an
import) fills the embedding store shard by shard, and the writer reads the shards back into the
index (indexer.writer). Peak memory is the first stage plus a bounded working set.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from indexer.encoding.encode import TeacherRun, encode_into, local_device, local_teacher
from indexer.intake.imported import ImportSpec, import_into, source_digest
from indexer.intake.ingest import IngestedCorpus, Passages, ingest_corpus
from indexer.options import Engine
from indexer.publish import Target, publish
from indexer.sample import add_samples, sample_size
from indexer.split import Split, check_segment_rows, row_ranges
from indexer.writer import write_doc_indexes, write_manifest, write_vectors, write_version_manifest
from models.bundle.manifest import BundleManifest, CorpusInfo, EmbeddingSource
from models.bundle.payload.fields import declared_fields
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore, DocstoreWriter
from models.bundle.vectors.index_spec import IndexSpec, Quantization, resolve_spec
from models.bundle.vectors.rotation import Rotation
from models.bundle.vectors.space import VectorSource
from models.contract import SUPPORTED_DIMS
from models.embeddings.store import SHARD_SIZE, EmbeddingStore, ShardRunner, store_key
from models.encoders.precision import AUTO, local_precision
from models.encoders.registry import ModelCard, load_card, resolve
from models.errors import InputError
from models.hashing import sha256_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildRequest:
    """Every choice of `tandem index build`, checked by `check()` before any work starts."""

    corpus: Path
    out: Path | None = None
    dim: int | None = None  # None: the teacher's own dim
    quantization: str = "float"
    rotation: str = "none"
    teacher: Path | None = None
    embeddings: Path | None = None
    ids: Path | None = None
    id_column: str = "id"
    vector_column: str = "vector"
    batch_size: int = 32
    device: str | None = None
    force: bool = False
    store: Path | None = None
    root: Path | None = None
    version: str | None = None
    keep: int | None = None
    shard_size: int = SHARD_SIZE
    index: str = "auto"  # by corpus size (models.bundle.vectors.index_spec.auto_type)
    hnsw_m: int | None = None
    ef_construction: int | None = None
    ef_search: int | None = None
    ivf_nlist: int | None = None
    ivf_nprobe: int | None = None
    precision: str | None = None
    batch_tokens: int | None = None
    engine: str = "local"
    ray_address: str | None = None
    ray_actors: int | None = None
    ray_threads: int = 1
    metadata_extra: bool = False
    fields: tuple[str, ...] = ()  # --field NAME:TYPE, each a declared payload field (models.bundle.payload.fields)
    # binary: subtract the corpus mean, then spin, before taking signs (models.bundle.vectors.space)
    binary_center: bool = True
    # the local teacher stays loaded after the build (models.encoders.teacher_cache) for what this process runs next
    # with it, its agreement sample first: `tandem demo serve` distills next, with the same teacher
    keep_teacher: bool = False
    segment_rows: int | None = None  # --segment-rows: the version as segments of at most this many rows (indexer.split)

    @property
    def target(self) -> Target:
        return Target(out=self.out, root=self.root, version=self.version, keep=self.keep, force=self.force)

    @property
    def run(self) -> TeacherRun:
        return TeacherRun(device=self.device, precision=self.precision, batch_size=self.batch_size,
                          batch_tokens=self.batch_tokens, engine=self.engine, ray_address=self.ray_address,
                          ray_actors=self.ray_actors, ray_threads=self.ray_threads)

    def index_spec(self, quantization: Quantization, count: int) -> IndexSpec:
        return resolve_spec(self.index, quantization, count, hnsw_m=self.hnsw_m,
                            ef_construction=self.ef_construction, ef_search=self.ef_search,
                            ivf_nlist=self.ivf_nlist, ivf_nprobe=self.ivf_nprobe)


def _quantization(value: str) -> Quantization:
    try:
        return Quantization(value)
    except ValueError:
        choices = ", ".join(q.value for q in Quantization)
        raise InputError(f"unknown quantization {value!r}; choose one of {choices}") from None


def _rotation(value: str) -> Rotation:
    try:
        return Rotation(value)
    except ValueError:
        raise InputError(f"unknown rotation {value!r}; choose one of {', '.join(r.value for r in Rotation)}") from None


def _check_dim(dim: int | None, card: ModelCard, quantization: Quantization) -> int:
    """The bundle's dim: the teacher's own (the default), or one of the MRL dims below it."""
    allowed = [card.dim, *(d for d in SUPPORTED_DIMS if d < card.dim)]
    dim = card.dim if dim is None else dim
    if dim not in allowed:
        raise InputError(f"--dim {dim} is not supported for a {card.dim}-d teacher; choose one of "
                         f"{', '.join(map(str, allowed))}")
    if quantization is Quantization.BINARY and dim % 8:
        raise InputError(f"--quantization binary packs 8 dims a byte: --dim {dim} is not a multiple of 8")
    return dim


def import_vectors(
    req: BuildRequest, card: ModelCard, corpus: IngestedCorpus, docstore: DocstoreWriter, store: EmbeddingStore
) -> EmbeddingSource:
    """Stream an import into the store entry of this corpus (imports always replace what the entry held)."""
    assert req.embeddings is not None
    key = store_key(card.fingerprint, card.max_seq_length, corpus.key)
    spec = ImportSpec(Path(req.embeddings), req.ids, req.id_column, req.vector_column)
    import_into(spec, docstore, corpus.count, card.dim, store, key,
                {"source": "imported", "path": str(req.embeddings), "teacher": card.fingerprint})
    return EmbeddingSource(kind="imported", path=str(Path(req.embeddings).resolve()), sha256=source_digest(spec),
                           store_key=key)


def teacher_vectors(
    req: BuildRequest, card: ModelCard, corpus: IngestedCorpus, docs: DocStore, store: EmbeddingStore
) -> EmbeddingSource:
    """Make the store entry of this corpus complete: cached, or encoded now (resumably, shard by shard)."""
    run = req.run
    precision = resolved_precision(run)
    key = store_key(card.fingerprint, card.max_seq_length, corpus.key, precision)
    if store.complete(key):
        log.info("reusing %d cached teacher embeddings (store key %s)", corpus.count, key)
    else:
        runner = _runner(run, precision, card, corpus, docs, req.keep_teacher)
        encode_into(store, key, corpus.count, runner, card, run, precision)
    meta = store.meta(key)
    imported = meta.get("source") == "imported"
    if imported:
        return EmbeddingSource(kind="imported", store_key=key)
    return EmbeddingSource(kind="encoded", store_key=key, precision=str(meta.get("precision", "fp32")),
                           device=_text(meta.get("device")), engine=_text(meta.get("engine")))


def resolved_precision(run: TeacherRun) -> str:
    """The precision the vectors will have: given, else fp16 on CUDA and fp32 on CPU (on Ray: the cluster's).

    `auto` runs locally as models.encoders.precision.auto_precision picks from this CPU's flags; on Ray, whose
    actors may run on other CPUs, it is the cluster's default."""
    if run.precision is not None and run.precision != AUTO:
        return run.precision
    if run.engine == Engine.LOCAL:
        return local_precision(run.precision, run.device or local_device()).value
    from indexer.encoding.ray_engine import default_precision

    return default_precision(run.ray_address)  # fp16 on a cluster with GPUs


def _sample_precision(run: TeacherRun, source: EmbeddingSource) -> str:
    """The agreement sample's teacher runs as the build's did where that ran here (so a kept teacher is reused, and
    `auto` is what this machine picks); after a Ray build or an import, in fp32, the reference."""
    if run.engine == Engine.LOCAL and source.kind == "encoded" and source.precision:
        return source.precision
    return "fp32"


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _runner(run: TeacherRun, precision: str, card: ModelCard, corpus: IngestedCorpus, docs: DocStore,
            keep: bool = False) -> ShardRunner:
    if run.engine == Engine.RAY:
        from indexer.encoding.ray_engine import ray_runner

        return ray_runner(run, precision, card, corpus)
    return local_teacher(Passages(docs, corpus.count), card, run, precision, keep)


def _check_shard_size(size: int) -> None:
    if size < 1:
        raise InputError(f"--shard-size must be at least 1, got {size}")


def build(req: BuildRequest) -> BundleManifest:
    """Embed (or import) a corpus and publish its bundle atomically; a killed build resumes from its shards."""
    started = time.perf_counter()
    quantization = _quantization(req.quantization)
    rotation = _rotation(req.rotation)
    fields = declared_fields(req.fields)
    _check_shard_size(req.shard_size)
    check_segment_rows(req.segment_rows)
    sample_size()  # a bad TANDEM_AGREEMENT_SAMPLE is refused before any work
    req.run.check()
    req.target.check()
    card = load_card(resolve("teacher", req.teacher))
    dim = _check_dim(req.dim, card, quantization)
    store = EmbeddingStore(req.store, shard_size=req.shard_size)
    with publish(req.target) as (staging, version):
        writer = DocstoreWriter(staging / DOCSTORE_FILE)
        try:
            corpus = ingest_corpus(Path(req.corpus), writer, extra_metadata=req.metadata_extra, fields=fields)
            log.info("corpus %s: %d documents", req.corpus, corpus.count)
            index = req.index_spec(quantization, corpus.count)  # refused here, before any encoding
            if req.embeddings is not None:
                source = import_vectors(req, card, corpus, writer, store)
        finally:
            writer.close()
        if req.embeddings is None:
            docs = DocStore(staging / DOCSTORE_FILE)
            try:
                source = teacher_vectors(req, card, corpus, docs, store)
            finally:
                docs.close()
        key = source.store_key
        assert key is not None
        ranges = row_ranges(corpus.count, req.segment_rows)
        first = ranges[0][1]  # rows of the first segment (the whole corpus unless --segment-rows splits it)
        vectors: VectorSource = lambda: store.iter_chunks(key)  # noqa: E731
        split = None
        if len(ranges) > 1:
            split = Split.set_aside(staging, store, card, source, ranges)
            vectors = split.first_vectors()
            index = req.index_spec(quantization, first)
        described, index_names = write_doc_indexes(staging, first, fields)
        centered = req.binary_center and quantization is Quantization.BINARY
        names = write_vectors(staging, first, vectors, dim=dim,
                              quantization=quantization, rotation=rotation, index=index, center=centered,
                              spin=centered)
        info = CorpusInfo(path=str(Path(req.corpus).resolve()), sha256=sha256_file(Path(req.corpus)),
                          count=corpus.count, metadata_extra=req.metadata_extra)
        manifest = write_manifest(staging, [*names, DOCSTORE_FILE, *index_names], teacher=card.teacher_ref(),
                                  dim=dim,
                                  quantization=quantization, count=corpus.count,
                                  build_seconds=round(time.perf_counter() - started, 3), corpus=info,
                                  embeddings=source, version=version, rotation=rotation, index=index,
                                  binary_center=centered, binary_spin=centered, **described)
        if split is not None:
            manifest = split.finish(manifest, lambda rows: req.index_spec(quantization, rows))
        manifest = add_samples(staging, manifest, [p.name for p in manifest.parts], card, req.device, req.keep_teacher,
                               _sample_precision(req.run, source), req.batch_tokens)
        write_version_manifest(staging, manifest)
    log.info("published %s in %.1fs", req.target.describe(version), time.perf_counter() - started)
    return manifest
