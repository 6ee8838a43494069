"""Opening an index bundle: manifest, vectors and documents, checked against each other."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import numpy as np

from models.contract import TeacherRef, check_same_teacher
from models.docstore import DOCSTORE_FILE, DocStore
from models.errors import ContractMismatch
from models.index_spec import Quantization
from models.manifest import BUNDLE_MANIFEST, BundleManifest, FusionSpec, read_manifest
from models.registry import sha256_file
from models.rotation import ROTATION_FILE, Rotation
from models.search.lexical import LEXICAL_DIR, LexicalIndex
from models.search.payload import PayloadIndex
from models.search.payload_writer import payload_files
from models.search.vector_index import (
    CALIBRATION_FILE,
    CENTER_FILE,
    INDEX_FILE,
    RESCORE_FILE,
    SPIN_FILE,
    VectorIndex,
)

log = logging.getLogger(__name__)


class NoLexicalIndex(ValueError):
    """Lexical or hybrid search asked of a bundle without a lexical index."""


def read_bundle_manifest(directory: Path) -> BundleManifest:
    return read_manifest(Path(directory) / BUNDLE_MANIFEST, BundleManifest, "index bundle")


def required_files(manifest: BundleManifest) -> list[str]:
    """Every file the loader reads for this manifest: each must be listed (and so checksummed) in `files`."""
    names = [INDEX_FILE, DOCSTORE_FILE]
    if manifest.quantization is not Quantization.FLOAT:
        names.append(CALIBRATION_FILE)
    if manifest.quantization is Quantization.BINARY:
        names.append(RESCORE_FILE)
    if manifest.rotation is not Rotation.NONE:
        names.append(ROTATION_FILE)
    if manifest.binary_center:
        names.append(CENTER_FILE)
    if manifest.binary_spin:
        names.append(SPIN_FILE)
    if manifest.payload is not None:
        names += payload_files(manifest.payload)
    return names


def _lexical_files(directory: Path, manifest: BundleManifest) -> list[str]:
    """The files of the lexical index on disk: the BM25 loader reads its directory, so each must be listed."""
    lexical = directory / LEXICAL_DIR
    if manifest.lexical is None or not lexical.is_dir():
        return []
    return sorted(f"{LEXICAL_DIR}/{p.name}" for p in lexical.iterdir())


def _check_listed(directory: Path, manifest: BundleManifest) -> None:
    unlisted = [name for name in required_files(manifest) + _lexical_files(directory, manifest)
                if name not in manifest.files]
    if unlisted:
        raise ContractMismatch(f"{directory}: the manifest does not list {', '.join(unlisted)}, which the loader "
                               "reads; an unlisted file is never checksummed")
    for name in manifest.files:
        path = directory / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise ContractMismatch(f"{directory}: {name} is not a regular file of the bundle")


def verify_bundle(directory: Path) -> BundleManifest:
    """Check every file the manifest lists against its recorded sha256; raise naming the first bad one.

    Reading every byte is slow for large bundles, so loading does not do it; operators run
    `tandem index verify`, and a hot reload does it before swapping a bundle in. The manifest must list
    every file the loader reads, each a regular file inside the bundle (no link out of it).
    """
    directory = Path(directory)
    manifest = read_bundle_manifest(directory)
    _check_listed(directory, manifest)
    for name, expected in manifest.files.items():
        path = directory / name
        if not path.is_file():
            raise ContractMismatch(f"{directory}: bundle is incomplete, missing {name}")
        actual = sha256_file(path)
        if actual != expected:
            log.warning("%s: sha256 %s, the manifest says %s", path, actual, expected)
            raise ContractMismatch(
                f"{path}: checksum mismatch with the manifest; the bundle is corrupted or was modified after publishing"
            )
    return manifest


class Bundle:
    """A loaded, read-only bundle, its files checked against its manifest; models.search searches it."""

    def __init__(self, directory: Path, lexical: bool = True) -> None:
        """Load the bundle; `lexical=False` skips the BM25 index (an update rebuilds it: it needs no vocabulary)."""
        self.directory = Path(directory).resolve()
        self.manifest = read_bundle_manifest(self.directory)
        _check_listed(self.directory, self.manifest)
        missing = [name for name in self.manifest.files if not (self.directory / name).is_file()]
        if missing:
            raise ContractMismatch(f"{self.directory}: bundle is incomplete, missing {', '.join(missing)}")
        try:
            self.vectors = VectorIndex.load(self.directory, self.manifest.dim, self.manifest.quantization,
                                            self.manifest.index, centered=self.manifest.binary_center,
                                            spun=self.manifest.binary_spin)
            self.rotation = self._load_rotation()
        except ValueError as exc:  # ours: says what does not match
            raise ContractMismatch(f"{self.directory}: unreadable index files: {exc}") from exc
        except (RuntimeError, OSError) as exc:
            # FAISS's or the OS's text (source paths, internals) goes to the log, not into the error.
            log.error("%s: unreadable index files: %s", self.directory, exc)
            raise ContractMismatch(f"{self.directory}: unreadable index files ({type(exc).__name__})") from exc
        if self.vectors.count != self.manifest.count:
            raise ContractMismatch(
                f"{self.directory}: index holds {self.vectors.count} vectors, manifest says {self.manifest.count}"
            )
        self.docs = DocStore(self.directory / DOCSTORE_FILE)
        try:
            rows = self.docs.count()
        except sqlite3.DatabaseError as exc:
            self.docs.close()
            log.error("%s: unreadable docstore: %s", self.directory, exc)
            raise ContractMismatch(f"{self.directory}: unreadable {DOCSTORE_FILE} ({type(exc).__name__})") from exc
        if rows != self.manifest.count:
            self.docs.close()
            raise ContractMismatch(f"{self.directory}: {DOCSTORE_FILE} holds {rows} documents, "
                                   f"manifest says {self.manifest.count}")
        try:
            self.lexical = None if self.manifest.lexical is None or not lexical else LexicalIndex(
                self.directory, self.manifest.lexical)
        except (ValueError, OSError, KeyError) as exc:
            self.docs.close()
            log.error("%s: unreadable lexical index: %s", self.directory, exc)
            raise ContractMismatch(f"{self.directory}: unreadable lexical index ({type(exc).__name__})") from exc
        try:  # memory-mapped: loading reads the arrays' headers only
            self.payload = None if self.manifest.payload is None else PayloadIndex(
                self.directory, self.manifest.payload, self.manifest.count)
        except (ValueError, OSError) as exc:
            self.docs.close()
            log.error("%s: unreadable payload index: %s", self.directory, exc)
            raise ContractMismatch(f"{self.directory}: unreadable payload index ({type(exc).__name__})") from exc
        self.fusion = self.manifest.fusion or FusionSpec()
        log.info("bundle %s: %d docs, %d-d %s %s", self.directory, self.manifest.count, self.manifest.dim,
                 self.manifest.quantization.value, self.manifest.index.type.value)

    def _load_rotation(self) -> np.ndarray | None:
        if self.manifest.rotation is Rotation.NONE:
            return None
        matrix = np.load(self.directory / ROTATION_FILE)
        width = self.manifest.teacher.dim
        if matrix.shape != (width, width):
            raise ValueError(f"{ROTATION_FILE} has shape {matrix.shape}, expected {(width, width)}")
        return np.asarray(matrix, dtype=np.float32)

    @property
    def teacher(self) -> TeacherRef:
        return self.manifest.teacher

    def check_student(self, student_teacher: TeacherRef) -> None:
        check_same_teacher(student_teacher, self.teacher)
        if self.manifest.dim > student_teacher.dim:
            raise ContractMismatch(f"bundle dim {self.manifest.dim} exceeds the student's {student_teacher.dim}")

    @property
    def filter_fields(self) -> frozenset[str]:
        """The fields a filter may name: the metadata keys present, and the declared fields (even if none holds a
        value)."""
        declared = [f.name for f in self.manifest.payload.fields] if self.manifest.payload is not None else []
        return frozenset([*self.manifest.metadata_fields, *declared])

    def require_lexical(self) -> LexicalIndex:
        """The lexical index, or NoLexicalIndex (a 422 in the service) for a bundle built without one."""
        if self.lexical is None:
            raise NoLexicalIndex(f"bundle {self.directory.name} has no lexical index (built before lexical "
                                 "search existed); rebuild it with `tandem index build` for mode lexical or hybrid")
        return self.lexical

    def close(self) -> None:
        self.docs.close()
