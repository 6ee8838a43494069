"""An int8 graph with some of its weight MatMuls put back in fp32, made from the fully quantized graph.

Why: the int8 parity search (export.quantize_with_parity) scores one graph per candidate MatMul and per exclusion
count. Quantizing the fp32 graph again for each (ORT's quantize_dynamic: load, shape inference, every weight
quantized, a file written) cost a teacher-layer student most of its export. Dynamic quantization rewrites each
MatMul on its own: its weight quantized per channel, its input quantized at run time, and its output keeps the
MatMul's output name. So the graph quantize_dynamic writes with `nodes_to_exclude=names` is the fully quantized
graph with each of `names` back in place of its quantized nodes: one quantization serves the whole search
(tests/models/distill/test_mixed_precision.py checks the two give the same vectors).
"""

from __future__ import annotations

from collections.abc import Collection

import onnx


def with_fp32_nodes(quantized: onnx.ModelProto, fp32: onnx.ModelProto, names: Collection[str]) -> onnx.ModelProto:
    """A copy of `quantized` in which the nodes `names` of `fp32` (weight MatMuls) compute in fp32 again.

    Each named node replaces the quantized node that writes its output; what only that node read (its input's
    quantization, if no other node shares it; its quantized weight) is dropped; its fp32 weight comes back."""
    by_output = _by_output(fp32, names, {name for node in quantized.graph.node for name in node.output})
    model = onnx.ModelProto()
    model.CopyFrom(quantized)
    graph = model.graph
    nodes = [by_output.get(node.output[0], node) if node.output else node for node in graph.node]
    # Keep only what the graph's outputs still need, walking back from them (the nodes are in topological order).
    needed = {output.name for output in graph.output}
    live = []
    for node in reversed(nodes):
        if any(name in needed for name in node.output):
            live.append(node)
            needed.update(name for name in node.input if name)
    del graph.node[:]
    graph.node.extend(reversed(live))
    for i in reversed(range(len(graph.initializer))):  # in place: the embedding table is not copied again
        if graph.initializer[i].name not in needed:
            del graph.initializer[i]
    # the restored nodes' fp32 weights; not a tensor the quantized graph computes (a dequantized bias) by that name
    present = {init.name for init in graph.initializer} | {name for node in live for name in node.output}
    graph.initializer.extend(init for init in fp32.graph.initializer if init.name in needed - present)
    for i in reversed(range(len(graph.value_info))):
        if graph.value_info[i].name not in needed:
            del graph.value_info[i]
    return model


def _by_output(fp32: onnx.ModelProto, names: Collection[str], written: set[str]) -> dict[str, onnx.NodeProto]:
    """The fp32 graph's nodes `names`, by their first output (what the quantized node that replaced each writes),
    each of which must be among `written` (the outputs of the quantized graph's nodes that may replace one)."""
    originals = {node.name: node for node in fp32.graph.node if node.name in names}
    missing = set(names) - set(originals)
    if missing:
        raise ValueError(f"no such nodes in the fp32 graph: {sorted(missing)}")
    unmatched = sorted(node.name for node in originals.values() if node.output[0] not in written)
    if unmatched:
        raise ValueError(f"no node of the quantized graph writes the output of {unmatched}")
    return {node.output[0]: node for node in originals.values()}


def switch_input(name: str) -> str:
    """The bool input of a `switchable` graph that puts node `name` back in fp32 (true) or keeps it int8 (false)."""
    return f"fp32:{name}"


def switchable(quantized: onnx.ModelProto, fp32: onnx.ModelProto, names: Collection[str]) -> onnx.ModelProto:
    """`quantized` in which each of `names` computes both ways and a scalar bool input (switch_input) picks which.

    Why: the parity search scores a dozen mixes of the same graph. As graphs of their own, each one was serialized
    whole (the embedding table with it) and parsed into a session of its own: most of a teacher-layer student's
    export. One session of this graph serves every mix; a mix's flags give what with_fp32_nodes' graph of that mix
    gives (test_export.py checks it), at the cost of running each switchable MatMul both ways."""
    by_output = _by_output(fp32, names, {node.output[0] for node in quantized.graph.node if node.output})
    model = onnx.ModelProto()
    model.CopyFrom(quantized)
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        original = by_output.get(node.output[0]) if node.output else None
        if original is None:
            nodes.append(node)
            continue
        output = node.output[0]
        node.output[0] = f"{output}/int8"
        restored = onnx.NodeProto()
        restored.CopyFrom(original)
        restored.name = f"{original.name}/fp32"
        restored.output[0] = f"{output}/fp32"
        flag = switch_input(original.name)
        graph.input.append(onnx.helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, []))
        nodes += [node, restored, onnx.helper.make_node("Where", [flag, restored.output[0], node.output[0]], [output],
                                                        name=f"{original.name}/switch")]
    del graph.node[:]
    graph.node.extend(nodes)
    present = {init.name for init in graph.initializer} | {name for node in nodes for name in node.output}
    wanted = {name for node in by_output.values() for name in node.input if name}
    graph.initializer.extend(init for init in fp32.graph.initializer if init.name in wanted - present)
    return model
