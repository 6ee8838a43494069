"""The rows a filtered search may return, and how a dense search over them runs, chosen by how many there are.

The rows come as an `Allowed` (models.bundle.storage.rows): a filter's mask (models.bundle.payload.index), ANDed with a
segment's deletions.

`Planner` picks one of two plans for the dense side (docs/decisions.md#filtered-search-planned-by-cardinality):
- few rows: score exactly the rows that match (their stored vectors; binary bundles their sign codes, then the
  int8 rescoring as usual), which costs what matches;
- many: the index's own search restricted by an ID selector over the bitmap. HNSW then widens its candidate list
  in proportion to the share of rows filtered out, since the nodes it visits are that much less likely to be
  allowed. FAISS's IVF takes no selector: it probes its own nprobe cells and asks for that many more results,
  and the search keeps the allowed ones (probing more cells bought no recall: 2026-11-26-ivf-crossover).
Where the first plan gives way to the second depends on the index type. Flat and HNSW by share: both plans'
costs grow with the corpus. IVF by rows: the exact plan costs what matches (about 90 ns a row at 1M and 10M), the
IVF's own search about the same whatever the filter, so the crossover is a row count that moves little with the
corpus (docs/BENCHMARKS.md#filtered-search, docs/lab/2026-11-26-ivf-crossover.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from models.bundle.storage.rows import Allowed
from models.bundle.vectors.index_spec import IndexType

# At or below this share of the bundle's rows, a filtered dense search scores the matching rows exactly. At 1M binary
# documents, each search right after its query's encode as served, the exact pass was the faster up to 20% (flat)
# and 3% (HNSW), the index search from 30% and 5%: the crossovers sit between
# (docs/decisions.md#filtered-search-planned-by-cardinality).
EXACT_SHARE = {IndexType.FLAT: 0.25, IndexType.HNSW: 0.04}
EXACT_ROWS = 2048  # ... and always at or below this many rows, however large the bundle
# An IVF's filtered search scores the matching rows exactly at or below this many, whatever the share. At 1M binary
# documents the exact plan cost 3.4 ms at 28k rows and 7.8 ms at 77k, the IVF's own 3.5 and 3.0 ms at equal recall:
# they cross near 28k rows. At 10M the IVF's unfiltered search took 6.8 ms and the exact plan 90 ns a row, which puts
# the crossover near 75k there (an extrapolation); a bound between errs on the IVF's side, whose cost stays flat.
IVF_EXACT_ROWS = 32_768
MAX_EF_SEARCH = 1024  # HNSW's widened candidate list stops here (the exact plan covers the shares below)


@dataclass(frozen=True)
class Planner:
    """When a filtered dense search scores the matching rows exactly, and how far the index search over-fetches.

    `exact_share` None takes the index type's measured rule (EXACT_SHARE or EXACT_ROWS rows; IVF: IVF_EXACT_ROWS
    rows); a share given replaces it, so 0 and 1 force one plan or the other (tests, benchmarks)."""

    exact_share: float | None = None

    def exact(self, kind: IndexType, allowed: Allowed) -> bool:
        if self.exact_share is not None:
            return self.exact_share > 0 and allowed.share <= self.exact_share
        if kind is IndexType.IVF:
            return allowed.count <= IVF_EXACT_ROWS
        return allowed.count <= EXACT_ROWS or allowed.share <= EXACT_SHARE[kind]

    @staticmethod
    def ef_search(ef: int, k: int, allowed: Allowed) -> int:
        """HNSW's candidate list for `k` results when only `allowed.share` of the graph's nodes may be returned."""
        wanted = math.ceil(max(ef, k) / max(allowed.share, 1e-9))
        return max(ef, k, min(MAX_EF_SEARCH, wanted))

    @staticmethod
    def fetch(k: int, count: int, allowed: Allowed) -> int:
        """Results to ask of an index that cannot filter (FAISS's binary IVF) for `k` allowed ones among them."""
        return min(count, math.ceil(k / max(allowed.share, 1e-9)))
