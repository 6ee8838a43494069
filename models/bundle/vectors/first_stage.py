"""The FAISS first stage for each index type × quantization, and its search-time parameters.

The int8 types use our calibrated ranges (the rescoring codec mirrors them), binary types index
sign bits; every float-valued index scores by inner product, which is cosine for unit vectors.
"""

from __future__ import annotations

from typing import Any, cast

import faiss
import numpy as np

from models.bundle.vectors.index_spec import IndexSpec, IndexType, Quantization
from models.bundle.vectors.quantize import Int8Calibration
from models.bundle.vectors.space import sign_codes

# IVF's k-means trains on a stride of IVF_TRAIN_PER_CELL codes a cell for IVF_TRAIN_ITERATIONS iterations: FAISS's
# floor of points a centroid and its default max were 39 and 256 (with 25 iterations), and at 4·√N cells the old
# sample made training grow as N^1.5 (docs/lab/2026-11-26-first-stage-scale.md)
IVF_TRAIN_PER_CELL = 64
IVF_TRAIN_ITERATIONS = 10


def set_calibration(sq_index: faiss.IndexScalarQuantizer, cal: Int8Calibration) -> None:
    """Make a QT_8bit scalar quantizer use `cal` instead of training its own ranges."""
    faiss.copy_array_to_vector(cal.to_array().ravel(), sq_index.sq.trained)
    sq_index.is_trained = True


def empty_first_stage(
    dim: int, quantization: Quantization, spec: IndexSpec, cal: Int8Calibration | None
) -> faiss.Index | faiss.IndexBinary:
    """An empty index for `dim`-d vectors; IVF still needs `train` (see train_step), the others are ready."""
    ip = faiss.METRIC_INNER_PRODUCT
    index: faiss.Index | faiss.IndexBinary
    if spec.type is IndexType.FLAT:
        if quantization is Quantization.FLOAT:
            index = faiss.IndexFlatIP(dim)
        elif quantization is Quantization.INT8:
            assert cal is not None
            index = faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_8bit, ip)
            set_calibration(index, cal)
        else:
            index = faiss.IndexBinaryFlat(dim)
    elif spec.type is IndexType.HNSW:
        assert spec.hnsw_m is not None and spec.ef_construction is not None
        if quantization is Quantization.FLOAT:
            index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, ip)
        elif quantization is Quantization.INT8:
            assert cal is not None
            qt8: Any = faiss.ScalarQuantizer.QT_8bit  # the stubs mistype this constructor's argument
            index = faiss.IndexHNSWSQ(dim, qt8, spec.hnsw_m, ip)
            set_calibration(cast(faiss.IndexScalarQuantizer, faiss.downcast_index(index.storage)), cal)
            index.is_trained = True
        else:
            index = faiss.IndexBinaryHNSW(dim, spec.hnsw_m)
        index.hnsw.efConstruction = spec.ef_construction
    else:
        assert quantization is Quantization.BINARY and spec.ivf_nlist is not None
        index = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(dim), dim, spec.ivf_nlist)  # keeps its quantizer alive
        index.cp.niter = IVF_TRAIN_ITERATIONS
        index.cp.max_points_per_centroid = IVF_TRAIN_PER_CELL  # the sample train_step gives, not subsampled again
    return index


def train_step(count: int, spec: IndexSpec) -> int:
    """Every train_step-th row trains IVF's k-means (the same rows whether the build streams or not): about
    IVF_TRAIN_PER_CELL a cell."""
    return max(1, count // (IVF_TRAIN_PER_CELL * (spec.ivf_nlist or 1)))


def first_stage_codes(x: np.ndarray, quantization: Quantization, center: np.ndarray | None = None,
                      spin: np.ndarray | None = None) -> np.ndarray:
    """What the first stage stores for truncated unit vectors `x`: sign bits (binary) or the floats."""
    if quantization is not Quantization.BINARY:
        return np.ascontiguousarray(x, dtype=np.float32)
    return sign_codes(x, center, spin)


def build_first_stage(
    x: np.ndarray, quantization: Quantization, spec: IndexSpec, cal: Int8Calibration | None,
    center: np.ndarray | None = None, spin: np.ndarray | None = None,
) -> faiss.Index | faiss.IndexBinary:
    """A filled index over MRL-truncated unit vectors `x` (float32, C-contiguous)."""
    index = empty_first_stage(x.shape[1], quantization, spec, cal)
    data = first_stage_codes(x, quantization, center, spin)
    if not index.is_trained:
        index.train(np.ascontiguousarray(data[:: train_step(len(data), spec)]))
    index.add(data)
    apply_search_params(index, spec)
    return index


def apply_search_params(index: faiss.Index | faiss.IndexBinary, spec: IndexSpec) -> None:
    """Set efSearch / nprobe from the manifest; raise ValueError when the file holds another index type."""
    typed: Any = index  # efSearch / nprobe live on the concrete classes
    kind = IndexType.HNSW if hasattr(typed, "hnsw") else IndexType.IVF if hasattr(typed, "nprobe") else IndexType.FLAT
    if kind is not spec.type:
        raise ValueError(f"index file holds a {kind.value} index ({type(index).__name__}), "
                         f"the manifest says {spec.type.value}")
    if spec.ef_search is not None:
        typed.hnsw.efSearch = spec.ef_search
    if spec.ivf_nprobe is not None:
        typed.nprobe = spec.ivf_nprobe


def stored_codes(index: faiss.Index | faiss.IndexBinary) -> np.ndarray | None:
    """The sign codes a flat or HNSW binary first stage holds, [ntotal, code_size] uint8, as a view of FAISS's own
    memory (valid while the index lives); None for an index whose codes are not stored by row (IVF)."""
    typed: Any = index
    flat: Any = faiss.downcast_IndexBinary(typed.storage) if hasattr(typed, "hnsw") else typed
    if not isinstance(flat, faiss.IndexBinaryFlat) or flat.ntotal == 0:
        return None
    stored: Any = getattr(flat, "xb")  # noqa: B009 (the stubs do not know the codes' vector)
    return faiss.rev_swig_ptr(stored.data(), flat.ntotal * flat.code_size).reshape(flat.ntotal, flat.code_size)


def hamming_top(codes: np.ndarray, rows: np.ndarray, query: np.ndarray, k: int, chunk: int) -> np.ndarray:
    """The `k` of `rows` whose codes are nearest `query` (one packed code) by Hamming distance, `chunk` rows at a
    time; ties may fall either way, as in FAISS's own search."""
    best_d, best_r = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        dist, at = faiss.knn_hamming(np.ascontiguousarray(query), np.ascontiguousarray(codes[part]), min(k, len(part)))
        best_d, best_r = np.concatenate([best_d, dist[0]]), np.concatenate([best_r, part[at[0]]])
        if len(best_r) > k:
            keep = np.argpartition(best_d, k - 1)[:k]
            best_d, best_r = best_d[keep], best_r[keep]
    return best_r
