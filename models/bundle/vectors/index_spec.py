"""The two axes of a bundle's index: its quantization, and its type (exact flat search, or an approximate
first stage for size and speed).

Valid combinations (anything else is refused before any work is done):

- flat × float / int8 / binary: exact search (binary: exact Hamming, then int8 rescoring).
- hnsw × float (IndexHNSWFlat), int8 (IndexHNSWSQ with our calibration), binary (IndexBinaryHNSW):
  a graph over the vectors; `ef_search` trades latency for recall.
- ivf × binary (IndexBinaryIVF): Hamming k-means cells; `ivf_nprobe` cells are scanned per query.

Binary types keep the int8 rescoring stage, so only their first stage lives in RAM. Search-time
parameters are recorded here and applied at load, since FAISS does not persist them for every type.

`auto` picks the type by corpus size (`auto_type`): flat up to AUTO_FLAT_MAX documents, past it IVF over binary
codes (binary) or HNSW (float, int8), whose cost per query does not grow with a full scan. A binary index also
records its rescoring depth (`oversample`, `rescore_depth`): how many Hamming candidates per hit the int8 stage
rescores grows with the corpus, since at a fixed depth ever more of the true top 10 fall outside it
(docs/lab/2026-11-26-first-stage-scale.md).
"""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from models.errors import InputError

HNSW_M = 32
EF_CONSTRUCTION = 80
EF_SEARCH = 64
IVF_POINTS_PER_CELL = 39  # FAISS k-means wants at least this many training points per centroid
# IVF's default cells stop growing here: k-means over binary codes trains as float k-means (sample × cells × 768
# per iteration) and each added row is compared with every cell: at 10M, 4,096 cells trained in 102 s and added in
# 72 s on 2 cores, where 4·√N = 12,649 would take about 9× and 3× that; a query's probes scan nprobe/nlist of the
# rows whatever nlist is (docs/lab/2026-11-26-first-stage-scale.md)
IVF_NLIST_MAX = 4096
AUTO = "auto"
AUTO_FLAT_MAX = 2_000_000  # `--index auto`: flat up to here (a full scan of binary codes stays within p99 budgets)
# binary rescoring depth by corpus size: (up to this many documents, Hamming candidates rescored per hit), so that
# recall@10 against exact float search stays over 0.85: measured 0.912 at 200k with ×8 and 0.907 at 1M with ×16 (×4:
# 0.819 and 0.696); past 1.5M twice the depth per five times the corpus, and at 10M ×64 measured 0.917
RESCORE_DEPTHS = ((50_000, 4), (300_000, 8), (1_500_000, 16), (5_000_000, 32))
DEEPEST_RESCORE = 64


class Quantization(StrEnum):
    FLOAT = "float"
    INT8 = "int8"
    BINARY = "binary"


class IndexType(StrEnum):
    FLAT = "flat"
    HNSW = "hnsw"
    IVF = "ivf"


class IndexChoice(StrEnum):
    """What `--index` takes: a type, or `auto` (by corpus size: auto_type)."""

    FLAT = "flat"
    HNSW = "hnsw"
    IVF = "ivf"
    AUTO = "auto"


VALID = {  # index type → quantizations it supports
    IndexType.FLAT: {"float", "int8", "binary"},
    IndexType.HNSW: {"float", "int8", "binary"},
    IndexType.IVF: {"binary"},
}


class IndexSpec(BaseModel):
    """Index type and its parameters, as recorded in the manifest (unset: not used by this type)."""

    model_config = ConfigDict(extra="forbid")

    type: IndexType = IndexType.FLAT
    hnsw_m: int | None = Field(default=None, ge=2, description="hnsw: neighbours per node")
    ef_construction: int | None = Field(default=None, ge=1, description="hnsw: candidate list size while building")
    ef_search: int | None = Field(default=None, ge=1, description="hnsw: candidate list size per query")
    ivf_nlist: int | None = Field(default=None, ge=1, description="ivf: number of k-means cells")
    ivf_nprobe: int | None = Field(default=None, ge=1, description="ivf: cells scanned per query")
    oversample: int | None = Field(default=None, ge=1, description="binary: Hamming candidates rescored per hit, at "
                                   "least (set by corpus size; unset: the service's --binary-oversample)")


def default_nlist(count: int) -> int:
    """About 4·√N cells, but no more than k-means can train well on N points, nor than IVF_NLIST_MAX."""
    return max(1, min(int(4 * math.sqrt(count)), count // IVF_POINTS_PER_CELL, IVF_NLIST_MAX))


def rescore_depth(quantization: Quantization, count: int) -> int | None:
    """The rescoring depth a binary index of `count` rows records; None (the service's default, ×4) while that is
    enough, and for float and int8, which have no rescoring stage."""
    if quantization is not Quantization.BINARY:
        return None
    depth = next((d for upto, d in RESCORE_DEPTHS if count <= upto), DEEPEST_RESCORE)
    return None if depth <= RESCORE_DEPTHS[0][1] else depth


def auto_type(quantization: Quantization, count: int) -> IndexType:
    """`--index auto`: flat up to AUTO_FLAT_MAX documents, then IVF (binary) or HNSW (float, int8)."""
    if count <= AUTO_FLAT_MAX:
        return IndexType.FLAT
    return IndexType.IVF if quantization is Quantization.BINARY else IndexType.HNSW


def resolve_spec(
    index_type: str,
    quantization: Quantization,
    count: int,
    *,
    hnsw_m: int | None = None,
    ef_construction: int | None = None,
    ef_search: int | None = None,
    ivf_nlist: int | None = None,
    ivf_nprobe: int | None = None,
) -> IndexSpec:
    """A complete spec for `count` documents, or an InputError naming the offending option."""
    spec = _resolve(index_type, quantization, count, hnsw_m=hnsw_m, ef_construction=ef_construction,
                    ef_search=ef_search, ivf_nlist=ivf_nlist, ivf_nprobe=ivf_nprobe)
    depth = rescore_depth(quantization, count)
    return spec if depth is None else spec.model_copy(update={"oversample": depth})


def _resolve(
    index_type: str,
    quantization: Quantization,
    count: int,
    *,
    hnsw_m: int | None,
    ef_construction: int | None,
    ef_search: int | None,
    ivf_nlist: int | None,
    ivf_nprobe: int | None,
) -> IndexSpec:
    try:
        kind = auto_type(quantization, count) if index_type == AUTO else IndexType(index_type)
    except ValueError:
        choices = ", ".join([*(t.value for t in IndexType), AUTO])
        raise InputError(f"unknown --index {index_type!r}; choose one of {choices}") from None
    if quantization.value not in VALID[kind]:
        allowed = ", ".join(sorted(VALID[kind]))
        raise InputError(f"--index {kind.value} does not support --quantization {quantization.value}; "
                         f"use {allowed}")
    given = {"--hnsw-m": hnsw_m, "--ef-construction": ef_construction, "--ef-search": ef_search,
             "--ivf-nlist": ivf_nlist, "--ivf-nprobe": ivf_nprobe}
    for option, value in given.items():
        if value is not None and value < 1:
            raise InputError(f"{option} must be at least 1, got {value}")
    own = {IndexType.FLAT: set(), IndexType.HNSW: {"--hnsw-m", "--ef-construction", "--ef-search"},
           IndexType.IVF: {"--ivf-nlist", "--ivf-nprobe"}}[kind]
    stray = [option for option, value in given.items() if value is not None and option not in own]
    if stray:
        chosen = f" (what --index auto chose for {count} documents)" if index_type == AUTO else ""
        raise InputError(f"{', '.join(stray)} does not apply to --index {kind.value}{chosen}")
    if kind is IndexType.HNSW:
        if hnsw_m is not None and hnsw_m < 2:
            raise InputError(f"--hnsw-m must be at least 2, got {hnsw_m}")
        return IndexSpec(type=kind, hnsw_m=hnsw_m or HNSW_M, ef_construction=ef_construction or EF_CONSTRUCTION,
                         ef_search=ef_search or EF_SEARCH)
    if kind is IndexType.IVF:
        nlist = ivf_nlist or default_nlist(count)
        if nlist > count:
            raise InputError(f"--ivf-nlist {nlist} exceeds the corpus's {count} documents")
        nprobe = ivf_nprobe or max(1, nlist // 8)
        if nprobe > nlist:
            raise InputError(f"--ivf-nprobe {nprobe} exceeds --ivf-nlist {nlist}")
        return IndexSpec(type=kind, ivf_nlist=nlist, ivf_nprobe=nprobe)
    return IndexSpec(type=kind)
