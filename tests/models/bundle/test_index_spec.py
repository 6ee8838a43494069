"""models.bundle.index_spec: the defaults that scale with the corpus, and the combinations refused before any work."""

from __future__ import annotations

import pytest

from models.bundle.index_spec import IndexSpec, Quantization, default_nlist, resolve_spec
from models.errors import InputError


def test_defaults_scale_with_the_corpus() -> None:
    assert default_nlist(20) == 1 and default_nlist(100_000) == 1264
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
