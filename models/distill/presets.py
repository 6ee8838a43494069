"""Training presets: how much text and how many steps, sized for a 2-core CPU.

On CPU the cost is dominated by documents (256 tokens) in training and by the teacher
encoding pseudo-queries, so presets cap pseudo-queries per document and the number of
document passages per epoch; queries are short and cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.errors import InputError


class Preset(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    student: Literal["backbone", "teacher-layers", "static"] = Field(
        default="backbone",
        description="backbone: the small pretrained encoder + Linear (LEAF); teacher-layers: the teacher's "
        "embeddings and its first and last `teacher_layers` layers (Wang & Lyu); static: a table of token "
        "vectors with per-token weights, mean-pooled, no attention (models/distill/static.py)",
    )
    static_init: Literal["vocabulary", "embeddings"] = Field(
        default="vocabulary",
        description="with student=static: the table starts as the teacher's output for each vocabulary token "
        "alone (Model2Vec's distill, no PCA) or as the teacher's input token embeddings",
    )
    static_weights: Literal["sif", "uniform"] = Field(
        default="sif",
        description="with student=static: per-token weights start as a/(a + p), p the token's frequency in the "
        "training text (smooth inverse frequency), or all 1",
    )
    teacher_layers: int = Field(default=2, ge=1, description="with student=teacher-layers: k first and k last layers")
    backbone_layers: int | list[int] | None = Field(
        default=None,
        description="with student=backbone: keep only this many of the backbone's layers, evenly spaced from its "
        "first to its last, or the layers listed (0-based, ascending); None: all. Fewer layers, fewer "
        "multiply-adds per query",
    )
    queries_per_doc: int = Field(default=3, ge=1, description="pseudo-queries per document (title included)")
    max_queries: int | None = Field(
        default=None, ge=1, description="cap on training pseudo-queries: bounds the teacher's encoding time"
    )
    passages_per_epoch: int | None = Field(
        default=1000, ge=0, description="document passages mixed into each epoch (None: all training documents)"
    )
    augment: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="share of training pseudo-queries that also get a cropped and a masked variant",
    )
    real_query_repeats: int = Field(
        default=1, ge=1,
        description="times each real (train-split) training query appears per epoch: they are few among "
        "pseudo-queries, and the served queries are like them",
    )
    val_docs: int = Field(default=200, ge=1, description="documents held out, with their pseudo-queries")
    epochs: int = Field(default=3, ge=1)
    members: int = Field(
        default=1, ge=1,
        description="students trained from the backbone, each on its own draw of pseudo-queries, whose weights "
        "are averaged into the published one (a uniform model soup); each member trains `epochs` epochs",
    )
    max_steps: int | None = Field(default=None, ge=1, description="stop after this many optimizer steps")
    batch_size: int = Field(default=32, ge=1)
    lr: float = 1e-4
    lr_end: float = 1e-5
    lr_cycles: int = Field(default=1, ge=1, description="linear decay restarted this many times (LEAF)")
    weight_decay: float = 0.01
    loss: Literal["l2", "cosine"] = Field(
        default="l2", description="alignment loss: ‖s − t‖₂ (LEAF) or 1 − cos(s, t)"
    )
    patience: int | None = Field(
        default=None, ge=1, description="stop after this many epochs without a better validation overlap@10"
    )
    max_seq_length: int = Field(default=256, ge=8, description="student truncation while training")
    int8_epochs: int = Field(
        default=0, ge=0, description="last epochs trained through the int8 graph's rounding (int8_emulation.py)"
    )
    score_weight: float = Field(
        default=0.0, ge=0.0, description="weight of score distillation over the corpus, added to L2 (0: off)"
    )
    score_temperature: float = Field(default=0.05, gt=0.0, description="softmax temperature on cosine scores")
    score_candidates: int = Field(
        default=16384, ge=1, description="corpus rows scored per step; larger corpora are sampled"
    )
    ridge_texts: int = Field(default=6000, ge=1, description="training texts used to fit the initial projection")

    def layer_indices(self, total: int) -> list[int]:
        """The first and last `teacher_layers` of a `total`-layer teacher (all of them if they overlap)."""
        k = self.teacher_layers
        return sorted(set(range(min(k, total))) | set(range(max(total - k, 0), total)))

    @model_validator(mode="after")
    def _layers_of_its_family(self) -> Preset:
        layers = self.backbone_layers
        if self.student == "static" and self.int8_epochs:
            raise ValueError("a static student has no int8 graph to train through: int8_epochs must be 0")
        if layers is not None and self.student != "backbone":
            raise ValueError("backbone_layers cuts a backbone student; a teacher-layers student takes teacher_layers")
        if isinstance(layers, int) and layers < 1:
            raise ValueError(f"backbone_layers must keep at least one layer, not {layers}")
        if isinstance(layers, list) and (not layers or min(layers) < 0 or layers != sorted(set(layers))):
            raise ValueError(f"backbone_layers as a list names layers 0-based, ascending, each once: not {layers}")
        return self

    def backbone_layer_indices(self, total: int) -> list[int] | None:
        """`backbone_layers` of a `total`-layer backbone, evenly spaced with its first and last kept (None: all).

        The last layer stays because the backbone's pooling was trained on its output, the first because it is
        the one that reads the embeddings (DistilBERT-style spacing, as in docs/lab/2026-11-26-shallow-student.md).
        A list is taken as it is, so that layers chosen by validation (docs/lab/2026-11-27-student-layers.md)
        can be trained; one past the backbone's depth is an InputError.
        """
        k = self.backbone_layers
        if isinstance(k, list):
            if k[-1] >= total:
                raise InputError(f"preset {self.name}: backbone_layers {k} names a layer past the backbone's {total}")
            return None if k == list(range(total)) else list(k)
        if k is None or k >= total:
            return None
        if k == 1:
            return [total - 1]
        return sorted({int(i * (total - 1) / (k - 1) + 0.5) for i in range(k)})

    def epoch_passages(self, available: int) -> int:
        """How many of `available` training passages one epoch mixes in."""
        return available if self.passages_per_epoch is None else min(self.passages_per_epoch, available)


# quick, default and full trade training time for agreement with the teacher; full is sized for an hour
# on the 2-core CPU from a cold cache. Why each field is what it is (400 passages an epoch, batches of 16,
# repeated real queries, int8 last epochs, one member, score distillation on), with the runs that chose
# it: docs/decisions.md#distillation.
PRESETS: dict[str, Preset] = {
    "quick": Preset(name="quick", queries_per_doc=2, max_queries=5000, passages_per_epoch=300, val_docs=100,
                    epochs=1, ridge_texts=4000, score_weight=1.0),
    "default": Preset(name="default", queries_per_doc=3, max_queries=12000, passages_per_epoch=800, val_docs=200,
                      epochs=3, score_weight=1.0),
    "full": Preset(name="full", queries_per_doc=3, max_queries=12000, passages_per_epoch=400, val_docs=200,
                   epochs=8, lr_cycles=2, patience=3, score_weight=1.0, int8_epochs=2, batch_size=16,
                   real_query_repeats=4),
    # no attention: a step costs a gather and a dense update of the whole table (24M floats for a 30k vocabulary), so
    # the epoch's size is what costs; the teacher's pseudo-query targets are what the run costs besides (2.5k texts
    # with SciFact's train queries). lr 1e-3 for 8 epochs against 2e-4 for 3, by the distillation's own validation
    # overlap@10 on SciFact: 0.5534 against 0.4911 (docs/lab/2026-11-27-static-student.md). No weight decay: it
    # would shrink the rows of tokens the training text never holds. Validation keeps the ridge init (epoch 0) if
    # training does not beat it.
    "static": Preset(name="static", student="static", queries_per_doc=2, max_queries=1500, passages_per_epoch=1000,
                     val_docs=100, epochs=8, lr=1e-3, lr_end=1e-4, weight_decay=0.0, patience=2, score_weight=1.0),
}


def resolve_preset(preset: str | Preset) -> Preset:
    """A Preset, a built-in preset's name, or the path of a JSON file holding a preset's fields."""
    if isinstance(preset, Preset):
        return preset
    if preset in PRESETS:
        return PRESETS[preset]
    path = Path(preset)
    if path.suffix == ".json":
        try:
            return Preset.model_validate_json(path.read_text())
        except OSError as exc:
            raise InputError(f"{path}: cannot read the preset: {exc}") from exc
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'preset'}: {e['msg']}" for e in exc.errors())
            raise InputError(f"{path}: invalid preset: {problems}") from exc
    raise InputError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}, or a JSON file")
