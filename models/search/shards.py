"""A version served in shards of whole segments, with answers equal to one box's (issue 57).

A shard is a set of whole segments of one published version (`Bundle(..., only=...)`): rows keep their numbers across
the version, and the version's space and tombstones are the ones every shard reads from the shared volume. What makes
a sharded answer the single box's, bit for bit:
- dense: each shard returns its top `depth` (score, version row) after today's per-segment search and `merge`; the
  union's top `depth` by (score, row) is the top `depth` of every segment's lists, which is what one box merges;
- lexical: BM25 needs the version's statistics (live documents, their total length, each stem's document frequency).
  Integers, so a statistics round (`Shard.statistics`, summed by `LexicalStats.total`) gives the whole version's
  exactly, and each shard scores its rows with them (`lexical_candidates(..., stats=...)`), as Elasticsearch's
  `dfs_query_then_fetch` does; a shard scoring with its own statistics (`global_statistics=False`, the negative
  control) ranks differently as soon as a stem's share differs between shards;
- hybrid: both merged lists are fused by today's `fuse`, then paged and floored as `query.search` does, and only
  the page's rows are fetched, each from the shard that holds it.

The coordinator (`Coordinator`) talks to shards through `ShardClient`: a `Shard` in this process (`LocalShard`, the
tests' reference) or a Ray Serve deployment (cluster/), each call answering a `Pending` whose `result()` waits, so a
fan-out is sent to every shard before any answer is awaited. Every call names the version it is pinned to; a shard
that does not hold it raises `VersionNotLoaded`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import numpy as np

from models.bundle.lexical.postings import Analyzer, Lexical, LexicalStats
from models.bundle.manifest import BundleManifest, FusionSpec
from models.bundle.version import Bundle, NoLexicalIndex
from models.corpus import Document
from models.search.fusion import fuse
from models.search.query import (
    Hit,
    Mode,
    Retrieved,
    SearchOptions,
    allowed_rows,
    deadline_check,
    dense_candidates,
    depths_of,
    documents,
    fusion_of,
    lexical_candidates,
    merge,
)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
Terms = tuple[tuple[str, int], ...]  # a query's distinct stems with their counts, in the query's order
Lists = tuple[np.ndarray, np.ndarray]  # (scores float32, version rows int64), best first


class VersionNotLoaded(LookupError):
    """A shard asked for a version it does not hold (the coordinator answers 503, never a partial answer)."""


class ShardUnavailable(RuntimeError):
    """A shard gave no answer (no live replica, a timeout, a version it does not hold): the request fails whole, a 503,
    never a partial answer from the other shards."""


def plan_shards(rows: Sequence[int], shards: int) -> list[list[int]]:
    """Segment positions for each of `shards` shards, balanced by rows: the largest segment first, each to the shard
    holding the fewest rows so far (ties: the lower shard), each shard's positions ascending. Every shard gets at
    least one segment, so there are never more shards than segments."""
    if not 1 <= shards <= len(rows):
        raise ValueError(f"{shards} shards of {len(rows)} segments: each shard holds at least one whole segment")
    plan: list[list[int]] = [[] for _ in range(shards)]
    load = [0] * shards
    for position in sorted(range(len(rows)), key=lambda i: (-rows[i], i)):
        target = min(range(shards), key=lambda s: (len(plan[s]) > 0, load[s], s))  # empty shards first
        plan[target].append(position)
        load[target] += rows[position]
    return [sorted(p) for p in plan]


@dataclass(frozen=True)
class ShardQuery:
    """One fan-out to a shard: the options and, per query, its vector and stems with the statistics to score them
    with (None: the shard's own, the negative control only)."""

    version: str
    vectors: np.ndarray | None  # (queries, teacher dim) float32; None for lexical
    terms: tuple[Terms, ...]
    stats: tuple[LexicalStats, ...] | None
    options: SearchOptions  # its deadline left out: a monotonic clock is one machine's
    oversample: int
    budget_s: float | None = None  # what is left of the request's deadline when it was sent


@dataclass(frozen=True)
class ShardLists:
    """A shard's answer: per query, the top `depth` of each list the mode asks for (version rows)."""

    version: str
    dense: tuple[Lists, ...] | None
    lexical: tuple[Lists, ...] | None


class Shard:
    """The shard side: some segments of one version, loaded (memory-mapped as the single box maps them)."""

    def __init__(self, directory: Path, segments: Sequence[int], lexical: bool = True, mapped: bool = False) -> None:
        self.bundle = Bundle(directory, lexical=lexical, mapped=mapped, only=segments)

    @property
    def version(self) -> str:
        return self.bundle.directory.name

    def _check(self, version: str) -> None:
        if version != self.version:
            raise VersionNotLoaded(f"shard of {self.version} asked for version {version}")

    def statistics(self, version: str, stems: Sequence[Sequence[str]]) -> list[LexicalStats]:
        """Per query, its stems' statistics over this shard's live documents."""
        self._check(version)
        index = self.bundle.require_lexical()
        if not isinstance(index, Lexical):
            raise NoLexicalIndex(f"bundle {self.version} holds bm25s's index (built before segments): it cannot be "
                                 "sharded; compact it with `tandem index compact`")
        return [index.statistics(list(s)) for s in stems]

    def search(self, query: ShardQuery) -> ShardLists:
        """Each list's top `depth` over this shard's segments, as `models.search.query.search` ranks them before
        fusion: the same allowed rows, depths and rescoring head."""
        self._check(query.version)
        opts = query.options
        check = deadline_check(None if query.budget_s is None else time.monotonic() + query.budget_s)
        allowed = allowed_rows(self.bundle, opts.filter, check)
        depth, need = depths_of(self.bundle.fusion, opts)
        dense: list[Lists] = []
        lexical: list[Lists] = []
        for i, terms in enumerate(query.terms):
            if opts.mode is not Mode.LEXICAL:
                assert query.vectors is not None
                dense.append(dense_candidates(self.bundle, query.vectors[i], depth, allowed, query.oversample,
                                              check=check, head=need))
            if opts.mode is not Mode.DENSE:
                stats = None if query.stats is None else query.stats[i]
                lexical.append(lexical_candidates(self.bundle, dict(terms), depth, allowed, check, stats=stats))
        return ShardLists(self.version, tuple(dense) if opts.mode is not Mode.LEXICAL else None,
                          tuple(lexical) if opts.mode is not Mode.DENSE else None)

    def documents(self, version: str, rows: Sequence[int]) -> list[Document]:
        """The documents at these version rows (each in one of this shard's segments), in the order asked."""
        self._check(version)
        return documents(self.bundle, rows)

    def close(self) -> None:
        self.bundle.close()


class Pending(Protocol[T_co]):
    """An answer on its way: `result()` waits for it (a Ray Serve DeploymentResponse is one)."""

    def result(self) -> T_co: ...


class ShardClient(Protocol):
    """How the coordinator reaches one shard (whichever of its replicas answers)."""

    def statistics(self, version: str, stems: list[list[str]]) -> Pending[list[LexicalStats]]: ...

    def search(self, query: ShardQuery) -> Pending[ShardLists]: ...

    def documents(self, version: str, rows: list[int]) -> Pending[list[Document]]: ...


@dataclass(frozen=True)
class Done(Generic[T]):
    """An answer already here."""

    value: T

    def result(self) -> T:
        return self.value


class LocalShard:
    """A `Shard` in this process as a ShardClient (the tests' reference, and a one-process sharded service)."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard

    def statistics(self, version: str, stems: list[list[str]]) -> Done[list[LexicalStats]]:
        return Done(self.shard.statistics(version, stems))

    def search(self, query: ShardQuery) -> Done[ShardLists]:
        return Done(self.shard.search(query))

    def documents(self, version: str, rows: list[int]) -> Done[list[Document]]:
        return Done(self.shard.documents(version, rows))


@dataclass(frozen=True)
class ShardedVersion:
    """What the coordinator knows of the version it is pinned to: its manifest and which shard holds each segment."""

    version: str
    manifest: BundleManifest
    plan: tuple[tuple[int, ...], ...]  # per shard, its segments' positions

    def __post_init__(self) -> None:
        held = sorted(p for shard in self.plan for p in shard)
        if held != list(range(len(self.manifest.parts))):
            raise ValueError(f"version {self.version}: the shards hold segments {held}, the version has "
                             f"{len(self.manifest.parts)}: every segment in exactly one shard")

    @property
    def bases(self) -> np.ndarray:
        return np.cumsum([0] + [p.count for p in self.manifest.parts[:-1]]).astype(np.int64)

    def owners(self, rows: np.ndarray) -> np.ndarray:
        """The shard holding each version row."""
        segment_shard = np.empty(len(self.manifest.parts), dtype=np.int64)
        for shard, positions in enumerate(self.plan):
            segment_shard[list(positions)] = shard
        return segment_shard[np.searchsorted(self.bases, rows, side="right") - 1]


class Coordinator:
    """Today's search with only its retrieve step fanned out: a statistics round for lexical and hybrid, one search
    per shard, today's merge and fusion, then the page's documents from the shards that hold them."""

    def __init__(self, version: ShardedVersion, shards: Sequence[ShardClient], global_statistics: bool = True) -> None:
        if len(shards) != len(version.plan):
            raise ValueError(f"{len(shards)} shards for a plan of {len(version.plan)}")
        self.version, self.shards = version, list(shards)
        self.global_statistics = global_statistics  # False: each shard its own statistics (the negative control)
        info = version.manifest.lexical or version.manifest.parts[0].lexical
        self.analyzer: Analyzer | None = None if info is None else Analyzer(info)
        self.fusion = version.manifest.fusion or FusionSpec()

    def terms(self, queries: Sequence[str]) -> tuple[Terms, ...]:
        if self.analyzer is None:
            raise NoLexicalIndex(f"bundle {self.version.version} has no lexical index")
        return tuple(tuple(self.analyzer.terms(q).items()) for q in queries)

    def search(self, vectors: np.ndarray | None, queries: list[str], opts: SearchOptions,
               oversample: int) -> Retrieved:
        name = self.version.version
        lexical = opts.mode is not Mode.DENSE
        terms = self.terms(queries) if lexical else tuple(() for _ in queries)
        stats: tuple[LexicalStats, ...] | None = None
        if lexical and self.global_statistics:
            stems = [[s for s, _ in t] for t in terms]
            answers = _all([shard.statistics(name, stems) for shard in self.shards])
            stats = tuple(LexicalStats.total([a[i] for a in answers]) for i in range(len(queries)))
        budget = None if opts.deadline is None else opts.deadline - time.monotonic()
        query = ShardQuery(name, None if vectors is None else np.asarray(vectors, dtype=np.float32), terms, stats,
                           dataclasses.replace(opts, deadline=None), oversample, budget)
        lists = _all([shard.search(query) for shard in self.shards])
        for answer in lists:
            if answer.version != name:
                raise VersionNotLoaded(f"a shard answered for version {answer.version}, the request is pinned to "
                                       f"{name}")
        depth, need = depths_of(self.fusion, opts)
        spec = fusion_of(self.fusion, opts)
        zeros = np.zeros(len(lists), dtype=np.int64)  # the shards' rows are the version's already
        pages = []
        for i in range(len(queries)):
            dense = merge([a.dense[i] for a in lists if a.dense is not None], zeros, depth) \
                if opts.mode is not Mode.LEXICAL else None
            lex = merge([a.lexical[i] for a in lists if a.lexical is not None], zeros, depth) if lexical else None
            ranked = fuse(dense, lex, spec, opts.alpha) if dense is not None and lex is not None else (dense or lex)
            assert ranked is not None
            scores, rows = ranked[0][opts.offset : need], ranked[1][opts.offset : need]
            if opts.min_score is not None:
                keep = scores >= opts.min_score
                scores, rows = scores[keep], rows[keep]
            pages.append((scores, rows))
        return Retrieved(self._hits(pages))

    def _hits(self, pages: list[Lists]) -> list[list[Hit]]:
        """Every page's documents, one call per shard that holds any of them."""
        rows = np.concatenate([r for _, r in pages]) if pages else np.zeros(0, dtype=np.int64)
        owners = self.version.owners(rows) if len(rows) else np.zeros(0, dtype=np.int64)
        asked = {int(s): rows[owners == s] for s in np.unique(owners)}
        pending = {s: self.shards[s].documents(self.version.version, [int(r) for r in r_]) for s, r_ in asked.items()}
        found: dict[int, Document] = {}
        for s, answer in pending.items():
            found.update(zip((int(r) for r in asked[s]), answer.result(), strict=True))
        return [[Hit(row=int(r), score=float(sc), doc=found[int(r)]) for sc, r in zip(scores, rws, strict=True)]
                for scores, rws in pages]


def _all(pending: Sequence[Pending[T]]) -> list[T]:
    """Every answer of a fan-out (sent before any is awaited)."""
    return [p.result() for p in pending]


def local_coordinator(directory: Path, plan: Sequence[Sequence[int]],
                      global_statistics: bool = True) -> tuple[Coordinator, list[Shard]]:
    """A coordinator over shards loaded in this process (tests, and trying a plan on one machine)."""
    shards = [Shard(directory, p) for p in plan]
    version = ShardedVersion(shards[0].version, shards[0].bundle.manifest, tuple(tuple(p) for p in plan))
    return Coordinator(version, [LocalShard(s) for s in shards], global_statistics), shards


__all__ = [
    "Coordinator",
    "LocalShard",
    "Shard",
    "ShardClient",
    "ShardLists",
    "ShardQuery",
    "ShardUnavailable",
    "ShardedVersion",
    "VersionNotLoaded",
    "local_coordinator",
    "plan_shards",
]
