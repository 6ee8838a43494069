"""A binary query's lean path gives the answers the plain one gave, bit for bit: its sign codes come from a float32
product with the spin (float64 only where a sign is in doubt, Space.sure_signs), its int8 rescoring decodes in place,
and neither may move a code, a candidate, a row or a float32 score."""

from __future__ import annotations

import numpy as np

from models.bundle.vectors.index import VectorIndex
from models.bundle.vectors.index_spec import Quantization
from models.bundle.vectors.quantize import Int8Calibration, int8_decode
from models.bundle.vectors.space import Space, sign_codes, spin_matrix
from models.contract import truncate

DIM = 256


def _old_decode(codes: np.ndarray, cal: Int8Calibration) -> np.ndarray:
    return cal.vmin + cal.vdiff * ((codes.astype(np.float32) + 0.5) / 255.0)


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_sign_codes_equal_the_float64_products_even_at_the_margin() -> None:
    """Random queries, and queries made orthogonal to a spin column (their product there is rounding noise, inside
    the float32 bound, so it is recomputed in float64), and a query equal to the center (every product zero)."""
    rng = np.random.default_rng(3)
    spin = spin_matrix(DIM, seed=5)
    center = (rng.standard_normal(DIM) * 0.05).astype(np.float32)
    space = Space(center=center, spin=spin)
    plain = rng.standard_normal((400, DIM))
    edge = rng.standard_normal((400, DIM))
    columns = rng.integers(0, DIM, len(edge))
    column = spin.astype(np.float64)[:, columns].T
    edge -= (edge * column).sum(axis=1, keepdims=True) * column  # (x − c) · spin[:, j] ≈ 0
    queries = np.concatenate([_unit(plain) + center, edge.astype(np.float32) + center, center[None, :]])
    y = queries - center
    doubt = np.abs(y @ spin) <= np.linalg.norm(y, axis=1, keepdims=True) * space._spin_margin + 1e-30
    assert doubt[400:].any(axis=1).all()  # the edge queries do reach the float64 recomputation
    expected = sign_codes(queries, center, spin.astype(np.float64))
    assert np.array_equal(space.sign_codes(queries), expected)
    alone = np.concatenate([space.sign_codes(queries[i : i + 1]) for i in range(len(queries))])
    assert np.array_equal(alone, expected)
    assert np.array_equal(space.sign_codes(queries[400]), expected[400])  # one vector, not a matrix


def test_int8_decode_is_the_formula_bit_for_bit() -> None:
    rng = np.random.default_rng(4)
    cal = Int8Calibration.fit(rng.standard_normal((500, DIM)).astype(np.float32))
    codes = rng.integers(0, 256, (300, DIM), dtype=np.uint8)
    assert np.array_equal(int8_decode(codes, cal).view(np.uint32), _old_decode(codes, cal).view(np.uint32))


def test_binary_search_answers_as_the_plain_path() -> None:
    """Rows and float32 scores of 300 queries equal those of the plain path: float64 sign codes, the same Hamming
    candidates, the formula's decode, the same product, stable order."""
    rng = np.random.default_rng(6)
    docs = _unit(rng.standard_normal((3000, DIM)))
    index = VectorIndex.build(docs, DIM, Quantization.BINARY, center=True, spin=True)
    space = index.space
    assert space.calibration is not None and space.spin is not None and index.rescore_codes is not None
    queries = _unit(docs[rng.integers(0, len(docs), 300)] + 0.3 * rng.standard_normal((300, DIM)))
    k, oversample = 10, 4
    scores, rows = index.search(queries, k, oversample)
    for i, q in enumerate(np.ascontiguousarray(truncate(queries, DIM))):  # renormalized, as the index does
        codes = sign_codes(q[None, :], space.center, space.spin.astype(np.float64))
        _, cand = index.index.search(codes, index.rescore_pool(k, oversample))
        order = np.sort(cand[0][cand[0] >= 0])
        plain = _old_decode(np.asarray(index.rescore_codes[order]), space.calibration) @ q
        top = np.argsort(-plain, kind="stable")[:k]
        assert np.array_equal(rows[i], order[top])
        assert np.array_equal(scores[i].view(np.uint32), plain[top].view(np.uint32))
