"""`tandem serve` refuses a student from another teacher space before loading anything heavy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from models.bundle.manifest import BUNDLE_MANIFEST
from models.encoders.student_manifest import STUDENT_MANIFEST
from models.errors import ContractMismatch
from service.core.loader import check_compatible
from service.settings import ServiceSettings
from tests.fixtures import service_fast

CLI_TIMEOUT_S = 120

MISMATCHES: dict[str, tuple[dict[str, object], str]] = {
    "fingerprint": ({"fingerprint": "0" * 64}, "fingerprint"),
    "dim": ({"dim": 384}, "384-d"),
}


def altered_student(
    student: Path, out: Path, teacher: dict[str, object] | None = None, drop: str | None = None
) -> Path:
    """A copy of `student` whose student.json claims another teacher, or that lacks the file `drop`;
    the weights are linked, not copied."""
    out.mkdir()
    for item in student.iterdir():
        if item.name not in (STUDENT_MANIFEST, drop):
            (out / item.name).symlink_to(item.resolve())
    manifest = json.loads((student / STUDENT_MANIFEST).read_text())
    manifest["teacher"].update(teacher or {})
    (out / STUDENT_MANIFEST).write_text(json.dumps(manifest))
    return out


def serve_cli(index: Path, student: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`tandem serve` run to its end in a process of its own (forked warm: tests/fixtures/service_fast.py)."""
    return service_fast.run(["serve", "--index", str(index), "--student", str(student), "--port", "0"],
                            env={**os.environ, **(env or {})}, timeout=CLI_TIMEOUT_S)


def test_matching_pair_is_accepted(mini_bundle: Path, mini_student: Path) -> None:
    bundle, student = check_compatible(ServiceSettings(index=mini_bundle, student=mini_student))
    assert student.teacher.fingerprint == bundle.teacher.fingerprint


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_check_compatible_names_the_difference(mini_bundle: Path, mini_student: Path, tmp_path: Path,
                                               case: str) -> None:
    changes, expected = MISMATCHES[case]
    student = altered_student(mini_student, tmp_path / "student", changes)
    with pytest.raises(ContractMismatch, match=expected):
        check_compatible(ServiceSettings(index=mini_bundle, student=student))


def test_check_compatible_names_a_missing_model_file(mini_bundle: Path, mini_student: Path, tmp_path: Path) -> None:
    student = altered_student(mini_student, tmp_path / "student", drop="model.int8.onnx")
    with pytest.raises(ContractMismatch, match=r"incomplete, missing model\.int8\.onnx"):
        check_compatible(ServiceSettings(index=mini_bundle, student=student))


def test_serve_cli_exits_nonzero_with_the_reason(mini_bundle: Path, mini_student: Path, tmp_path: Path) -> None:
    """One mismatch through the CLI: every mismatch is a ContractMismatch from check_compatible (each named by
    test_check_compatible_names_the_difference), which `tandem serve` prints and exits 2 on, whichever it is."""
    changes, expected = MISMATCHES["fingerprint"]
    student = altered_student(mini_student, tmp_path / "student", changes)
    result = serve_cli(mini_bundle, student)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_cli_names_a_missing_bundle(mini_student: Path, tmp_path: Path) -> None:
    result = serve_cli(tmp_path / "no-bundle", mini_student)
    assert result.returncode == 2
    assert "manifest.json is missing" in result.stderr


def test_serve_cli_names_a_bad_setting(mini_bundle: Path, mini_student: Path) -> None:
    result = serve_cli(mini_bundle, mini_student, env={"TANDEM_STUDENT_PRECISION": "fp16"})
    assert result.returncode == 2
    assert "TANDEM_STUDENT_PRECISION" in result.stderr
    assert "Traceback" not in result.stderr


def test_manifests_written_before_pooling_and_prompts_were_recorded_still_pair(
    mini_bundle: Path, mini_student: Path, tmp_path: Path
) -> None:
    student = altered_student(mini_student, tmp_path / "student")
    manifest = json.loads((student / STUDENT_MANIFEST).read_text())
    del manifest["backbone_pooling"]
    for key in ("pooling", "query_prompt", "document_prompt"):
        del manifest["teacher"][key]
    (student / STUDENT_MANIFEST).write_text(json.dumps(manifest))
    index = Path(shutil.copytree(mini_bundle, tmp_path / "bundle"))
    recorded = json.loads((index / BUNDLE_MANIFEST).read_text())
    recorded["teacher"] = {k: recorded["teacher"][k] for k in ("name", "fingerprint", "dim")}
    (index / BUNDLE_MANIFEST).write_text(json.dumps(recorded))
    bundle, older = check_compatible(ServiceSettings(index=index, student=student))
    assert older.backbone_pooling == "mean" and older.teacher.pooling is None and bundle.teacher.pooling is None
    assert older.teacher.setup_text() == bundle.teacher.setup_text() == "pooling mean, no prompts"
