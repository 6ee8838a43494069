"""A version's space: what makes scores comparable across its segments, and the one place its files are written,
read and applied.

The space is the PCA rotation (`rotation.npy`, `--rotation pca`), the int8 calibration (`calibration.npy`, int8 and
binary), and for binary codes the corpus mean they leave out (`center.npy`) and the random orthogonal spin applied
before the signs (`spin.npy`). It is fitted on a version's first segment (a build, a compaction) and shared by every
later one (an update), whose vectors are scored in it unchanged
(docs/decisions.md#segments-share-the-first-segments-space). The indexer writes it once at a version's top level;
models.bundle.version reads it once per version and hands it to each segment's index.

Documents and queries go through the same transforms: `rotate` (full width), then MRL truncation (`project`), then
for binary the centered, spun sign bits (`sign_codes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from models.bundle.storage.integrity import load_checked_array
from models.bundle.vectors.index_spec import Quantization
from models.bundle.vectors.quantize import Int8Calibration, binary_encode
from models.bundle.vectors.rotation import ROTATION_FILE, PcaAccumulator, Rotation
from models.contract import TeacherRef, truncate

CALIBRATION_FILE = "calibration.npy"
CENTER_FILE = "center.npy"  # binary: the corpus mean subtracted before taking signs (documents and queries)
SPIN_FILE = "spin.npy"  # binary: the random orthogonal matrix applied after centering, before the signs
SPACE_FILES = (ROTATION_FILE, CALIBRATION_FILE, CENTER_FILE, SPIN_FILE)  # the version's, shared by its segments

# Full-dimension float32 unit vectors in row order, one chunk at a time; called once per pass.
VectorSource = Callable[[], Iterable[np.ndarray]]


class SpaceSpec(Protocol):
    """What a version's manifest says of its space (models.bundle.manifest.BundleManifest is one): the vector engine
    reads it through this shape, so it never imports the version's manifest above it."""

    @property
    def dim(self) -> int: ...
    @property
    def quantization(self) -> Quantization: ...
    @property
    def rotation(self) -> Rotation: ...
    @property
    def teacher(self) -> TeacherRef: ...
    @property
    def binary_center(self) -> bool: ...
    @property
    def binary_spin(self) -> bool: ...
    @property
    def files(self) -> Mapping[str, str]: ...


def rotate(vectors: np.ndarray, rotation: np.ndarray | None) -> np.ndarray:
    """Full-width vectors in a rotated basis (unchanged without a rotation); norms are preserved.

    The indexer rotates the documents with it (models.bundle.vectors.rotation fits the matrix), the search the
    queries."""
    if rotation is None:
        return vectors
    return row_exact_product(vectors, rotation)


def row_exact_product(x: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """x @ matrix in float32, each row the same whatever rows come with it.

    BLAS picks its kernel by shape (gemv for one row, gemm tiles for several), so a float32 product gives a row alone
    and the same row among others results that differ in the last bits; one such bit can move an int8 code or a
    sign, and then a compaction, which quantizes a segment's rows together again, would not reproduce the codes the
    rows had in their own segments. In float64 the kernels' differences sit some 29 bits below float32's precision,
    and the cast back rounds them away (all but exact ties)."""
    product = np.asarray(x, dtype=np.float64) @ np.asarray(matrix, dtype=np.float64)
    return product.astype(np.float32)


@lru_cache(maxsize=8)
def spin_matrix(dim: int, seed: int = 0) -> np.ndarray:
    """A random orthogonal [dim, dim] matrix (QR of a Gaussian), the same for a given seed.

    Kept once made (read-only): a QR of a 768×768 Gaussian costs more than fitting the rest of a small space, and
    the evaluation matrix fits a binary index at each dim for every setup and rotation (the same few matrices)."""
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, dim)))
    spin = np.ascontiguousarray(q * np.sign(np.diag(r)), dtype=np.float32)
    spin.flags.writeable = False
    return spin


def sign_codes(x: np.ndarray, center: np.ndarray | None = None, spin: np.ndarray | None = None) -> np.ndarray:
    """Binary codes of truncated vectors: the signs of (x − center) · spin, packed.

    The center (the corpus mean) keeps the bits of axes the mean dominates from being nearly constant;
    the spin, a random orthogonal matrix, spreads PCA's uneven variance evenly over the bits, so that
    trailing low-variance axes stop flipping on the student's small query errors
    (docs/decisions.md#binary-codes-centered-and-spun)."""
    y = x if center is None else x - center
    return binary_encode(y if spin is None else row_exact_product(y, spin))


def _load(directory: Path, name: str, files: Mapping[str, str] | None) -> np.ndarray:
    """`name` in `directory`; with `files` (a manifest's), from the very bytes checked against its sha256."""
    return np.load(directory / name) if files is None else load_checked_array(directory, name, files)


def _shaped(directory: Path, name: str, shape: tuple[int, ...], files: Mapping[str, str] | None) -> np.ndarray:
    array = np.asarray(_load(directory, name, files), dtype=np.float32)
    if array.shape != shape:
        raise ValueError(f"{name} has shape {array.shape}, expected {shape}")
    return array


@dataclass(frozen=True)
class Space:
    """A version's rotation, int8 calibration, binary center and spin (each None where the version has none)."""

    rotation: np.ndarray | None = None  # pca: [teacher dim, teacher dim]
    calibration: Int8Calibration | None = None  # int8 and binary: [2, dim] on disk
    center: np.ndarray | None = None  # binary: the first segment's mean, [dim]
    spin: np.ndarray | None = None  # binary: [dim, dim]

    @classmethod
    def fit(cls, count: int, source: VectorSource, *, dim: int, quantization: Quantization,
            rotation: Rotation = Rotation.NONE, center: bool = False, spin: bool = False) -> Space:
        """Fit the space on streamed full-dimension vectors: the PCA rotation (one pass), the int8 calibration (one
        pass) and, for binary, the mean the codes leave out (`center`, one pass) and the seeded spin."""
        matrix = None
        if rotation is Rotation.PCA:
            acc = PcaAccumulator()
            for chunk in source():
                acc.add(chunk)
            matrix = acc.matrix()
        fitted = cls(rotation=matrix)
        cal = None if quantization is Quantization.FLOAT else Int8Calibration.fit_stream(
            fitted.truncated(source(), dim))
        mean = None
        if center and quantization is Quantization.BINARY:
            total = np.zeros(dim, dtype=np.float64)
            for chunk in fitted.truncated(source(), dim):
                total += chunk.sum(axis=0, dtype=np.float64)
            mean = (total / max(1, count)).astype(np.float32)
        turn = spin_matrix(dim) if spin and quantization is Quantization.BINARY else None
        return cls(rotation=matrix, calibration=cal, center=mean, spin=turn)

    def save(self, directory: Path) -> list[str]:
        """Write the space's files into `directory` (a version's top level); returns their names."""
        names = []
        for name, array in ((ROTATION_FILE, self.rotation), (CENTER_FILE, self.center), (SPIN_FILE, self.spin)):
            if array is not None:
                np.save(directory / name, array)
                names.append(name)
        if self.calibration is not None:
            np.save(directory / CALIBRATION_FILE, self.calibration.to_array())
            names.append(CALIBRATION_FILE)
        return names

    @classmethod
    def read(cls, directory: Path, *, dim: int, quantization: Quantization, rotation_width: int | None = None,
             centered: bool = False, spun: bool = False, files: Mapping[str, str] | None = None) -> Space:
        """The space files in `directory`, each checked against its expected shape (ValueError says which does not
        match): the rotation when `rotation_width` is given, the calibration unless float, the center and spin when
        asked. With `files` (a manifest's name → sha256), each is loaded from the very bytes checked against it
        (models.bundle.storage.integrity: ContractMismatch names a file that differs)."""
        rotation = None
        if rotation_width is not None:
            rotation = _shaped(directory, ROTATION_FILE, (rotation_width, rotation_width), files)
        cal = None
        if quantization is not Quantization.FLOAT:
            cal = Int8Calibration.from_array(_load(directory, CALIBRATION_FILE, files))
            if cal.dim != dim:
                raise ValueError(f"{CALIBRATION_FILE} has dimension {cal.dim}, expected {dim}")
        center = _shaped(directory, CENTER_FILE, (dim,), files) if centered else None
        spin = _shaped(directory, SPIN_FILE, (dim, dim), files) if spun else None
        return cls(rotation=rotation, calibration=cal, center=center, spin=spin)

    @classmethod
    def of(cls, directory: Path, manifest: SpaceSpec) -> Space:
        """The space a version's segments share: the files at its top level that its manifest says it has, checked
        against the manifest's sha256 as they are read."""
        return cls.read(directory, dim=manifest.dim, quantization=manifest.quantization,
                        rotation_width=None if manifest.rotation is Rotation.NONE else manifest.teacher.dim,
                        centered=manifest.binary_center, spun=manifest.binary_spin, files=manifest.files)

    @staticmethod
    def files(manifest: SpaceSpec) -> list[str]:
        """The names of the space files a version with this manifest has."""
        names = []
        if manifest.quantization is not Quantization.FLOAT:
            names.append(CALIBRATION_FILE)
        if manifest.rotation is not Rotation.NONE:
            names.append(ROTATION_FILE)
        if manifest.binary_center:
            names.append(CENTER_FILE)
        if manifest.binary_spin:
            names.append(SPIN_FILE)
        return names

    @cached_property
    def _rotation64(self) -> np.ndarray | None:
        """The rotation in float64, made once: row_exact_product's cast of a [768, 768] matrix would cost more than
        the product of one query."""
        return None if self.rotation is None else self.rotation.astype(np.float64)

    @cached_property
    def _spin_columns(self) -> np.ndarray:
        """The spin's columns as float64 rows (contiguous, made once): the few coordinates `sure_signs` recomputes
        each read one row here, where a column of the matrix would touch a cache line per element."""
        assert self.spin is not None
        return np.ascontiguousarray(self.spin.T, dtype=np.float64)

    def rotate(self, vectors: np.ndarray) -> np.ndarray:
        """Full-width vectors in the space's basis (the very array without a rotation)."""
        return rotate(vectors, self._rotation64)

    def project(self, vectors: np.ndarray, dim: int) -> np.ndarray:
        """Full-width unit vectors as an index of `dim` stores and searches them: rotated, then MRL-truncated
        (float32, C-contiguous)."""
        return np.ascontiguousarray(truncate(self.rotate(vectors), dim), dtype=np.float32)

    def truncated(self, chunks: Iterable[np.ndarray], dim: int) -> Iterator[np.ndarray]:
        """`project` over row-ordered chunks (a streamed build's passes)."""
        for chunk in chunks:
            yield self.project(chunk, dim)

    @cached_property
    def _spin_margin(self) -> float:
        """Per unit of ‖x − center‖, how far a float32 product's coordinate can be from the float64 product's
        (`sure_signs`): n·u₃₂ + n·u₆₄ (the rounding bound of an n-term dot product in any summation order) times
        the largest column norm (Cauchy–Schwarz), with room to spare."""
        assert self.spin is not None
        n = self.spin.shape[0]
        gamma = n * 2.0**-24 / (1 - n * 2.0**-24) + n * 2.0**-53 / (1 - n * 2.0**-53)
        return 1.01 * gamma * float(np.sqrt((self._spin_columns ** 2).sum(axis=1)).max())

    def sign_codes(self, x: np.ndarray) -> np.ndarray:
        """Binary codes of truncated vectors in this space: centered and spun as the version's are, the same
        bits as `sign_codes` (models.bundle.vectors.space) computes in float64, from a float32 product
        (`sure_signs`)."""
        y = x if self.center is None else x - self.center
        return binary_encode(y if self.spin is None else self.sure_signs(np.asarray(y, dtype=np.float32)))

    def sure_signs(self, y: np.ndarray) -> np.ndarray:
        """`row_exact_product(y, spin)` wherever its sign could matter, from half the bytes: a query's sign codes
        were a float64 product with the spin (a [768, 768] float64 matrix read per query, twice the float32
        one's memory traffic, ~0.13 ms of 0.24 on one Xeon core). The float32 product's coordinates are used
        where they are farther from zero than its rounding bound (`_spin_margin` × the row's norm), which makes
        their sign the float64 product's; the few inside it (about one a query at 768 dims) are recomputed in
        float64, each as its own dot product. Only a coordinate within float64 rounding of zero could then sign
        differently, as it already could between BLAS kernels (row_exact_product)."""
        assert self.spin is not None
        if y.ndim == 1:  # one vector, as row_exact_product takes it too
            return self.sure_signs(y[None, :])[0]
        fast = np.asarray(y @ self.spin, dtype=np.float32)
        margin = np.sqrt(np.einsum("ij,ij->i", y, y, dtype=np.float64)) * self._spin_margin + 1e-30
        rows, cols = np.nonzero(np.abs(fast) <= margin[:, None])
        if len(rows):
            exact = np.einsum("ij,ij->i", y[rows].astype(np.float64), self._spin_columns[cols])
            fast[rows, cols] = exact.astype(np.float32)
        return fast
