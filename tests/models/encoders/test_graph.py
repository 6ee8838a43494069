"""SkipLayerNormalization split into Add + LayerNormalization: the same outputs from onnxruntime, on small graphs
and on a real exported student."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from models.encoders.graph import FUSED, split_skip_layer_norms
from models.encoders.student import StudentEncoder, load_graph, read_student_manifest

WIDTH = 8


def _fused_graph(bias: bool, sum_output: bool, opset: int = 17) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=WIDTH).astype(np.float32), name)
             for name in ("gamma", "beta", "bias")[: 3 if bias else 2]]
    outputs = ["y", "", "", "s"] if sum_output else ["y"]
    node = helper.make_node(FUSED, ["x", "skip", "gamma", "beta", *(["bias"] if bias else [])], outputs,
                            domain="com.microsoft", name="sln", epsilon=1e-5)
    graph_outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, WIDTH])]
    if sum_output:
        graph_outputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 3, WIDTH]))
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, WIDTH]) for n in ("x", "skip")],
        graph_outputs, initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(out) for out in session.run(None, feed)]


@pytest.mark.parametrize(("bias", "sum_output"), [(False, False), (True, False), (True, True)])
def test_the_split_graph_computes_what_the_fused_one_did(bias: bool, sum_output: bool) -> None:
    rng = np.random.default_rng(1)
    feed = {n: rng.normal(size=(1, 3, WIDTH)).astype(np.float32) for n in ("x", "skip")}
    fused = _fused_graph(bias, sum_output)
    expected = _run(fused, feed)
    split = _fused_graph(bias, sum_output)
    assert split_skip_layer_norms(split) == 1
    assert FUSED not in {n.op_type for n in split.graph.node}
    assert "LayerNormalization" in {n.op_type for n in split.graph.node}
    for got, want in zip(_run(split, feed), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_graph_older_than_opset_17_stays_fused() -> None:
    model = _fused_graph(bias=True, sum_output=False, opset=16)
    assert split_skip_layer_norms(model) == 0
    assert [n.op_type for n in model.graph.node] == [FUSED]


def test_an_exported_student_carries_no_skip_layer_norm_and_keeps_its_fused_attention(tiny_student: Path) -> None:
    manifest = read_student_manifest(tiny_student)
    for name in (manifest.onnx_fp32, manifest.onnx_int8):
        ops = {n.op_type for n in onnx.load(str(tiny_student / name)).graph.node}
        assert FUSED not in ops, name
        assert "LayerNormalization" in ops, name
        assert ops & {"Attention", "QAttention"}, name
    loaded = onnx.load_from_string(load_graph(tiny_student / manifest.onnx_int8))
    assert FUSED not in {n.op_type for n in loaded.graph.node}


def test_one_query_encodes_alike_alone_and_through_the_batch_path(tiny_student: Path) -> None:
    """The one-query path and the batch path at one text per call (how the service encodes every query) give the
    same bits. Two texts in one call agree only closely: onnxruntime's kernels differ by batch shape in the last
    bits on some CPUs (an Intel Xeon with AVX-512 here), which is why no query shares a call in the service."""
    student = StudentEncoder(tiny_student, "int8", threads=1)
    texts = ["ocean tides and the moon", "How does   insulin regulate blood sugar?"]
    for text in texts:
        alone, tokens = student.encode_counted([text])
        one_per_call, call_tokens = student.encode_counted([text, texts[0]], batch_size=1)
        np.testing.assert_array_equal(alone[0], one_per_call[0])
        assert tokens == call_tokens[:1]
        shared, shared_tokens = student.encode_counted([text, text])
        np.testing.assert_allclose(alone[0], shared[0], rtol=1e-4, atol=1e-6)
        assert tokens == shared_tokens[:1]
        assert alone.shape == (1, student.dim) and alone.dtype == np.float32


def test_the_query_key_is_what_the_tokenizer_sees(tiny_student: Path) -> None:
    student = StudentEncoder(tiny_student, "int8", threads=1)
    same = ["Ocean tides  and the MOON", " ocean\ttides and the moon ", "ocean tides and the moon"]
    assert len({student.query_key(t) for t in same}) == 1
    assert student.query_key("ocean tides") != student.query_key("ocean tide")
    ids = {tuple(student.tokenizer.encode(t).ids) for t in same}
    assert len(ids) == 1  # the texts one key stands for tokenize alike
