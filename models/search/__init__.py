"""The search: the only way into FAISS, BM25, metadata filters and fusion.

The service, `tandem eval`, bench/ and tests search through these names:
- `search`: one search of a bundle in any mode (dense, lexical, hybrid), with filters, pages and a floor;
- `dense_hits`: a bundle's unfiltered dense top-k (evaluation, warm-up, tests);
- `documents`: the documents at rows of a version (rows count across its segments);
- `search_index`: the dense top-k rows of a bare `VectorIndex` (an index built in memory, not a bundle);
- `parse_filter`: a request's metadata filter, compiled (or `FilterError`);
- `set_search_threads`: FAISS's threads for the calling thread's searches.

Modules: `query` (the search itself: a dense query runs only there), `vector_index` (FAISS indexes:
build, save, load; the indexer builds through it), `first_stage` (FAISS's first stage per index type ×
quantization), `quantize` (int8 and binary codes), `lexical` (BM25), `filters`, `fusion`. models.bundle.version
loads a bundle's index files through `vector_index` and `lexical`; nothing here imports models.bundle.version
but for type annotations, so opening a bundle never needs the search.
"""

from models.bundle.vector_index import DEFAULT_OVERSAMPLE, VectorIndex
from models.search.filters import Filter, FilterError, parse_filter
from models.search.query import (
    Hit,
    Mode,
    Retrieved,
    SearchOptions,
    dense_hits,
    documents,
    rotate,
    search,
    search_index,
    set_search_threads,
)

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
    "rotate",
    "search",
    "search_index",
    "set_search_threads",
]
