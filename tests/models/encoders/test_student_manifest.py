"""models.encoders.student_manifest: student.json round-trips, an older one (no backbone pooling) reads as
mean-pooled, and a key it does not know is refused naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.contract import TeacherRef
from models.encoders.student import read_student_manifest
from models.encoders.student_manifest import STUDENT_MANIFEST, ParityReport, StudentManifest
from models.errors import ContractMismatch


def _manifest() -> StudentManifest:
    return StudentManifest(teacher=TeacherRef(name="t", fingerprint="f" * 64, dim=768), backbone="b",
                           backbone_fingerprint="e" * 64, max_seq_length=128,
                           parity=ParityReport(texts=3, fp32_mean_cosine=1.0, int8_mean_cosine=0.99,
                                               int8_min_cosine=0.98))


def test_a_student_manifest_round_trips(tmp_path: Path) -> None:
    manifest = _manifest()
    (tmp_path / STUDENT_MANIFEST).write_text(manifest.model_dump_json())
    assert read_student_manifest(tmp_path) == manifest
    assert (manifest.onnx_int8, manifest.backbone_pooling) == ("model.int8.onnx", "mean")


def test_an_older_manifest_is_mean_pooled_and_an_unknown_key_refused(tmp_path: Path) -> None:
    raw = json.loads(_manifest().model_dump_json(exclude={"backbone_pooling"}))
    (tmp_path / STUDENT_MANIFEST).write_text(json.dumps(raw))
    assert read_student_manifest(tmp_path).backbone_pooling == "mean"
    (tmp_path / STUDENT_MANIFEST).write_text(json.dumps({**raw, "pooling": "cls"}))
    with pytest.raises(ContractMismatch, match="invalid student manifest: pooling: Extra inputs are not permitted"):
        read_student_manifest(tmp_path)
