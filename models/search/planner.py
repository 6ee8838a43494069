"""The rows a filtered search may return, and how a dense search over them runs, chosen by how many there are.

The rows come as an `Allowed` (models.bundle.rows): a filter's mask (models.bundle.payload), ANDed with a
segment's deletions.

`Planner` picks one of two plans for the dense side (docs/decisions.md#filtered-search-planned-by-cardinality):
- few rows: score exactly the rows that match (their stored vectors; binary bundles their sign codes, then the
  int8 rescoring as usual), which costs what matches;
- many: the index's own search restricted by an ID selector over the bitmap. A graph or cell index then
  over-fetches: HNSW widens its candidate list and IVF probes more cells in proportion to the share of rows
  filtered out, since the rows it visits are that much less likely to be allowed (FAISS's binary IVF takes
  no selector: it asks for that many more results, and the search keeps the allowed ones).
Where the first plan gives way to the second depends on the index type; the shares are set on measurements at
1M documents (docs/BENCHMARKS.md#filtered-search).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from models.bundle.index_spec import IndexType
from models.bundle.rows import Allowed

# At or below this share of the bundle's rows, a filtered dense search scores the matching rows exactly. At 1M binary
# documents, each search right after its query's encode as served, the exact pass was the faster up to 20% (flat)
# and 3% (HNSW), the index search from 30% and 5%: the crossovers sit between
# (docs/decisions.md#filtered-search-planned-by-cardinality). An IVF over binary codes ranks the matching rows by
# Hamming distance over its codes by row, as flat does, while its own plan scans nprobe/share cells (all of them
# below 1/8): its crossover is set lower than flat's, and checked at 10M (docs/lab/2026-11-26-scale-10m.md).
EXACT_SHARE = {IndexType.FLAT: 0.25, IndexType.HNSW: 0.04, IndexType.IVF: 0.15}
EXACT_ROWS = 2048  # ... and always at or below this many rows, however large the bundle
MAX_EF_SEARCH = 1024  # HNSW's widened candidate list stops here (the exact plan covers the shares below)


@dataclass(frozen=True)
class Planner:
    """When a filtered dense search scores the matching rows exactly, and how far the index search over-fetches.

    `exact_share` None takes the index type's measured share (EXACT_SHARE, or EXACT_ROWS rows); a share given
    replaces both, so 0 and 1 force one plan or the other (tests, benchmarks)."""

    exact_share: float | None = None

    def exact(self, kind: IndexType, allowed: Allowed) -> bool:
        if self.exact_share is not None:
            return self.exact_share > 0 and allowed.share <= self.exact_share
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

    @staticmethod
    def nprobe(nprobe: int, nlist: int, allowed: Allowed) -> int:
        """IVF's cells probed when only `allowed.share` of each cell's rows may be returned."""
        return max(nprobe, min(nlist, math.ceil(nprobe / max(allowed.share, 1e-9))))
