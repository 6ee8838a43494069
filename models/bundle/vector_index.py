"""FAISS indexes for each quantization and index type: built, saved and loaded here, searched by
models.search.query.

- float: IndexFlatIP over MRL-truncated unit vectors.
- int8: IndexScalarQuantizer(QT_8bit) whose per-dimension ranges are our calibration.
- binary: IndexBinaryFlat over sign bits, plus the int8 rescoring codes (memory-mapped when loaded).

Those are the flat (exact) first stages; models.bundle.first_stage also builds HNSW and IVF ones
(models.bundle.index_spec), with the same int8 calibration and the same binary rescoring.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import faiss
import numpy as np

from models.bundle.first_stage import (
    apply_search_params,
    build_first_stage,
    empty_first_stage,
    first_stage_codes,
    spin_matrix,
    train_step,
)
from models.bundle.index_spec import IndexSpec, Quantization
from models.bundle.quantize import Int8Calibration, int8_encode
from models.contract import truncate
from models.timing import StageObserver

INDEX_FILE = "index.faiss"
CALIBRATION_FILE = "calibration.npy"
RESCORE_FILE = "rescore.u8.npy"
CENTER_FILE = "center.npy"  # binary: the corpus mean subtracted before taking signs (documents and queries)
SPIN_FILE = "spin.npy"  # binary: the random orthogonal matrix applied after centering, before the signs
DEFAULT_OVERSAMPLE = 4


class VectorIndex:
    """Vectors of one bundle at one dim and quantization."""

    def __init__(
        self,
        quantization: Quantization,
        dim: int,
        index: faiss.Index | faiss.IndexBinary,
        calibration: Int8Calibration | None = None,
        rescore_codes: np.ndarray | None = None,
        spec: IndexSpec | None = None,
        center: np.ndarray | None = None,
        spin: np.ndarray | None = None,
    ) -> None:
        self.quantization = quantization
        self.center, self.spin = center, spin
        self.dim = dim
        self.spec = spec or IndexSpec()
        self.index = index
        self.calibration = calibration
        self.rescore_codes = rescore_codes
        self.observe: StageObserver | None = None  # told how long int8 rescoring took (models.search.query), when set
        # A plain attribute, not a property over index.ntotal: the index is complete when it gets here (built,
        # loaded or written whole) and never grows after, and a query reads it without a call into this file.
        self.count = int(index.ntotal)

    @classmethod
    def build(
        cls, vectors: np.ndarray, dim: int, quantization: Quantization, spec: IndexSpec | None = None,
        center: bool = False, spin: bool = False,
    ) -> VectorIndex:
        """Index full-dimension unit vectors after MRL truncation to `dim` (spec: resolved, default flat);
        binary codes are the signs of the vectors minus their mean (`center`), spun (`spin`:
        models.bundle.first_stage)."""
        spec = spec or IndexSpec()
        x = np.ascontiguousarray(truncate(vectors, dim), dtype=np.float32)
        cal = None if quantization is Quantization.FLOAT else Int8Calibration.fit(x)
        mean = x.mean(axis=0, dtype=np.float64).astype(np.float32) if center else None
        mean = mean if quantization is Quantization.BINARY else None
        turn = spin_matrix(dim) if spin and quantization is Quantization.BINARY else None
        index = build_first_stage(x, quantization, spec, cal, mean, turn)
        rescore = int8_encode(x, cal) if quantization is Quantization.BINARY and cal is not None else None
        return cls(quantization, dim, index, cal, rescore, spec, mean, turn)

    def save(self, directory: Path, space: bool = True) -> list[str]:
        """Write the index files into `directory`; returns their names. `space=False` leaves out the calibration,
        center and spin: a version's later segment shares its first segment's."""
        names = [INDEX_FILE]
        try:
            if isinstance(self.index, faiss.IndexBinary):
                faiss.write_index_binary(self.index, str(directory / INDEX_FILE))
            else:
                faiss.write_index(self.index, str(directory / INDEX_FILE))
        except RuntimeError as exc:  # FAISS reports a failed write (a full disk) as a RuntimeError
            raise OSError(errno.EIO, f"cannot write the index: {str(exc).strip().splitlines()[-1]}",
                          str(directory / INDEX_FILE)) from exc
        if self.calibration is not None and space:
            np.save(directory / CALIBRATION_FILE, self.calibration.to_array())
            names.append(CALIBRATION_FILE)
        if self.rescore_codes is not None:
            np.save(directory / RESCORE_FILE, self.rescore_codes)
            names.append(RESCORE_FILE)
        if self.center is not None and space:
            np.save(directory / CENTER_FILE, self.center)
            names.append(CENTER_FILE)
        if self.spin is not None and space:
            np.save(directory / SPIN_FILE, self.spin)
            names.append(SPIN_FILE)
        return names

    @classmethod
    def load(
        cls, directory: Path, dim: int, quantization: Quantization, spec: IndexSpec | None = None,
        centered: bool = False, spun: bool = False, space: Path | None = None,
    ) -> VectorIndex:
        """Read the first stage into RAM and memory-map the rescoring codes (binary), so RAM holds only the former.

        `space` holds the calibration, center and spin when they are not `directory`'s own: a version's later
        segments share those of its first (models.bundle.version)."""
        spec = spec or IndexSpec()
        space = directory if space is None else space
        path = str(directory / INDEX_FILE)
        if quantization is Quantization.BINARY:
            index: faiss.Index | faiss.IndexBinary = faiss.read_index_binary(path)
            rescore = np.load(directory / RESCORE_FILE, mmap_mode="r")
        else:
            index, rescore = faiss.read_index(path), None
        cal = None
        if quantization is not Quantization.FLOAT:
            cal = Int8Calibration.from_array(np.load(space / CALIBRATION_FILE))
        apply_search_params(index, spec)
        if index.d != dim or (cal is not None and cal.dim != dim):
            raise ValueError(f"{directory}: index dimension {index.d} does not match the manifest's {dim}")
        if rescore is not None and rescore.shape != (index.ntotal, dim):
            raise ValueError(f"{directory}: rescore vectors have shape {rescore.shape}, expected {(index.ntotal, dim)}")
        center = None
        if centered:
            center = np.asarray(np.load(space / CENTER_FILE), dtype=np.float32)
            if center.shape != (dim,):
                raise ValueError(f"{directory}: {CENTER_FILE} has shape {center.shape}, expected {(dim,)}")
        spin = None
        if spun:
            spin = np.asarray(np.load(space / SPIN_FILE), dtype=np.float32)
            if spin.shape != (dim, dim):
                raise ValueError(f"{directory}: {SPIN_FILE} has shape {spin.shape}, expected {(dim, dim)}")
        return cls(quantization, dim, index, cal, rescore, spec, center, spin)


def float_vectors(directory: Path, count: int, chunk: int) -> Iterator[np.ndarray]:
    """The `count` vectors a float index file holds, `chunk` rows at a time in row order (reconstructed
    from the file as written, so the read needs no manifest check: `tandem index export`'s fallback)."""
    index = faiss.read_index(str(directory / INDEX_FILE))
    for start in range(0, count, chunk):
        yield index.reconstruct_n(start, min(chunk, count - start))


class IndexWriter:
    """Fills a bundle's first stage and its rescoring codes chunk by chunk, for builds that never hold the corpus.

    Only the first stage stays in RAM (it is what the service loads); rescoring codes go straight
    to `rescore.u8.npy`, whose header is written up front for the known row count, byte for byte
    what `np.save` writes. The files equal `VectorIndex.build(...).save()` on the same vectors.
    """

    def __init__(
        self, directory: Path, count: int, dim: int, quantization: Quantization, spec: IndexSpec,
        calibration: Int8Calibration | None, center: np.ndarray | None = None, spin: np.ndarray | None = None,
    ) -> None:
        self.directory, self.count, self.dim = Path(directory), count, dim
        self.center, self.spin = center, spin
        self.quantization, self.spec, self.calibration = quantization, spec, calibration
        self.index = empty_first_stage(dim, quantization, spec, calibration)
        self.added = 0
        self._rescore: BinaryIO | None = None
        if quantization is Quantization.BINARY:
            self._rescore = (self.directory / RESCORE_FILE).open("wb")
            header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)), "fortran_order": False,
                      "shape": (count, dim)}
            np.lib.format.write_array_header_1_0(self._rescore, header)

    @property
    def train_step(self) -> int | None:
        """Rows [::step] train the index (IVF); None when it needs no training."""
        return None if self.index.is_trained else train_step(self.count, self.spec)

    def train(self, chunks: Iterable[np.ndarray]) -> None:
        """Train on rows [::train_step] of the row-ordered chunks, holding only their codes (IVF: sign bits)."""
        step = self.train_step
        if step is None:
            return
        sample, seen = [], 0
        for x in chunks:
            first = (-seen) % step  # the first row of this chunk whose global index is a multiple of step
            sample.append(first_stage_codes(x[first::step], self.quantization, self.center, self.spin))
            seen += len(x)
        self.index.train(np.ascontiguousarray(np.concatenate(sample)))

    def add(self, x: np.ndarray) -> None:
        """Append MRL-truncated unit vectors (float32 [n, dim]) in row order."""
        self.index.add(first_stage_codes(x, self.quantization, self.center, self.spin))
        if self._rescore is not None:
            assert self.calibration is not None
            self._rescore.write(int8_encode(x, self.calibration).tobytes())
        self.added += len(x)

    def finish(self) -> list[str]:
        """Write the index; returns every file name written. Its calibration, center and spin are its version's
        space, which the indexer writes once for all of the version's segments (indexer.writer.Space)."""
        if self.added != self.count:
            raise ValueError(f"index writer got {self.added} vectors, expected {self.count}")
        if self._rescore is not None:
            self._rescore.close()
        apply_search_params(self.index, self.spec)
        names = VectorIndex(self.quantization, self.dim, self.index, self.calibration, None, self.spec,
                            self.center, self.spin).save(self.directory, space=False)
        return names + ([RESCORE_FILE] if self._rescore is not None else [])

    def close(self) -> None:
        if self._rescore is not None and not self._rescore.closed:
            self._rescore.close()
