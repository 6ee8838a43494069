"""The vector engine: FAISS indexes over a version's teacher vectors, built, saved, loaded and searched here.

`index_spec` (quantization, index type), `space` (the version's rotation, int8 calibration, binary center and spin:
written, read once per version, applied), `rotation` (the PCA fit), `quantize` (int8 and binary codes),
`first_stage` (FAISS's first stage per index type × quantization) and `index` (`VectorIndex`: every FAISS call of a
build and a search, and the exact rescoring).
"""
