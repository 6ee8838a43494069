"""The contract both jobs import, by owner, and, in subpackages that neither job imports, training and evaluation.

Floors (each imports only those below it; models.agreement alone sits on top):
- `agreement/`: how well a student agrees with its teacher on each segment of a version (`tandem index check` and the
  service's monitor);
- `search/`: query time only: `query` (a search of a version in any mode), `filters`, `planner`, `fusion`;
- `bundle/`: what a version is on disk (a manifest, segments and their tombstones, the space they share), each
  format read and written in one place, by engine: `vectors/` (FAISS), `lexical/` (BM25 postings), `payload/`
  (the payload index's typed columns), over `storage/` (the docstore and the helpers they share); the only
  importer of FAISS and bm25s;
- `embeddings/`: the teacher's vectors of a corpus, stored once;
- `encoders/`: the teacher and the student, how a model directory encodes, the model store;
- the top level: what every floor uses: `errors`, `paths`, `atomic` (atomic writes), `hashing` (a file's sha256),
  `timing`, `contract` (fingerprints, MRL truncation), `corpus` (reading documents), `manifest_io` (reading a
  manifest), `pseudo_queries` (query-like texts cut from a document).

Subpackages that neither job imports:
- `distill/`: `tandem distill`, training the student and exporting it to ONNX;
- `evaluation/`: `tandem eval`;
- `datasets/`: what both of those read (BEIR files, the teacher's cached vectors of texts).

The rules are pyproject's import-linter contracts, run by tests/test_architecture.py.
"""
