"""The int8 parity search's graphs (some MatMuls back in fp32, from one quantization) compute what ORT's quantizer
writes with those MatMuls excluded; on a tiny BERT student, so every subset shape is cheap to check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from models.distill.exporting.export import export_onnx, onnx_vectors, optimize_onnx, quantize_onnx, weight_matmuls
from models.distill.exporting.mixed_precision import with_fp32_nodes
from models.distill.model import StudentModel
from models.distill.texts.tokens import Tokens
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.tiny_models import TinyModels

TEXTS = [*PROBES, *(text for _, _, text in DOCS[:8])]


@pytest.fixture(scope="module")
def graphs(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Tokens]:
    """A tiny student's fp32 graph and its fully quantized one."""
    hf_dir = tiny_models.hf("bert", hidden=32)
    torch.manual_seed(0)
    model = StudentModel(hf_dir, 64).eval()
    folder = tmp_path_factory.mktemp("mixed")
    export_onnx(model, folder / "raw.onnx")
    optimize_onnx(folder / "raw.onnx", folder / "model.onnx", num_heads=4, hidden_size=32)
    quantize_onnx(folder / "model.onnx", folder / "model.int8.onnx")
    return folder / "model.onnx", folder / "model.int8.onnx", Tokens(hf_dir / "tokenizer.json", 48)


def _subsets(candidates: list[str]) -> list[list[str]]:
    """One node, every node but one (the sensitivity search's graphs), the first n, and all of them."""
    return [candidates[:1], candidates[1:], candidates[:-1], candidates[: len(candidates) // 2], candidates]


def test_restored_matmuls_compute_as_the_quantizer_excluding_them(graphs: tuple[Path, Path, Tokens],
                                                                   tmp_path: Path) -> None:
    fp32, int8, tokens = graphs
    candidates = weight_matmuls(fp32)
    assert len(candidates) == 3 * 3  # three layers: attention output, intermediate, output
    quantized, original = onnx.load(str(int8)), onnx.load(str(fp32))
    everything = onnx_vectors(int8, tokens, TEXTS)
    for excluded in _subsets(candidates):
        quantize_onnx(fp32, tmp_path / "excluded.onnx", excluded)
        expected = onnx_vectors(tmp_path / "excluded.onnx", tokens, TEXTS)
        mixed = with_fp32_nodes(quantized, original, excluded)
        onnx.checker.check_model(mixed)
        ops = sorted(n.op_type for n in mixed.graph.node)
        assert ops == sorted(n.op_type for n in onnx.load(str(tmp_path / "excluded.onnx")).graph.node)
        assert sum(n.name in excluded for n in mixed.graph.node) == len(excluded)
        vectors = onnx_vectors(mixed.SerializeToString(), tokens, TEXTS)
        assert np.allclose(vectors, expected, atol=1e-6)
        assert not np.allclose(vectors, everything, atol=1e-6)  # the restored nodes did change the answer
    assert np.allclose(onnx_vectors(with_fp32_nodes(quantized, original, []).SerializeToString(), tokens, TEXTS),
                       everything)


def test_an_unknown_node_is_refused(graphs: tuple[Path, Path, Tokens]) -> None:
    fp32, int8, _ = graphs
    with pytest.raises(ValueError, match="no such nodes"):
        with_fp32_nodes(onnx.load(str(int8)), onnx.load(str(fp32)), ["/not/a/node"])
