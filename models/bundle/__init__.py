"""The index bundle: what a version is on disk, and the one place it is read and written.

Each file format is written and read side by side (Lucene's codecs, Qdrant's segment indexes):
- `manifest` (what a version promises) and `version` (`Bundle`: opening and checking a version, its segments and
  tombstones); `versions` (a root's versions and its CURRENT pointer) and `staging` (publishing one atomically);
- vectors: `index_spec` (quantization, index type), `space` (the version's rotation, int8 calibration, binary center
  and spin: written, read once per version, applied), `vector_index` (FAISS indexes: build, save, load, and every
  FAISS call of a search), `first_stage` (FAISS's first stage per index type × quantization), `quantize` (int8 and
  binary codes), `rotation` (the PCA fit);
- documents: `docstore` (`docs.sqlite`), `fields` (payload field types), `payload_writer` and `payload` (the payload
  index's columns), `dictionary` (the sorted strings keywords and stems are stored as), `lexical` (BM25 postings,
  written and scored); `rows` (row masks over a segment).

The only floor that imports FAISS and bm25s. It never imports models.search (query time), which stands on it.
"""
