"""The index bundle: what a version is on disk, and the one place it is read and written.

Laid out as Lucene's codecs and Qdrant's segment crate are, by format, each engine's reader and writer side by side:
- the version's life, at this level: `manifest` (what a version promises), `version` (`Bundle`: opening and checking
  a version, its segments and tombstones), `versions` (a root's versions and its CURRENT pointer), `staging`
  (publishing one atomically), `sample` (a segment's agreement sample), `legacy` (bundles built before segments);
- three engines, which never import each other: `vectors/` (index spec, the version's space, rotation,
  quantization, FAISS indexes and their first stages), `lexical/` (BM25 postings and their MaxScore pruning) and
  `payload/` (field types, columns, the writer and the memory-mapped index); each owns its part of the manifest
  (`lexical.info.LexicalInfo`, `payload.fields.PayloadInfo`, `vectors.index_spec.IndexSpec`);
- `storage/`: what the engines share: the docstore, sorted-string dictionaries, spills, row files, prefetch, row
  masks, top-k ranking and checked (sha256) reads.

The layers (version's life > engines > storage) are pyproject's import-linter contracts. The only floor that imports
FAISS and bm25s. It never imports models.search (query time), which stands on it.
"""
