"""`tandem index verify`: prove a published bundle is what its manifest says, before trusting it.

Checks every file's sha256 against the manifest (models.bundle.version.verify_version), that the FAISS
index, the docstore and the manifest agree on the count, that the payload index's columns hold what the
search relies on (sorted values, rows inside the bundle), and that the manifest's teacher is the
provisioned (or --teacher) model when one is available; says how that teacher pooled and which
prompts it put before queries and documents. Works on a bundle directory or a root.
"""

from __future__ import annotations

import logging
from pathlib import Path

from models.bundle.manifest import BundleManifest, EmbeddingSource
from models.bundle.version import Bundle, read_bundle_manifest, verify_version
from models.bundle.versions import is_bundle_root, list_versions, read_current
from models.contract import TeacherRef
from models.encoders.registry import load_card, resolve
from models.errors import ContractMismatch, ModelNotFound, TandemError

log = logging.getLogger(__name__)


def _teacher_note(directory: Path, recorded: TeacherRef, teacher: Path | None) -> str:
    """The teacher as the manifest records it (pooling, prompts), and whether the provisioned one is that teacher."""
    setup = recorded.setup_text()
    try:
        card = load_card(resolve("teacher", teacher))
    except ModelNotFound:
        if teacher is not None:
            raise
        return f"teacher {recorded.name} ({setup}) not provisioned here, fingerprint not checked"
    if card.fingerprint != recorded.fingerprint or card.dim != recorded.dim:
        raise ContractMismatch(
            f"{directory / 'manifest.json'}: built with teacher fingerprint {recorded.fingerprint[:16]}… "
            f"({recorded.dim}-d, {setup}) but the teacher model at {card.path} has {card.fingerprint[:16]}… "
            f"({card.dim}-d, {card.teacher_ref().setup_text()})"
        )
    return f"teacher {card.name} {card.fingerprint[:12]} matches ({setup})"


def verify_one(directory: Path, teacher: Path | None = None) -> str:
    """One-line summary of a bundle that passed every check; raises naming the file that failed."""
    directory = Path(directory)
    manifest = read_bundle_manifest(directory)  # once: the files are checked against it, and loaded by it
    verified = verify_version(directory, manifest).files
    # Loading checks each segment's FAISS ntotal and docstore rows against the manifest, and its tombstones.
    bundle = Bundle(directory, manifest=manifest, verified=verified)
    try:
        for segment in bundle.segments:
            if segment.payload is not None:
                try:
                    segment.payload.check()
                except ValueError as exc:
                    raise ContractMismatch(f"{segment.directory}: {exc}") from exc
    finally:
        bundle.close()
    _check_corpus_rows(directory, manifest)
    note = _teacher_note(directory, manifest.teacher, teacher)
    fields = f", {len(manifest.payload.fields)} payload fields" if manifest.payload is not None else ""
    return (f"ok {directory}: {manifest.count} docs, {manifest.dim}-d {manifest.quantization.value} "
            f"{manifest.index.type.value}{fields}, {_segments(manifest)}, {len(manifest.files)} files "
            f"sha256-verified, {note}, vectors {_computed_by(manifest.embeddings)}")


def _check_corpus_rows(directory: Path, manifest: BundleManifest) -> None:
    """The corpus's documents are the rows of the segments the build wrote it into: the first, and with
    `--segment-rows` NAME-1, NAME-2, …; a partial compaction may have merged some of the latter away."""
    first = manifest.parts[0]
    written = manifest.corpus.segments or 1
    names = {first.name, *(f"{first.name}-{i}" for i in range(1, written))}
    held = [s.count for s in manifest.parts if s.name in names]
    rows = sum(held)
    if rows != manifest.corpus.count if len(held) == written else rows >= manifest.corpus.count:
        raise ContractMismatch(f"{directory / 'manifest.json'}: corpus count {manifest.corpus.count} differs from "
                               f"the {rows} rows of the {written} segment(s) the build wrote it into")


def _segments(manifest: BundleManifest) -> str:
    parts = manifest.parts
    return f"{len(parts)} segment{'s' if len(parts) > 1 else ''}, {manifest.deleted} deleted rows"


def _computed_by(source: EmbeddingSource) -> str:
    """What computed the document vectors, as the manifest records it (older bundles: not recorded)."""
    if source.kind == "imported":
        return "imported" + (f" from {source.path}" if source.path else "")
    if source.precision is None:
        return "encoded (precision not recorded)"
    return f"encoded in {source.precision} on {source.device or '?'} by the {source.engine or 'local'} engine"


def verify(path: Path, all_versions: bool = False, teacher: Path | None = None) -> list[str]:
    """Summaries of the bundles checked: `path` itself, a root's CURRENT, or with `all_versions` every version."""
    path = Path(path)
    if not path.is_dir():
        raise ContractMismatch(f"{path}: no such bundle directory or bundle root")
    if not is_bundle_root(path):
        if all_versions:
            raise ContractMismatch(f"{path}: --all needs a bundle root (a directory with a CURRENT file)")
        return [verify_one(path, teacher)]
    if not all_versions:
        return [verify_one(read_current(path), teacher)]
    current = read_current(path).name
    lines, failures = [], []
    for version in list_versions(path):
        try:
            line = verify_one(path / version, teacher)
            lines.append(line + (" [CURRENT]" if version == current else ""))
        except TandemError as exc:
            log.error("%s", exc)
            failures.append(str(exc))
    if failures:
        raise ContractMismatch(f"{len(failures)} of {len(failures) + len(lines)} versions under {path} failed: "
                               + "; ".join(failures))
    return lines
