"""The contract both jobs import, by owner, and, in subpackages that neither job imports, training and evaluation.

Floors (each imports only those below it; models.search alone sits on top):
- `search/`: query time only: `query` (a search of a version in any mode), `filters`, `planner`, `fusion`;
- `bundle/`: what a version is on disk, each format read and written in one place (the only importer of FAISS
  and bm25s);
- `encoders/`: the teacher and the student, how a model directory encodes, the model store;
- `embeddings/`: the teacher's vectors of a corpus, stored once;
- the top level: what every floor uses: `errors`, `paths`, `atomic` (atomic writes), `timing`, `contract`
  (fingerprints, MRL truncation), `corpus` (reading documents), `manifest_io` (reading a manifest).

Subpackages that neither job imports:
- `distill/`: `tandem distill`, training the student and exporting it to ONNX;
- `evaluation/`: `tandem eval`;
- `datasets/`: what both of those read (BEIR files, the teacher's cached vectors of texts).

The rules are pyproject's import-linter contracts, run by tests/test_architecture.py.
"""
