"""The bundle's manifest: what a version promises, and where its files may be.

A bundle is the only contract between indexer and service; its manifest names the
teacher space, the dims and the quantization, and the sha256 of every file in it.
(A student's manifest is models.encoders.student_manifest.)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from models.bundle.lexical.info import LEXICAL_SUBDIRECTORY, LexicalInfo
from models.bundle.payload.fields import PAYLOAD_SUBDIRECTORY, PayloadField, PayloadInfo
from models.bundle.vectors.index_spec import IndexSpec, Quantization
from models.bundle.vectors.rotation import Rotation
from models.contract import TeacherRef
from models.manifest_io import utc_now
from models.paths import is_plain_name

BUNDLE_FORMAT = 1
BUNDLE_MANIFEST = "manifest.json"
BUNDLE_SUBDIRECTORIES = (LEXICAL_SUBDIRECTORY, PAYLOAD_SUBDIRECTORY)  # the only directories a segment may hold
SEGMENTS_DIRECTORY = "segments"  # a version's later segments: segments/NAME/, each laid out as a bundle is
TOMBSTONES_DIRECTORY = "tombstones"  # a version's deleted rows: tombstones/NAME.npy for segment NAME

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

    @field_validator("store_key")
    @classmethod
    def _plain_key(cls, key: str | None) -> str | None:
        if key is not None and not is_plain_name(key):  # a directory name in the embedding store
            raise ValueError(f"embedding-store key {key!r}: letters, digits, '.', '_' and '-' only")
        return key


class CorpusInfo(BaseModel):
    path: str = Field(description="the corpus file; a relative path is inside the bundle (updates)")
    sha256: str
    count: int
    metadata_extra: bool = Field(default=False, description="lines' keys outside id, title and text were kept as "
                                 "metadata (`--metadata-extra`); `tandem index update` reads change lines the same "
                                 "way, so an update never drops those keys. False in older bundles")
    segments: int | None = Field(default=None, ge=2, description="the build wrote the corpus as this many segments "
                                 "(`--segment-rows`): the first, then NAME-1, NAME-2, …; absent: the first alone")


class BaseInfo(BaseModel):
    """The bundle an update (or a compaction, or a follow step) started from, and what it changed."""

    action: Literal["update", "compact", "follow"] = "update"
    version: str
    build_time: str
    count: int
    added: int = 0
    replaced: int = 0
    deleted: int = 0
    encoded: int = Field(0, description="documents the teacher encoded for this update (new or changed text)")


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


class FollowState(BaseModel):
    """What `tandem index follow` has applied, recorded in the version it published: files apply in name order,
    so every file whose name sorts at or before `last` is in this version, and no other."""

    last: str = Field(description="the name of the last change file applied")
    files: int = Field(description="change files applied since the root was first followed")


class SegmentInfo(BaseModel):
    """One immutable segment of a version: its files live at `path` (\".\" for the first, the version's own
    top level; `segments/NAME` for later ones), its deleted rows in `tombstones` (a file of the version)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="unique within a bundle root's history; a later version that shares the segment "
                      "names it alike")
    path: str = "."
    count: int = Field(description="rows in the segment, deleted ones included")
    deleted: int = Field(default=0, description="rows of the segment deleted as of this version")
    tombstones: str | None = Field(default=None, description="tombstones/NAME.npy: the deleted rows, ascending (int64)")
    index: IndexSpec = Field(default_factory=IndexSpec)
    lexical: LexicalInfo | None = None
    payload: PayloadInfo | None = Field(default=None, description="the segment's payload index (payload/): the "
                                        "version's fields, and any its documents brought; absent in a first "
                                        "segment, whose payload index is the manifest's `payload`")
    embeddings: EmbeddingSource | None = Field(default=None, description="where the segment's vectors came from (its "
                                                "embedding-store key)")
    build_time: str = Field(default_factory=utc_now)
    changes: list[str] = Field(default_factory=list, description="the change files folded into this segment "
                               "(`tandem index follow`)")

    # Each is joined to the version's directory: checked like version names, so `../x` never reaches a path.
    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not is_plain_name(name):
            raise ValueError(f"segment name {name!r}: use letters, digits, '.', '_' and '-' (as version names)")
        return name

    @field_validator("path")
    @classmethod
    def _own_path(cls, path: str) -> str:
        parts = path.split("/")
        if path != "." and not (len(parts) == 2 and parts[0] == SEGMENTS_DIRECTORY and is_plain_name(parts[1])):
            raise ValueError(f"segment path {path!r}: '.' or {SEGMENTS_DIRECTORY}/NAME, NAME a plain name")
        return path

    @field_validator("tombstones")
    @classmethod
    def _tombstones_file(cls, name: str | None) -> str | None:
        parts = (name or "").split("/")
        if name is not None and not (len(parts) == 2 and parts[0] == TOMBSTONES_DIRECTORY
                                     and parts[1].endswith(".npy") and is_plain_name(parts[1])):
            raise ValueError(f"tombstones {name!r}: {TOMBSTONES_DIRECTORY}/NAME.npy, NAME a plain name")
        return name

    @property
    def live(self) -> int:
        return self.count - self.deleted


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
    payload: PayloadInfo | None = Field(None, description="the typed fields of the payload index (payload/ of each "
                                        "segment); absent in older bundles, which filter through the docstore")
    segments: list[SegmentInfo] | None = Field(None, description="the version's segments, oldest first; absent: "
                                               "one segment, the bundle's own top level, nothing deleted")
    follow: FollowState | None = Field(default=None, description="`tandem index follow`: the change files "
                                       "this version holds")

    @field_validator("files")
    @classmethod
    def _plain_names(cls, files: dict[str, str]) -> dict[str, str]:
        # Names are joined to the bundle directory: `../x` or `/x` would make a reload hash any file on the host.
        for name in files:
            if not _known_place(name.split("/")):
                raise ValueError("every name must be a plain file name in the bundle directory, its "
                                 f"{'/, '.join(BUNDLE_SUBDIRECTORIES)}/ or {TOMBSTONES_DIRECTORY}/, or the same in a "
                                 f"{SEGMENTS_DIRECTORY}/NAME/ (no other '/', no '\\' or '..')")
        return files

    @property
    def parts(self) -> list[SegmentInfo]:
        """The segments, the first standing for the whole bundle when the manifest lists none (older bundles and
        fresh builds)."""
        if self.segments is not None:
            return self.segments
        return [SegmentInfo(name=self.version or "base", count=self.count, index=self.index, lexical=self.lexical,
                            payload=self.payload, embeddings=self.embeddings, build_time=self.build_time)]

    @property
    def payload_fields(self) -> list[PayloadField]:
        """The payload fields with their types (none without a payload index): what a change to the version must
        keep, and what its compaction keeps."""
        return self.payload.fields if self.payload is not None else []

    @property
    def deleted(self) -> int:
        """The version's deleted rows, over all its segments."""
        return sum(s.deleted for s in self.parts)

    def segment_files(self, segment: SegmentInfo) -> dict[str, str]:
        """The files of one segment (names relative to the version), with their sha256."""
        if segment.path == ".":
            return {n: h for n, h in self.files.items()
                    if n.count("/") == 0 or n.split("/", 1)[0] in BUNDLE_SUBDIRECTORIES}
        prefix = f"{segment.path}/"
        return {n: h for n, h in self.files.items() if n.startswith(prefix)}

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


def _safe(part: str) -> bool:
    return bool(part) and part not in {".", ".."} and not part.startswith("..") and not any(c in part for c in "\\\0")


def _known_place(parts: list[str]) -> bool:
    """NAME, lexical/NAME, payload/NAME, tombstones/NAME, or segments/SEG/ followed by NAME, lexical/NAME or
    payload/NAME."""
    if not all(_safe(p) for p in parts):
        return False
    if len(parts) >= 3 and parts[0] == SEGMENTS_DIRECTORY:
        parts = parts[2:]
    elif len(parts) == 2 and parts[0] == TOMBSTONES_DIRECTORY:
        return True
    return len(parts) == 1 or (len(parts) == 2 and parts[0] in BUNDLE_SUBDIRECTORIES)
