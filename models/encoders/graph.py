"""The student's ONNX graph as onnxruntime runs it fastest on CPU: SkipLayerNormalization split back into Add and
LayerNormalization.

Why: ORT's transformer optimizer fuses each residual Add with its LayerNorm into one SkipLayerNormalization, but
on CPU (onnxruntime 1.32) that fused kernel costs about five times Add plus the standard LayerNormalization
kernel: on a 22-token query, 48 µs against 13 µs a node, 12 nodes, 19% of the whole int8 encode
(docs/lab/2026-11-26-encode-floor.md). The split is the same arithmetic (x + skip [+ bias], then the same
normalization with the same epsilon, gamma and beta), so a student exported before the export stopped fusing
them (models/distill/exporting/export.py) is split when it loads, in memory: no file changes, no new parity check.
"""

from __future__ import annotations

import onnx
from onnx import helper

FUSED = "SkipLayerNormalization"
NORMS = {FUSED, "LayerNormalization", "EmbedLayerNormalization", "QEmbedLayerNormalization"}


def split_skip_layer_norms(model: onnx.ModelProto) -> int:
    """Replace every SkipLayerNormalization of `model`'s main graph by Add(s) + LayerNormalization, in place;
    returns how many were replaced (none in a graph older than opset 17). A node whose mean or inverse-variance
    outputs are used is left fused (nothing in our exports uses them); its optional sum output becomes an Identity
    of the sum."""
    if not any(o.domain in ("", "ai.onnx") and o.version >= 17 for o in model.opset_import):
        return 0  # LayerNormalization is an opset 17 operator: an older graph stays as it is
    producers = {out: node.op_type for node in model.graph.node for out in node.output}
    nodes: list[onnx.NodeProto] = []
    replaced = 0
    for node in model.graph.node:
        outputs = list(node.output) + [""] * (4 - len(node.output))
        if node.op_type != FUSED or node.domain != "com.microsoft" or any(outputs[1:3]):
            nodes.append(node)
            continue
        x, skip, gamma, *rest = node.input
        beta = rest[0] if rest else ""
        bias = rest[1] if len(rest) > 1 else ""
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        if bias:
            # the bias joins the layer's own output first (the operand a norm did not produce, the residual being
            # the previous norm's), where onnxruntime folds it into the quantized MatMul before it
            layer, residual = (skip, x) if producers.get(x) in NORMS else (x, skip)
            biased = f"{node.name}/biased"
            nodes.append(helper.make_node("Add", [layer, bias], [biased], name=f"{node.name}/add_bias"))
            x, skip = biased, residual
        total = f"{node.name}/sum"
        nodes.append(helper.make_node("Add", [x, skip], [total], name=f"{node.name}/add"))
        if outputs[3]:
            nodes.append(helper.make_node("Identity", [total], [outputs[3]], name=f"{node.name}/sum_out"))
        nodes.append(helper.make_node("LayerNormalization", [total, gamma, *([beta] if beta else [])], [outputs[0]],
                                      name=f"{node.name}/layer_norm", axis=-1, epsilon=epsilon))
        replaced += 1
    if replaced:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return replaced
