"""The search: the only way into FAISS, BM25, metadata filters and fusion.

The service, `tandem eval`, bench/ and tests search through these names:
- `search`: one search of a bundle in any mode (dense, lexical, hybrid), with filters, pages and a floor;
- `dense_hits`: a bundle's unfiltered dense top-k (evaluation, warm-up, tests);
- `documents`: the documents at rows of a version (rows count across its segments);
- `parse_filter`: a request's metadata filter, compiled (or `FilterError`);
- from models.bundle, for callers of the search: `VectorIndex` (a bare index built in memory, not a bundle, searched
  by its `search`), `rotate` (a space's rotation, models.bundle.vectors.space), `set_search_threads` (FAISS's threads
  for the calling thread's searches).

Modules: `query` (the search itself: planning, merging segments, fusion, documents), `filters`, `planner` (how a
filtered dense search runs), `fusion`. Every FAISS and BM25 call is models.bundle's: the search asks a segment's
`VectorIndex` and its lexical index, and imports neither FAISS nor bm25s.
"""

from models.bundle.vectors.index import DEFAULT_OVERSAMPLE, VectorIndex, set_search_threads
from models.bundle.vectors.space import rotate
from models.search.filters import Filter, FilterError, parse_filter
from models.search.query import Hit, Mode, Retrieved, SearchOptions, dense_hits, documents, rescore_rows, search

__all__ = [
    "DEFAULT_OVERSAMPLE",
    "Filter",
    "FilterError",
    "Hit",
    "Mode",
    "Retrieved",
    "SearchOptions",
    "VectorIndex",
    "dense_hits",
    "documents",
    "parse_filter",
    "rescore_rows",
    "rotate",
    "search",
    "set_search_threads",
]
