"""The Ray engine: the teacher encodes missing shards across a Ray cluster with Ray Data.

The missing embedding-store shards become a Ray Dataset of one row, and one block, per shard: its
rows and the byte offset the driver noted while ingesting. `map_batches` runs a callable class that
loads the teacher once per actor and parses its shard's slice of the corpus file itself (so the path
must be readable on every node: a shared volume): a slice of text is read in milliseconds, and a
read task of its own would be a worker process started for it. One actor per GPU when the cluster
has GPUs, otherwise CPU actors with a set number of torch threads each. Results stream back to the
driver, which writes them into the embedding store as the same shards, logged in the same shard
log, so a killed driver or a lost worker resumes by encoding only the missing shards.
Imported only with `--engine ray`; the service never imports it. Its module imports are light
(the driver's types only for type checking): every actor imports it before it loads the teacher.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from models.corpus import parse_line
from models.errors import InputError

if TYPE_CHECKING:
    from indexer.encoding.encode import TeacherRun
    from indexer.intake.ingest import IngestedCorpus
    from models.embeddings.store import Shard, ShardRunner
    from models.encoders.registry import ModelCard

log = logging.getLogger(__name__)


def read_slice(path: str, offset: int, skip: int, count: int) -> tuple[list[str], list[str]]:
    """(ids, passages) of `count` documents after skipping `skip` from byte `offset` of the corpus file."""
    ids: list[str] = []
    passages: list[str] = []
    with open(path, "rb") as fh:
        fh.seek(offset)
        for raw in fh:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            if skip:
                skip -= 1
                continue
            doc = parse_line(line, path)
            ids.append(doc.id)
            passages.append(doc.passage())
            if len(passages) == count:
                break
    if len(passages) != count:
        raise InputError(f"{path}: ended early; was the corpus changed during the build?")
    return ids, passages


def _items(offsets: list[int], shards: list[Shard]) -> list[dict[str, int]]:
    """One row per shard: its rows [start, end) and where its slice of the corpus file begins."""
    from indexer.intake.ingest import OFFSET_STRIDE

    return [{"start": shard.start, "end": shard.end, "offset": offsets[shard.start // OFFSET_STRIDE],
             "skip": shard.start % OFFSET_STRIDE} for shard in shards]


class TeacherActor:
    """Holds one teacher per actor (loaded once), reads the shards of a block from the corpus file and encodes
    them, returned as float16 with their row numbers."""

    def __init__(self, corpus: str, model_dir: str, device: str, precision: str, batch_size: int,
                 batch_tokens: int | None, threads: int) -> None:
        import torch

        from models.encoders.teacher import TeacherEncoder

        torch.set_num_threads(threads)
        self.corpus = corpus
        self.batch_size = batch_size
        self.encoder = TeacherEncoder(Path(model_dir), device=device, precision=precision, batch_tokens=batch_tokens)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, passages = [], []
        for start, end, offset, skip in zip(batch["start"], batch["end"], batch["offset"], batch["skip"],
                                            strict=True):
            passages += read_slice(self.corpus, int(offset), int(skip), int(end - start))[1]
            rows.append(np.arange(start, end, dtype=np.int64))
        vectors = self.encoder.encode_documents(passages, batch_size=self.batch_size)
        return {"row": np.concatenate(rows), "vector": vectors.astype(np.float16)}


def connect(address: str | None) -> Any:
    """Join `address` (or RAY_ADDRESS), else start a local Ray on this machine; returns the ray module."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        # A local Ray serves this machine alone: Ray's own switch keeps it on the loopback interface.
        # It is read when ray is imported, so it is set before.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
        import ray.data  # the engine's API: missing with a partial install
    except ImportError as exc:
        raise InputError("--engine ray needs Ray: pip install 'tandem[ray]'") from exc
    if ray.is_initialized():
        return ray
    log.info("ray: %s", f"joining {address}" if address else "starting a local cluster")
    for noisy in ("ray", "ray.data"):  # its INFO lines would bury the one progress bar
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if address is None:
        ray.init(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    else:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    return ray


def default_precision(address: str | None) -> str:
    """fp16 when the cluster has GPUs (its actors run there), else fp32: known before the store key is made."""
    return "fp16" if int(connect(address).cluster_resources().get("GPU", 0)) else "fp32"


def ray_runner(run: TeacherRun, precision: str, card: ModelCard, corpus: IngestedCorpus) -> ShardRunner:
    """A ShardRunner whose shards are encoded by Ray Data actors; the driver writes what comes back."""
    ray = connect(run.ray_address)
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if gpus:
        actors, device, per_actor = gpus, "cuda", {"num_gpus": 1}
    else:
        if precision == "fp16":
            raise InputError("--precision fp16 needs GPUs, and this Ray cluster has none")
        threads = run.ray_threads
        actors = run.ray_actors or max(1, int(resources.get("CPU", 1)) // threads)
        device, per_actor = "cpu", {"num_cpus": threads}
    log.info("ray: %d %s actor(s), precision %s", actors, device, precision)

    def runner(shards: list[Shard], on_progress: Callable[[int], object]) -> Iterator[tuple[Shard, np.ndarray]]:
        if not shards:
            return
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # the store's one bar counts docs/s across the cluster
        # The shards are put in the object store from here (a few ints each): no read task, so no worker
        # process of its own; each actor reads its shard's slice of text before it encodes it.
        ds = ray.data.from_items(_items(corpus.offsets, shards), override_num_blocks=len(shards))
        encoded = ds.map_batches(
            TeacherActor, batch_size=None, batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=actors),
            fn_constructor_kwargs={"corpus": str(corpus.path), "model_dir": str(card.path), "device": device,
                                   "precision": precision, "batch_size": run.batch_size,
                                   "batch_tokens": run.batch_tokens, "threads": per_actor.get("num_cpus", 1)},
            **per_actor)
        yield from _assemble(shards, encoded.iter_batches(batch_size=None, batch_format="numpy"), on_progress)

    runner.device = device  # type: ignore[attr-defined]
    return runner


def _assemble(
    shards: list[Shard], batches: Iterator[dict[str, np.ndarray]], on_progress: Callable[[int], object]
) -> Iterator[tuple[Shard, np.ndarray]]:
    """Regroup result rows (any batching, any order) into whole shards, yielded as each completes."""
    by_start = {s.start: s for s in shards}
    starts = np.array(sorted(by_start))
    pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # shard start → (vectors, filled mask)
    for batch in batches:
        rows, vectors = np.asarray(batch["row"]), np.asarray(batch["vector"])
        on_progress(len(rows))
        owner = starts[np.searchsorted(starts, rows, side="right") - 1]
        for start in np.unique(owner):
            shard = by_start[int(start)]
            out, filled = pending.setdefault(shard.start, (
                np.empty((shard.end - shard.start, vectors.shape[1]), dtype=np.float16),
                np.zeros(shard.end - shard.start, dtype=bool)))
            pick = owner == start
            out[rows[pick] - shard.start] = vectors[pick]
            filled[rows[pick] - shard.start] = True
            if filled.all():
                del pending[shard.start]
                yield shard, out
    if pending:
        raise RuntimeError(f"ray returned incomplete shards: {sorted(pending)[:5]}")
