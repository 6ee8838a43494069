"""Opening an index bundle: manifest, vectors and documents, checked against each other."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.contract import TeacherRef, check_same_teacher
from models.corpus import Document
from models.docstore import DOCSTORE_FILE, DocStore
from models.errors import ContractMismatch
from models.lexical import LexicalIndex
from models.manifest import BUNDLE_MANIFEST, BundleManifest, FusionSpec, read_manifest
from models.registry import sha256_file
from models.rotation import ROTATION_FILE, Rotation, rotate
from models.vector_index import DEFAULT_OVERSAMPLE, VectorIndex

log = logging.getLogger(__name__)


class NoLexicalIndex(ValueError):
    """Lexical or hybrid search asked of a bundle without a lexical index."""


@dataclass(frozen=True)
class Hit:
    row: int
    score: float
    doc: Document


def read_bundle_manifest(directory: Path) -> BundleManifest:
    return read_manifest(Path(directory) / BUNDLE_MANIFEST, BundleManifest, "index bundle")


def verify_bundle(directory: Path) -> BundleManifest:
    """Check every file the manifest lists against its recorded sha256; raise naming the first bad one.

    Reading every byte is slow for large bundles, so loading does not do it; operators run
    `tandem index verify`, and a hot reload does it before swapping a bundle in.
    """
    directory = Path(directory)
    manifest = read_bundle_manifest(directory)
    for name, expected in manifest.files.items():
        path = directory / name
        if not path.is_file():
            raise ContractMismatch(f"{directory}: bundle is incomplete, missing {name}")
        actual = sha256_file(path)
        if actual != expected:
            raise ContractMismatch(
                f"{path}: checksum mismatch (manifest sha256 {expected[:16]}…, file {actual[:16]}…); "
                "the bundle is corrupted or was modified after publishing"
            )
    return manifest


class Bundle:
    """A loaded, read-only bundle: search with full-dimension unit query vectors."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory).resolve()
        self.manifest = read_bundle_manifest(self.directory)
        missing = [name for name in self.manifest.files if not (self.directory / name).is_file()]
        if missing:
            raise ContractMismatch(f"{self.directory}: bundle is incomplete, missing {', '.join(missing)}")
        try:
            self.vectors = VectorIndex.load(self.directory, self.manifest.dim, self.manifest.quantization,
                                            self.manifest.index, centered=self.manifest.binary_center,
                                            spun=self.manifest.binary_spin)
            self.rotation = self._load_rotation()
        except (RuntimeError, ValueError, OSError) as exc:
            raise ContractMismatch(f"{self.directory}: unreadable index files: {exc}") from exc
        self.docs = DocStore(self.directory / DOCSTORE_FILE)
        try:
            self.lexical = None if self.manifest.lexical is None else LexicalIndex(self.directory,
                                                                                    self.manifest.lexical)
        except (ValueError, OSError, KeyError) as exc:
            self.docs.close()
            raise ContractMismatch(f"{self.directory}: unreadable lexical index: {exc}") from exc
        self.fusion = self.manifest.fusion or FusionSpec()
        if self.vectors.count != self.manifest.count:
            raise ContractMismatch(
                f"{self.directory}: index holds {self.vectors.count} vectors, manifest says {self.manifest.count}"
            )
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

    def require_lexical(self) -> LexicalIndex:
        """The lexical index, or NoLexicalIndex (a 422 in the service) for a bundle built without one."""
        if self.lexical is None:
            raise NoLexicalIndex(f"bundle {self.directory.name} has no lexical index (built before lexical "
                                 "search existed); rebuild it with `tandem index build` for mode lexical or hybrid")
        return self.lexical

    def search(self, queries: np.ndarray, k: int, oversample: int = DEFAULT_OVERSAMPLE) -> list[list[Hit]]:
        scores, rows = self.vectors.search(rotate(queries, self.rotation), k, oversample)
        out: list[list[Hit]] = []
        for srow, rrow in zip(scores, rows, strict=True):
            valid = [(int(r), float(s)) for r, s in zip(rrow, srow, strict=True) if r >= 0]
            docs = self.docs.get([r for r, _ in valid])
            out.append([Hit(row=r, score=s, doc=d) for (r, s), d in zip(valid, docs, strict=True)])
        return out

    def close(self) -> None:
        self.docs.close()
