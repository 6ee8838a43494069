"""models.bundle.vectors.index_spec: the defaults that scale with the corpus, and the combinations refused before any
work."""

from __future__ import annotations

import pytest

from models.bundle.vectors.index_spec import (
    AUTO_FLAT_MAX,
    IVF_NLIST_MAX,
    IndexSpec,
    IndexType,
    Quantization,
    default_nlist,
    rescore_depth,
    resolve_spec,
)
from models.errors import InputError


def test_defaults_scale_with_the_corpus() -> None:
    assert default_nlist(20) == 1 and default_nlist(100_000) == 1264
    assert default_nlist(10_000_000) == IVF_NLIST_MAX  # not 12,649: k-means and adds grow with the cells
    spec = resolve_spec("ivf", Quantization.BINARY, 100_000)
    assert (spec.ivf_nlist, spec.ivf_nprobe) == (1264, 158)
    assert resolve_spec("flat", Quantization.INT8, 10) == IndexSpec()


@pytest.mark.parametrize(
    ("kind", "quantization", "options", "message"),
    [
        ("ivf", "float", {}, "--index ivf does not support --quantization float"),
        ("ivf", "int8", {}, "--index ivf does not support --quantization int8"),
        ("lsh", "float", {}, "unknown --index 'lsh'"),
        ("flat", "float", {"hnsw_m": 16}, "--hnsw-m does not apply to --index flat"),
        ("hnsw", "float", {"ivf_nprobe": 4}, "--ivf-nprobe does not apply to --index hnsw"),
        ("hnsw", "float", {"ef_search": 0}, "--ef-search must be at least 1"),
        ("hnsw", "int8", {"hnsw_m": 1}, "--hnsw-m must be at least 2"),
        ("ivf", "binary", {"ivf_nlist": 50}, "--ivf-nlist 50 exceeds the corpus's 20 documents"),
        ("ivf", "binary", {"ivf_nlist": 4, "ivf_nprobe": 5}, "--ivf-nprobe 5 exceeds --ivf-nlist 4"),
    ],
)
def test_invalid_combinations_are_refused(kind: str, quantization: str, options: dict[str, int], message: str) -> None:
    with pytest.raises(InputError, match=message):
        resolve_spec(kind, Quantization(quantization), 20, **options)


def test_auto_picks_the_type_and_the_rescoring_depth_by_corpus_size() -> None:
    binary, floats = Quantization.BINARY, Quantization.FLOAT
    assert resolve_spec("auto", binary, 1_000) == IndexSpec()  # small: exactly what --index flat gives
    assert resolve_spec("auto", binary, AUTO_FLAT_MAX).type is IndexType.FLAT
    large = resolve_spec("auto", binary, AUTO_FLAT_MAX + 1)
    assert large.type is IndexType.IVF and large == resolve_spec("ivf", binary, AUTO_FLAT_MAX + 1)
    assert resolve_spec("auto", floats, AUTO_FLAT_MAX + 1).type is IndexType.HNSW
    depths = [rescore_depth(binary, n) or 4 for n in (10_000, 200_000, 1_000_000, 10_000_000)]
    assert depths == sorted(depths) and depths[0] == 4 < depths[-1]
    assert rescore_depth(floats, 10_000_000) is None and resolve_spec("flat", floats, 10_000_000).oversample is None
    with pytest.raises(InputError, match="what --index auto chose for 1000 documents"):
        resolve_spec("auto", binary, 1_000, ivf_nlist=4)
