"""`tandem index check` (issue 45) with real models: the samples the indexer writes per segment, the student's
agreement on each, a segment of another domain (the demo corpus's standard-library docstrings) told apart from the
student's own, compaction, bundles without samples, and refusals. The grown root is the run's `drift_root`
(tests/fixtures/bundle.py), built once for this module, tests/tandem/test_agreement_trigger.py and the service's."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

from indexer.check import check
from indexer.versions.compact import compact
from indexer.versions.merge_policy import MergePolicy
from indexer.versions.request import VersionRequest
from indexer.versions.update import UpdateRequest, update
from models.bundle.manifest import BUNDLE_MANIFEST
from models.bundle.sample import SAMPLE_FILES, read_sample
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import read_current
from models.errors import ContractMismatch
from tandem.cli import main
from tests.fixtures.bundle import DRIFT_DOCS as DEMO_DOCS
from tests.fixtures.corpus import DOCS

pytestmark = pytest.mark.slow


def test_every_segment_written_keeps_a_sample_listed_and_checksummed(drift_root: Path) -> None:
    version = read_current(drift_root)
    manifest = read_bundle_manifest(version)
    first, second = manifest.parts
    for info, docs in ((first, len(DOCS)), (second, DEMO_DOCS)):
        sample = read_sample(version, manifest, info)
        assert sample is not None and len(sample) == docs  # fewer documents than the sample size: one query each
        assert sample.vectors.shape == (docs, manifest.teacher.dim)
        assert all(len(top) == 10 for top in sample.record.teacher_top)
    assert all(f"segments/v2/{name}" in manifest.files for name in SAMPLE_FILES)


def test_the_check_tells_the_other_domain_from_the_students_own(drift_root: Path, tiny_student: Path) -> None:
    report = check(drift_root, tiny_student)
    home, other = report.segments
    assert home.home and not other.home
    assert (home.queries, other.queries, report.overall.queries) == (len(DOCS), DEMO_DOCS, len(DOCS) + DEMO_DOCS)
    assert report.home.overlap == home.overlap
    assert other.overlap is not None and home.overlap is not None
    assert other.overlap < home.overlap  # a student of 20 documents knows nothing of docstrings
    assert other.student_hit is not None and home.student_hit is not None and other.student_hit < home.student_hit
    assert home.teacher_hit is not None and home.teacher_hit >= 0.9  # the teacher finds its titles' documents
    assert report.below == [s.segment for s in report.segments if s.below]
    assert other.below == (other.overlap < report.threshold * home.overlap)


def in_process_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int | str | None, str, str]:
    """`tandem ARGS` through the CLI's own entry point (tandem.cli.main: its exit codes and error lines) in
    this process, which has imported what the command imports already (a process of its own spends ~1 s on that).
    The loggers' levels and the root's handlers the command sets are put back, so the tests after it in this worker
    log as before."""
    manager, root = logging.Logger.manager, logging.getLogger()
    levels = {name: lg.level for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    root_level, root_handlers = root.level, list(root.handlers)
    capsys.readouterr()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "argv", ["tandem", *args])
            with pytest.raises(SystemExit) as done:
                main()
    finally:
        for name, lg in list(manager.loggerDict.items()):
            if isinstance(lg, logging.Logger):
                lg.setLevel(levels.get(name, logging.NOTSET))
        root.setLevel(root_level)
        for handler in [h for h in root.handlers if h not in root_handlers]:
            root.removeHandler(handler)
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int | str | None, str, str]:
    return in_process_cli(capsys, "index", "check", *args)


def test_the_command_prints_json_and_refuses_a_bad_root_or_student(drift_root: Path, tiny_student: Path,
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _check(capsys, "--root", str(drift_root), "--student", str(tiny_student), "--json")
    assert code == 0, err
    body = json.loads(out)
    assert [s["segment"] for s in body["segments"]] == ["base", "v2"]
    assert body["overall"]["queries"] == len(DOCS) + DEMO_DOCS
    code, out, err = _check(capsys, "--root", str(drift_root), "--student", str(tiny_student))
    assert code == 0 and "overlap@10" in out and "threshold" in out, err
    code, _, err = _check(capsys, "--root", str(drift_root), "--student", str(tmp_path))
    assert code == 2 and "student.json is missing" in err
    code, _, err = _check(capsys, "--root", str(tmp_path / "nowhere"), "--student", str(tiny_student))
    assert code == 2 and "manifest.json is missing" in err


def test_a_bundle_without_samples_loads_and_its_agreement_is_unknown(tiny_root: Path, tiny_student: Path,
                                                                     tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(read_current(tiny_root), old)
    manifest = read_bundle_manifest(old)
    for name in SAMPLE_FILES:
        (old / name).unlink()
    files = {n: h for n, h in manifest.files.items() if n not in SAMPLE_FILES}
    (old / BUNDLE_MANIFEST).write_text(manifest.model_copy(update={"files": files}).model_dump_json())
    report = check(old, tiny_student)
    assert [(s.queries, s.overlap, s.below) for s in report.segments] == [(0, None, None)]
    assert report.overall.queries == 0 and report.below == []


def test_a_changed_sample_is_refused(tiny_root: Path, tiny_student: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(read_current(tiny_root), bundle)
    sample = bundle / SAMPLE_FILES[0]
    sample.write_text(sample.read_text() + " ")
    with pytest.raises(ContractMismatch, match="checksum mismatch"):
        check(bundle, tiny_student)


def test_compaction_keeps_its_inputs_samples_for_live_documents(drift_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(drift_root, root)
    deletes = tmp_path / "deletes.jsonl"
    deletes.write_text(json.dumps({"_id": "bake", "delete": True}) + "\n")
    update(UpdateRequest(changes=deletes, root=root, version="v3"))
    compact(VersionRequest(root=root, version="v4"), MergePolicy(full=True))
    version = read_current(root)
    manifest = read_bundle_manifest(version)
    (info,) = manifest.parts
    sample = read_sample(version, manifest, info)
    assert sample is not None
    assert len(sample) == len(DOCS) + DEMO_DOCS - 1 and "bake" not in sample.record.sources
    assert sample.record.version == "v4"
