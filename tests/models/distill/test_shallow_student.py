"""A shallower backbone student (`backbone_layers`): the backbone cut to fewer layers, distilled, exported to int8,
served, and rebuilt from its graph for `distill --from`."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from models.bundle.version import Bundle
from models.distill.exporting.export import FP32_MIN_COSINE, INT8_MIN_COSINE
from models.distill.exporting.onnx_weights import load_onnx_weights
from models.distill.model import StudentModel, depth
from models.distill.pipeline import DistillRequest, run_distill
from models.distill.presets import Preset, resolve_preset
from models.distill.refresh import kept_layers
from models.encoders.registry import load_card
from models.encoders.student import StudentEncoder
from models.encoders.student_manifest import StudentManifest
from models.errors import InputError
from models.search import dense_hits
from tests.fixtures.corpus import PROBES
from tests.fixtures.student import TEST_PRESET, TEST_SEED
from tests.fixtures.tiny_models import StSpec, TinyModels


def test_backbone_layers_are_evenly_spaced_from_first_to_last() -> None:
    def kept(k: int | None, total: int = 6) -> list[int] | None:
        return Preset(name="t", backbone_layers=k).backbone_layer_indices(total)

    assert kept(None) is None and kept(6) is None and kept(8) is None  # all of them: nothing to cut
    assert (kept(1), kept(2), kept(3), kept(4)) == ([5], [0, 5], [0, 3, 5], [0, 2, 3, 5])


def test_backbone_layers_listed_are_kept_as_listed_and_checked() -> None:
    def kept(layers: list[int], total: int = 6) -> list[int] | None:
        return Preset(name="t", backbone_layers=layers).backbone_layer_indices(total)

    assert kept([0, 1, 2, 3]) == [0, 1, 2, 3] and kept([5]) == [5]
    assert kept([0, 1, 2, 3, 4, 5]) is None  # all of them: nothing to cut
    with pytest.raises(InputError, match=r"names a layer past the backbone's 6"):
        kept([0, 6])
    for bad in ([], [3, 1], [1, 1], [-1, 2]):
        with pytest.raises(ValueError, match="0-based, ascending, each once"):
            Preset(name="t", backbone_layers=bad)
    with pytest.raises(ValueError, match="at least one layer"):
        Preset(name="t", backbone_layers=0)


def test_backbone_layers_on_a_teacher_layers_preset_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "preset.json"
    path.write_text('{"name": "x", "student": "teacher-layers", "backbone_layers": 3}')
    with pytest.raises(InputError, match="backbone_layers cuts a backbone student"):
        resolve_preset(str(path))


def _layer_nodes(graph: Path) -> set[str]:
    """The encoder layers a graph's nodes are named after (/backbone/encoder/layer.N/...)."""
    return {part for node in onnx.load(str(graph)).graph.node for part in node.name.split("/")
            if part.startswith("layer.")}


def test_a_shallower_backbone_student_exports_serves_and_rebuilds(
    tiny_models: TinyModels, tiny_bundle: Path, tiny_corpus: Path, tmp_path: Path
) -> None:
    backbone = tiny_models.st(StSpec(arch="bert", pooling="mean"))
    hf_dir = load_card(backbone).hf_dir
    assert depth(hf_dir) == 3
    preset = TEST_PRESET.model_copy(update={"name": "shallow", "backbone_layers": 2})
    out = tmp_path / "shallow"
    manifest = run_distill(DistillRequest(corpus=tiny_corpus, index=tiny_bundle, out=out, preset=preset,
                                          seed=TEST_SEED, backbone=backbone))
    assert manifest.training["preset"]["backbone_layers"] == 2  # type: ignore[index]
    assert manifest.backbone == f"{load_card(backbone).name} layers [0, 2]"  # of 3, as the manifest shows it
    assert manifest.parity is not None
    assert manifest.parity.fp32_mean_cosine >= FP32_MIN_COSINE and manifest.parity.int8_mean_cosine >= INT8_MIN_COSINE
    assert _layer_nodes(out / manifest.onnx_fp32) == _layer_nodes(out / manifest.onnx_int8) == {"layer.0", "layer.1"}

    encoder = StudentEncoder(out, precision="int8", threads=1)  # as `tandem serve` loads it
    vectors = encoder.encode(list(PROBES))
    assert vectors.shape == (len(PROBES), manifest.teacher.dim)
    assert len(dense_hits(Bundle(tiny_bundle), vectors, k=3)[0]) == 3

    # distill --from rebuilds the cut architecture: every layer's weights come from the graph
    stored = StudentManifest.model_validate_json((out / "student.json").read_text())
    assert kept_layers(stored, hf_dir) == [0, 2]
    model = StudentModel(hf_dir, manifest.teacher.dim, backbone_layers=kept_layers(stored, hf_dir))
    assert not [name for name in load_onnx_weights(model, out / manifest.onnx_fp32) if ".layer." in name]
    assert model.backbone.config.num_hidden_layers == 2
