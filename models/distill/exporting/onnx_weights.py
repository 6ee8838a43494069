"""A published student's torch weights, read back from its fp32 ONNX graph (for `tandem distill --from`).

A student directory keeps no torch checkpoint: the training run's checkpoints are deleted once the
student is exported (pipeline.py), and the fp32 graph holds every weight at full precision. The
export (export.py) names the graph's tensors after the torch module, except where ORT's BERT
fusions repacked them: a weight MatMul's constant is the Linear's weight transposed (its node is
named after the module), and an Attention node packs the query, key and value Linears into one
[hidden, 3·hidden] weight and one bias (its output is named after the layer's attention module).
Every float tensor of the model must be found, and the caller checks the rebuilt model against the
graph's own vectors before training from it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from models.distill.model import StudentModel
from models.errors import ContractMismatch

_MODULE = re.compile(r"^/(?P<path>.+)/MatMul$")
_ATTENTION = re.compile(r"^/(?P<path>.+)/attention/self/")


def onnx_state(path: Path) -> dict[str, np.ndarray]:
    """Torch state-dict names → float32 arrays, from a student's fp32 ONNX graph (fused or not)."""
    graph = onnx.load(str(path)).graph
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    state = {name: array for name, array in constants.items() if "." in name and not name.startswith("onnx::")}
    for node in graph.node:
        if node.op_type == "MatMul" and (match := _MODULE.match(node.name)):
            weight = next((constants[i] for i in node.input if i in constants), None)
            if weight is not None and weight.ndim == 2:
                state[match["path"].replace("/", ".") + ".weight"] = weight.T
        elif node.op_type == "Attention" and node.output and (match := _ATTENTION.match(node.output[0])):
            prefix = match["path"].replace("/", ".") + ".attention.self"
            weight, bias = constants[node.input[1]], constants[node.input[2]]
            for part, w, b in zip(("query", "key", "value"), np.split(weight, 3, axis=1), np.split(bias, 3),
                                  strict=True):
                state[f"{prefix}.{part}.weight"] = w.T
                state[f"{prefix}.{part}.bias"] = b
    return state


def load_onnx_weights(model: StudentModel, path: Path) -> list[str]:
    """Copy the graph's weights into `model`; returns the float tensors the graph does not hold (the backbone's
    own are kept: the graph drops what its output does not use, such as BERT's pooler). Raises
    ContractMismatch when the graph holds none of the model's tensors or one of another shape."""
    found = onnx_state(path)
    current = model.state_dict()
    floats = [name for name, t in current.items() if t.is_floating_point()]
    missing = [name for name in floats if name not in found]
    misshaped = [name for name in floats if name in found and tuple(found[name].shape) != tuple(current[name].shape)]
    if misshaped or len(missing) == len(floats):
        raise ContractMismatch(
            f"{path}: cannot rebuild the student's torch weights from its graph ({len(floats) - len(missing)} of "
            f"{len(floats)} tensors found; of another shape: {misshaped[:3]}): `distill --from` needs a student "
            "exported by `tandem distill` from the same backbone")
    update = {name: torch.tensor(found[name], dtype=current[name].dtype)
              for name in floats if name in found}
    model.load_state_dict(update, strict=False)
    return missing
