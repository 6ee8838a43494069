"""student.json: what an exported student is: the teacher it was aligned to, its ONNX graphs and their parity."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from models.contract import TeacherRef
from models.manifest_io import utc_now

STUDENT_FORMAT = 1
STUDENT_MANIFEST = "student.json"


class ParityReport(BaseModel):
    texts: int
    fp32_mean_cosine: float
    int8_mean_cosine: float
    int8_min_cosine: float
    int8_fp32_nodes: list[str] = Field(default_factory=list, description="MatMuls left fp32 to hold int8 parity")


class Refreshed(BaseModel):
    """One `tandem distill --from` run: the version whose new segments the student was trained on, beside a replay."""

    student: str = Field(description="the student it continued from, resolved")
    bundle: str = Field(description="the bundle version directory, resolved")
    bundle_version: str
    segments: list[str] = Field(description="the segments whose live documents were the new text")
    documents: int = Field(description="live documents in those segments")
    train_texts: int = Field(description="training texts drawn from them: passages and pseudo-queries")
    replayed_texts: int = Field(description="training texts replayed from the corpus the student was distilled on")


class TrainedOn(BaseModel):
    """What a student was distilled from, so an operator can tell whether the corpus it serves is the one it knows."""

    corpus: str = Field(description="the corpus file, resolved")
    corpus_sha256: str
    documents: int = Field(description="documents in that corpus")
    train_texts: int = Field(description="training texts: passages and queries (the first member's, in a soup)")
    train_queries: int = Field(description="of those, queries: pseudo-queries plus --train-queries")
    real_queries: int = Field(description="of those, real queries read from --train-queries")
    bundle: str = Field(description="the bundle version directory its targets came from, resolved")
    bundle_version: str = Field(description="that version's name: its manifest's `version`, else its directory's")
    segments: list[str] = Field(default_factory=list, description="that version's segments (empty in students "
                                "recorded before): what `distill --from` counts as seen once the version is pruned")
    teacher_precision: str | None = Field(default=None, description="what the teacher computed this run's targets "
                                          "in (fp32, bf16, fp16): the pseudo-queries, and passages the bundle did "
                                          "not hold; null in students recorded before (fp32 on CPU)")
    refreshes: list[Refreshed] = Field(default_factory=list, description="`tandem distill --from` runs since, oldest "
                                       "first; `bundle` and `bundle_version` then name the last one's version")


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
    architecture: Literal["transformer", "static"] = Field(
        default="transformer", description="transformer: ONNX graphs; static: a token table, mean-pooled "
        "(models/encoders/static_table.py); older students are transformers")
    table: str | None = Field(default=None, description="static: the folded token table, float32 [vocab, dim] .npy")
    onnx_fp32: str = "model.onnx"
    onnx_int8: str = "model.int8.onnx"
    tokenizer: str = "tokenizer.json"
    created: str = Field(default_factory=utc_now)
    parity: ParityReport | None = None
    training: dict[str, object] = Field(default_factory=dict)
    trained_on: TrainedOn | None = Field(default=None, description="null in students distilled before it was "
                                         "recorded")

    def model_file(self, precision: str) -> str:
        """The file a student of this precision serves from: its ONNX graph, or a static student's one table (its
        vectors are fp32 either way; the bundle quantizes them as it quantizes any query vector)."""
        if self.architecture == "static":
            assert self.table is not None, "a static student's manifest names its table"
            return self.table
        return self.onnx_int8 if precision == "int8" else self.onnx_fp32
