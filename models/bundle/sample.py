"""A segment's agreement sample: pseudo-queries of its documents, their teacher vectors and the teacher's top-10.

The indexer keeps one per segment it writes (indexer.sample), so the student serving a version can be asked, segment
by segment, whether it still ranks as the teacher does (models.agreement). Two files inside the segment, listed in
the manifest like every other file, so integrity verification covers them:

- `agreement.json`: the queries, each one's source document id, the teacher's top-10 ids over the version the
  sample was written in (a record: the check searches the version it is asked about again), and the teacher;
- `agreement.npy`: the teacher's query vectors (float16, full dimension, one row per query).

A segment without them (bundles written before samples, or with the sample turned off) has no sample: its agreement
is unknown, never an error.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.bundle.manifest import BundleManifest, SegmentInfo
from models.bundle.storage.integrity import load_checked_array, read_checked
from models.errors import ContractMismatch

SAMPLE_FORMAT = 1
SAMPLE_QUERIES = "agreement.json"
SAMPLE_VECTORS = "agreement.npy"
SAMPLE_FILES = (SAMPLE_QUERIES, SAMPLE_VECTORS)


class SampleRecord(BaseModel):
    """agreement.json."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = SAMPLE_FORMAT
    teacher_fingerprint: str
    version: str | None = Field(default=None, description="the version whose search gave `teacher_top`")
    queries: list[str]
    sources: list[str] = Field(description="each query's source document id")
    teacher_top: list[list[str]] = Field(description="the teacher's top-k ids over `version`, per query")

    @model_validator(mode="after")
    def _aligned(self) -> SampleRecord:
        if not (len(self.queries) == len(self.sources) == len(self.teacher_top)):
            raise ValueError(f"{len(self.queries)} queries, {len(self.sources)} sources and {len(self.teacher_top)} "
                             "top lists: one each per query")
        return self


class Sample(BaseModel):
    """A sample with its teacher vectors (float32 in memory, float16 on disk)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    record: SampleRecord
    vectors: np.ndarray

    def __len__(self) -> int:
        return len(self.record.queries)


def _prefix(segment: SegmentInfo) -> str:
    return "" if segment.path == "." else f"{segment.path}/"


def sample_names(segment: SegmentInfo) -> list[str]:
    """The sample's files as the version's manifest names them."""
    return [_prefix(segment) + name for name in SAMPLE_FILES]


def has_sample(manifest: BundleManifest, segment: SegmentInfo) -> bool:
    return all(name in manifest.files for name in sample_names(segment))


def write_sample(directory: Path, sample: Sample) -> list[str]:
    """The sample's files in a segment's `directory`; returns their names (within the segment)."""
    if sample.vectors.shape[0] != len(sample):
        raise ValueError(f"{sample.vectors.shape[0]} vectors for {len(sample)} queries")
    (directory / SAMPLE_QUERIES).write_text(sample.record.model_dump_json() + "\n", encoding="utf-8")
    with (directory / SAMPLE_VECTORS).open("wb") as fh:
        np.save(fh, sample.vectors.astype(np.float16), allow_pickle=False)
    return list(SAMPLE_FILES)


def read_sample(version: Path, manifest: BundleManifest, segment: SegmentInfo) -> Sample | None:
    """The segment's sample, checked against the manifest's sha256; None when it has none."""
    if not has_sample(manifest, segment):
        return None
    queries, vectors = sample_names(segment)
    try:
        record = SampleRecord.model_validate(json.load(io.BytesIO(read_checked(version, queries, manifest.files))))
        x = load_checked_array(version, vectors, manifest.files)
    except (ValidationError, ValueError, OSError) as exc:
        raise ContractMismatch(f"{version}: unreadable agreement sample of segment {segment.name}: {exc}") from exc
    if x.ndim != 2 or x.shape[0] != len(record.queries) or x.shape[1] != manifest.teacher.dim:
        raise ContractMismatch(f"{version / vectors}: expected {len(record.queries)} × {manifest.teacher.dim} teacher "
                               f"vectors, found {x.shape}")
    return Sample(record=record, vectors=x.astype(np.float32))
