"""What a second `tandem demo serve` may reuse: the corpus, the bundle and the student, each keyed by its inputs.

Each artifact is reused only when every input that changes it is what this run would use; otherwise it is rebuilt,
and the log says which input changed. The bundle's and the student's keys are read from their own manifests (what
was built, not a note beside it that could go stale):
- bundle: the corpus bytes (sha256), the teacher's fingerprint, the teacher's precision (`--precision auto` as this
  machine picks it) and the bundle format this code writes;
- student: the same corpus, teacher and precision (its targets' precision), the preset's every field, and the
  student format this code writes.
The corpus itself is the stdlib's docstrings as this Python ships them: its walk (seconds in a fresh interpreter)
is skipped when a key file beside it records the same Python, stdlib, walker code and `max_docs`, and the corpus
still has the bytes recorded then.
"""

from __future__ import annotations

import json
import logging
import sys
import sysconfig
from pathlib import Path
from typing import Any

from models.atomic import atomic_write
from models.bundle.manifest import BUNDLE_FORMAT, BundleManifest
from models.bundle.version import read_bundle_manifest
from models.distill.presets import Preset
from models.encoders.student import read_student_manifest
from models.encoders.student_manifest import STUDENT_FORMAT, StudentManifest
from models.errors import ContractMismatch
from models.hashing import sha256_file

log = logging.getLogger(__name__)

Key = dict[str, Any]
CORPUS_KEY_SUFFIX = ".key.json"


def bundle_key(corpus_sha256: str, teacher_fingerprint: str, precision: str) -> Key:
    """The inputs a demo bundle is built from, as this run would build it."""
    return {"corpus_sha256": corpus_sha256, "teacher": teacher_fingerprint, "precision": precision,
            "bundle_format": BUNDLE_FORMAT}


def student_key(corpus_sha256: str, teacher_fingerprint: str, precision: str, preset: Preset) -> Key:
    """The inputs a demo student is distilled from, as this run would distill it."""
    return {"corpus_sha256": corpus_sha256, "teacher": teacher_fingerprint, "precision": precision,
            "preset": preset.model_dump(mode="json"), "student_format": STUDENT_FORMAT}


def built_bundle_key(manifest: BundleManifest) -> Key:
    """The same inputs as the bundle's manifest records them (precision: fp32 where an older build recorded none)."""
    return {"corpus_sha256": manifest.corpus.sha256, "teacher": manifest.teacher.fingerprint,
            "precision": manifest.embeddings.precision or "fp32", "bundle_format": manifest.format_version}


def built_student_key(manifest: StudentManifest) -> Key:
    """The same inputs as the student's manifest records them (None where it records none: never reused)."""
    trained = manifest.trained_on
    return {"corpus_sha256": trained.corpus_sha256 if trained else None, "teacher": manifest.teacher.fingerprint,
            "precision": trained.teacher_precision if trained else None,
            "preset": manifest.training.get("preset"), "student_format": manifest.format_version}


def changed(built: Key | None, wanted: Key) -> list[str]:
    """The inputs whose recorded value differs from this run's (every one when nothing was built)."""
    if built is None:
        return list(wanted)
    return [name for name, value in wanted.items() if built.get(name) != value]


def _describe(built: Key | None, names: list[str]) -> str:
    if built is None:
        return "none was built"
    return ", ".join(f"{n} changed" if n == "preset" else f"{n} {built.get(n)!r} changed" for n in names)


def reusable(what: str, path: Path, built: Key | None, wanted: Key) -> bool:
    """Whether the artifact at `path` can be served as it is; logs what was reused, or why it is rebuilt."""
    stale = changed(built, wanted)
    if not stale:
        log.info("demo %s reused: %s (its inputs are unchanged: %s)", what, path,
                 ", ".join(n for n in wanted if n != "preset") + (", preset" if "preset" in wanted else ""))
        return True
    log.info("demo %s: building %s (%s)", what, path, _describe(built, stale))
    return False


def read_bundle_key(bundle: Path) -> Key | None:
    try:
        return built_bundle_key(read_bundle_manifest(bundle))
    except ContractMismatch:  # none there, unreadable, or another format: rebuilt
        return None


def read_student_key(student: Path) -> Key | None:
    try:
        return built_student_key(read_student_manifest(student))
    except ContractMismatch:
        return None


def corpus_key(max_docs: int, walker: Path) -> Key:
    """What the stdlib walk's output depends on: this Python and its stdlib, the walking code, `max_docs`."""
    return {"python": sys.version, "executable": sys.executable, "stdlib": sysconfig.get_paths()["stdlib"],
            "walker_sha256": sha256_file(walker), "max_docs": max_docs}


def _key_file(corpus: Path) -> Path:
    return corpus.with_name(corpus.name + CORPUS_KEY_SUFFIX)


def recorded_corpus(corpus: Path, key: Key) -> int | None:
    """The document count of a corpus written earlier under the same key, with the bytes it had then; else None."""
    try:
        recorded = json.loads(_key_file(corpus).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or recorded.get("key") != key or not corpus.is_file():
        return None
    if recorded.get("sha256") != sha256_file(corpus):
        return None
    count = recorded.get("documents")
    return count if isinstance(count, int) else None


def record_corpus(corpus: Path, key: Key, documents: int) -> None:
    """Note the key the corpus was written under (after the corpus itself, so a torn write is never reused)."""
    body = {"key": key, "sha256": sha256_file(corpus), "documents": documents}
    atomic_write(_key_file(corpus), lambda fh: fh.write(json.dumps(body, indent=1).encode()))
