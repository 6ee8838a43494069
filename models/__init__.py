"""The contract both jobs import, the search, and, in subpackages that neither job imports, training and evaluation.

Top level (the contract; the indexer and the service import these and `search/`):
- the two encoders: `teacher.py` (torch; documents, offline) and `student.py` (ONNX Runtime; queries, online);
- the corpus and its stores: `corpus.py`, `docstore.py`, `embedding_store.py` (+ `shard_log.py`);
- the bundle: `manifest.py` (what it promises), `bundle.py` (loading and checking it), `versions.py`
  (versions and the CURRENT pointer), `staging.py`, `atomic.py`;
- vectors: `index_spec.py` (quantization and index type), `rotation.py` (the PCA rotation, fitted);
- identity: `contract.py` (fingerprints, MRL truncation), `registry.py` (model cards), `paths.py`, `errors.py`.

`search/`: the only way into FAISS, BM25, filters and fusion (`models.search.search`, `dense_hits`, ...);
it builds, saves and loads the vector indexes too, so the indexer builds through it.

Subpackages:
- `distill/`: `tandem distill`, training the student and exporting it to ONNX;
- `evaluation/`: `tandem eval`;
- `datasets/`: what both of those read (BEIR files, the teacher's cached vectors of texts).

The rules (pyproject's import-linter contracts, run by tests/test_architecture.py): the top level and
`search/` never import `distill`, `evaluation` or `datasets`; `distill` and `evaluation` never import each
other; `indexer/` and `service/` import only the top level and `search/`; nothing in models/, the indexer
or the CLI but `search/` imports FAISS or BM25; no module imports itself through a circle of imports.
"""
