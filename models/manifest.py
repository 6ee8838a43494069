"""Manifests: the self-description of index bundles and students.

A bundle is the only contract between indexer and service; its manifest names the
teacher space, the dims and the quantization, and the sha256 of every file in it.
A student's manifest names the teacher it was aligned to.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from models.contract import TeacherRef
from models.errors import ContractMismatch
from models.fields import PayloadInfo
from models.index_spec import IndexSpec, Quantization
from models.rotation import Rotation

BUNDLE_FORMAT = 1
STUDENT_FORMAT = 1
BUNDLE_MANIFEST = "manifest.json"
LEXICAL_SUBDIRECTORY = "lexical"  # the BM25 index (models.search.lexical writes it)
PAYLOAD_SUBDIRECTORY = "payload"  # the payload index's columns (models.search.payload_writer writes them)
BUNDLE_SUBDIRECTORIES = (LEXICAL_SUBDIRECTORY, PAYLOAD_SUBDIRECTORY)  # the only directories a bundle may hold
STUDENT_MANIFEST = "student.json"

M = TypeVar("M", bound=BaseModel)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class TeacherPrecision(StrEnum):
    """What may compute teacher vectors: fp32 (the reference), bf16 (CPU or GPU), fp16 (CUDA).

    Here, not in models.teacher, so that checking a flag does not import torch.
    """

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


TEACHER_PRECISIONS = tuple(p.value for p in TeacherPrecision)

# The student graphs a StudentManifest lists: int8 serves by default, fp32 is the reference.
StudentPrecision = Literal["int8", "fp32"]


class EmbeddingSource(BaseModel):
    """Where the document vectors came from: encoded here, or imported from a file."""

    kind: Literal["encoded", "imported"]
    path: str | None = None
    sha256: str | None = None
    store_key: str | None = None
    precision: str | None = Field(default=None, description="what computed the vectors: fp32 (the reference), "
                                  "bf16 or fp16; absent in older bundles and for imports")
    device: str | None = Field(default=None, description="the torch device type the teacher ran on")
    engine: str | None = Field(default=None, description="local or ray")


class CorpusInfo(BaseModel):
    path: str = Field(description="the corpus file; a relative path is inside the bundle (updates)")
    sha256: str
    count: int
    metadata_extra: bool = Field(default=False, description="lines' keys outside id, title and text were kept as "
                                 "metadata (`--metadata-extra`); `tandem index update` reads change lines the same "
                                 "way, so an update never drops those keys. False in older bundles")


class BaseInfo(BaseModel):
    """The bundle an update started from, and what it changed."""

    version: str
    build_time: str
    count: int
    added: int = 0
    replaced: int = 0
    deleted: int = 0
    encoded: int = Field(0, description="documents the teacher encoded for this update (new or changed text)")


class LexicalInfo(BaseModel):
    """The BM25 index over the passages the teacher saw (files under lexical/, listed in `files`)."""

    engine: Literal["bm25s"] = "bm25s"
    method: str = "lucene"
    k1: float = 1.5
    b: float = 0.75
    stemmer: str = Field(default="english", description="PyStemmer algorithm; queries are stemmed alike")
    stopwords: str = "en"
    vocab: int = 0


class FusionMethod(StrEnum):
    RRF = "rrf"
    CONVEX = "convex"


class FusionSpec(BaseModel):
    """How `mode: hybrid` fuses the dense and lexical candidate lists, unless a request says otherwise.

    Recorded in the bundle so that `tandem eval` and the service fuse alike.
    """

    method: FusionMethod = FusionMethod.CONVEX
    alpha: float = Field(default=0.5, ge=0.0, le=1.0,
                         description="convex: weight of the dense (min-max normalized) score")
    rrf_k: int = Field(default=60, ge=1, description="rrf: the constant k in 1 / (k + rank)")
    depth: int = Field(default=100, ge=1, description="candidates taken from each side before fusing")


class BundleManifest(BaseModel):
    """manifest.json of an index bundle: the only contract between the indexer and the service.

    It records the teacher's fingerprint, dims, quantization, rotation and index type, and every file with its
    sha256, so a loader can refuse a bundle it cannot serve before opening anything heavy.
    """

    model_config = ConfigDict(extra="forbid")

    format_version: int = BUNDLE_FORMAT
    teacher: TeacherRef
    dim: int
    quantization: Quantization
    count: int
    build_time: str = Field(default_factory=utc_now)
    build_seconds: float = 0.0
    corpus: CorpusInfo
    embeddings: EmbeddingSource
    files: dict[str, str] = Field(default_factory=dict, description="file name → sha256")
    version: str | None = Field(None, description="the version name when published into a bundle root")
    rotation: Rotation = Field(Rotation.NONE, description="pca: vectors rotated onto the corpus's principal axes "
                               "before truncation; queries must be rotated alike (rotation.npy)")
    base: BaseInfo | None = Field(None, description="set by `tandem index update`: the version it started from")
    index: IndexSpec = Field(default_factory=IndexSpec, description="index type and its parameters (default: flat)")
    binary_center: bool = Field(False, description="binary: codes are the signs of the vectors minus the corpus "
                                "mean (center.npy), queries alike; absent in older bundles: plain signs")
    binary_spin: bool = Field(False, description="binary: after centering, a random orthogonal rotation (spin.npy) "
                              "before the signs, queries alike; absent in older bundles")
    lexical: LexicalInfo | None = Field(None, description="BM25 index (absent in older bundles: dense only)")
    fusion: FusionSpec | None = Field(None, description="the default fusion of `mode: hybrid`")
    metadata_fields: list[str] = Field(default_factory=list, description="metadata keys present in the docstore")
    payload: PayloadInfo | None = Field(None, description="the typed fields of the payload index (payload/); absent "
                                        "in older bundles, which filter through the docstore")

    @field_validator("files")
    @classmethod
    def _plain_names(cls, files: dict[str, str]) -> dict[str, str]:
        # Names are joined to the bundle directory: `../x` or `/x` would make a reload hash any file on the host.
        # Two subdirectories are known, the lexical index's (`lexical/NAME`) and the payload index's
        # (`payload/NAME`); nothing else has a '/'.
        for name in files:
            parts = name.split("/")
            nested = len(parts) == 2 and parts[0] in BUNDLE_SUBDIRECTORIES
            if (len(parts) > 1 and not nested) or any(
                    not p or p in {".", ".."} or p.startswith("..") or any(c in p for c in "\\\0") for p in parts):
                raise ValueError("every name must be a plain file name in the bundle directory, or in its "
                                 f"{'/ or '.join(BUNDLE_SUBDIRECTORIES)}/ (no other '/', no '\\' or '..')")
        return files

    def summary(self) -> dict[str, object]:
        """What the service reports about the index it answers from."""
        return {
            "teacher": self.teacher.name,
            "teacher_fingerprint": self.teacher.fingerprint,
            "dim": self.dim,
            "quantization": self.quantization.value,
            "rotation": self.rotation.value,
            "index": self.index.type.value,
            "count": self.count,
            "build_time": self.build_time,
            "modes": ["dense", "lexical", "hybrid"] if self.lexical is not None else ["dense"],
        }


class ParityReport(BaseModel):
    texts: int
    fp32_mean_cosine: float
    int8_mean_cosine: float
    int8_min_cosine: float
    int8_fp32_nodes: list[str] = Field(default_factory=list, description="MatMuls left fp32 to hold int8 parity")


class StudentManifest(BaseModel):
    """student.json of an exported student: the teacher it was aligned to, its ONNX graphs and their parity."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = STUDENT_FORMAT
    teacher: TeacherRef
    backbone: str
    backbone_fingerprint: str
    backbone_pooling: str = Field(default="mean", description="how the graph pools the backbone's token states; older "
                                  "students (before other poolings) are mean-pooled")
    max_seq_length: int
    onnx_fp32: str = "model.onnx"
    onnx_int8: str = "model.int8.onnx"
    tokenizer: str = "tokenizer.json"
    created: str = Field(default_factory=utc_now)
    parity: ParityReport | None = None
    training: dict[str, object] = Field(default_factory=dict)


def read_manifest(path: Path, model: type[M], what: str) -> M:
    """Parse a manifest, turning every failure into one readable error naming the file."""
    if not path.is_file():
        raise ContractMismatch(f"{path.parent} is not a {what}: {path.name} is missing")
    try:
        parsed = model.model_validate_json(path.read_text())
    except ValidationError as exc:  # field and message only: no input echoed, no URL
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'manifest'}: {e['msg']}"
                             for e in exc.errors(include_url=False, include_input=False)[:5])
        raise ContractMismatch(f"{path}: invalid {what} manifest: {problems}") from exc
    except ValueError as exc:
        raise ContractMismatch(f"{path}: invalid {what} manifest: {exc}") from exc
    version = getattr(parsed, "format_version", None)
    expected = BUNDLE_FORMAT if model is BundleManifest else STUDENT_FORMAT
    if version != expected:
        raise ContractMismatch(f"{path}: {what} format {version} is not supported (expected {expected})")
    return parsed
