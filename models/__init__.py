"""The contract both jobs import, and, in subpackages that neither job imports, training and evaluation.

Top level (the contract; the indexer and the service import only these):
- the two encoders: `teacher.py` (torch; documents, offline) and `student.py` (ONNX Runtime; queries, online);
- the corpus and its stores: `corpus.py`, `docstore.py`, `embedding_store.py` (+ `shard_log.py`);
- the bundle: `manifest.py` (what it promises), `bundle.py` (loading and checking it), `versions.py`
  (versions and the CURRENT pointer), `staging.py`, `atomic.py`, `rootlock.py`;
- vectors: `vector_index.py` (FAISS), `index_spec.py` and `ann.py` (index types), `quantize.py`, `rotation.py`;
- search: `retrieve.py` (one query's stages), `lexical.py` (BM25), `fusion.py`, `filters.py`;
- identity: `contract.py` (fingerprints), `registry.py` (model cards), `paths.py`, `errors.py`.

Subpackages:
- `distill/`: `tandem distill`, training the student and exporting it to ONNX;
- `evaluation/`: `tandem eval`;
- `datasets/`: what both of those read (BEIR files, the teacher's cached vectors of texts).

The rules (pyproject's import-linter contracts, run by tests/test_architecture.py): the top level never
imports a subpackage; `distill` and `evaluation` never import each other; `indexer/` and `service/`
import only the top level.
"""
