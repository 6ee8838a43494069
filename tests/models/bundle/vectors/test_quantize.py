"""Quantization properties: packed sign bits, int8 error bound, parity with FAISS's codec."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from models.bundle.vectors.quantize import Int8Calibration, binary_encode, hamming, int8_decode, int8_encode
from models.contract import l2_normalize, truncate
from models.errors import ContractMismatch

RNG = np.random.default_rng(0)


def unit(n: int, d: int) -> np.ndarray:
    return l2_normalize(RNG.standard_normal((n, d)).astype(np.float32))


def test_binary_packs_sign_bits_msb_first() -> None:
    x = np.array([[1.0, -1.0, 0.5, -0.1, 0.0, 2.0, -3.0, 0.2, 0.7]], dtype=np.float32)
    codes = binary_encode(x)
    assert codes.shape == (1, 2) and codes.dtype == np.uint8
    assert codes[0, 0] == 0b10100101
    assert codes[0, 1] == 0b10000000


def test_hamming_counts_differing_signs() -> None:
    a, b = unit(5, 64), unit(7, 64)
    expected = ((a[:, None, :] > 0) != (b[None, :, :] > 0)).sum(-1)
    assert np.array_equal(hamming(binary_encode(a), binary_encode(b)), expected)
    index = faiss.IndexBinaryFlat(64)
    index.add(binary_encode(b))
    dist, _ = index.search(binary_encode(a), 7)
    assert np.array_equal(np.sort(dist, 1), np.sort(expected, 1))


def test_int8_reconstruction_error_is_bounded() -> None:
    x = unit(500, 128)
    cal = Int8Calibration.fit(x)
    err = np.abs(int8_decode(int8_encode(x, cal), cal) - x)
    assert (err <= cal.max_error() + 1e-6).all()
    assert err.max() < 0.01


def test_int8_codec_matches_faiss_scalar_quantizer() -> None:
    x = unit(200, 64)
    cal = Int8Calibration.fit(x)
    index = faiss.IndexScalarQuantizer(64, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    assert np.allclose(faiss.vector_to_array(index.sq.trained).reshape(2, 64), cal.to_array())
    assert np.array_equal(index.sa_encode(x), int8_encode(x, cal))
    assert np.allclose(index.sa_decode(index.sa_encode(x)), int8_decode(int8_encode(x, cal), cal), atol=1e-6)


def test_int8_clips_out_of_range_values() -> None:
    cal = Int8Calibration.fit(unit(100, 16))
    far = np.full((1, 16), 10.0, dtype=np.float32)
    assert (int8_encode(far, cal) == 255).all()
    assert (int8_encode(-far, cal) == 0).all()


def test_calibration_round_trips_through_array() -> None:
    cal = Int8Calibration.fit(unit(50, 32))
    back = Int8Calibration.from_array(cal.to_array())
    assert np.array_equal(back.vmin, cal.vmin) and np.array_equal(back.vdiff, cal.vdiff)
    with pytest.raises(ValueError):
        Int8Calibration.from_array(np.zeros((3, 32)))


def test_mrl_truncation_renormalizes_and_keeps_prefix_direction() -> None:
    x = unit(10, 768)
    t = truncate(x, 256)
    assert t.shape == (10, 256)
    assert np.allclose(np.linalg.norm(t, axis=1), 1.0, atol=1e-6)
    assert np.allclose(t * np.linalg.norm(x[:, :256], axis=1, keepdims=True), x[:, :256], atol=1e-6)
    with pytest.raises(ContractMismatch):
        truncate(x, 1024)
