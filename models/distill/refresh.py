"""`tandem distill --from DIR`: a served student trained on, briefly, where its index grew past what it knows.

The new text is the live documents of the segments named, else of the segments it has not seen (those of the index's
version that the version it was trained on does not list, student.json `trained_on.segments`) on which its agreement
with the teacher is below the threshold (pick.py; a segment without an agreement sample is taken, as before samples).
Training continues from the student's own weights (read back from its fp32 graph, onnx_weights.py) on pseudo-queries
and passages of those documents, mixed with a replay of its old training text: the very split `tandem distill` drew
from its corpus (the same preset and seed, so the same pseudo-queries, whose teacher vectors are cached), sampled to
`replay` times the new text. Validation holds out documents of both, so the epoch kept is the one that serves the
union best; one that does worse than the student it started from is not kept (trainer.train keeps the best of the
two).

The run is bounded: one epoch of the student's own recipe (its preset's sizes, batch and learning rate), which
costs a fraction of a distillation from scratch: no ridge fit, and most teacher targets are cached.

Not replayed: the segments of earlier refreshes (a second refresh replays the first corpus only), and the
`--train-queries` a distillation was given (student.json records their count, not their file).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from models.bundle.manifest import BundleManifest
from models.bundle.staging import check_target
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore
from models.bundle.version import in_segment, read_bundle_manifest, tombstone_masks
from models.bundle.versions import resolve_bundle
from models.corpus import Document, read_corpus
from models.datasets.teacher_targets import TeacherTargets
from models.distill.exporting.export import FP32_MIN_COSINE, export_student
from models.distill.exporting.onnx_weights import load_onnx_weights
from models.distill.model import StudentModel, depth
from models.distill.pick import pick_segments
from models.distill.presets import Preset, resolve_preset
from models.distill.texts.data import Split, TrainingData, build_training_data
from models.distill.texts.dataset import Examples
from models.distill.texts.tokens import Tokens, embed
from models.distill.training.trainer import train
from models.encoders.registry import ModelCard, load_card, resolve
from models.encoders.student import StudentEncoder, read_student_manifest
from models.encoders.student_manifest import Refreshed, StudentManifest, TrainedOn
from models.encoders.teacher import pick_device
from models.errors import ContractMismatch, InputError
from models.hashing import sha256_file
from models.manifest_io import utc_now

log = logging.getLogger(__name__)

REPLAY = 1.0  # old training texts per new one
CHECK_TEXTS = 16  # texts the rebuilt torch model must reproduce the fp32 graph on


class RefreshRequest(BaseModel):
    """What `tandem distill --from` was asked: the student, the index it serves, out, and what to train on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    student: Path = Field(description="the served student's directory")
    index: Path = Field(description="a bundle directory, or a bundle root (its CURRENT version)")
    out: Path
    segments: list[str] | None = Field(default=None, description="segments to train on (default: those the "
                                       "student's trained-on version lacks and it disagrees on, pick.py)")
    preset: str | Preset | None = Field(default=None, description="default: the student's own, one epoch")
    replay: float = Field(default=REPLAY, ge=0.0, description="old training texts sampled per new one")
    teacher: Path | None = None
    backbone: Path | None = None
    device: str | None = None
    seed: int = 0
    force: bool = False


def first_training(student: StudentManifest) -> dict[str, object]:
    """The training record of the distillation a (refreshed) student descends from: its corpus, preset and seed."""
    training = student.training
    while "refresh" in training and isinstance(training.get("previous"), dict):
        training = training["previous"]  # type: ignore[assignment]
    return training


def refresh_preset(student: StudentManifest) -> Preset:
    """The student's own preset, cut to one epoch of one member: the sizes and the learning rate it was trained with."""
    recorded = first_training(student).get("preset")
    base = Preset.model_validate(recorded) if isinstance(recorded, dict) else resolve_preset("quick")
    return base.model_copy(update={"name": f"refresh of {base.name}", "epochs": 1, "members": 1, "patience": None,
                                   "int8_epochs": min(base.int8_epochs, 1), "lr_cycles": 1})


def kept_layers(student: StudentManifest, backbone_dir: Path) -> list[int] | None:
    """The backbone layers a shallower student kept (its first distillation's preset), so its graph's weights fit."""
    recorded = first_training(student).get("preset")
    if not isinstance(recorded, dict):
        return None
    return Preset.model_validate(recorded).backbone_layer_indices(depth(backbone_dir))


def new_segments(version_dir: Path, bundle: BundleManifest, student: StudentManifest,
                 named: Sequence[str] | None) -> list[str]:
    """The segments to train on: those `named` (each must be in the version), else those the student's trained-on
    version does not list."""
    present = [s.name for s in bundle.parts]
    if named:
        unknown = [n for n in named if n not in present]
        if unknown:
            raise InputError(f"{version_dir}: no segment named {', '.join(unknown)} (it has {', '.join(present)})")
        return list(named)
    trained = student.trained_on
    if trained is None:
        raise InputError("the student records no trained_on (distilled before it was recorded): which segments it "
                         "has not seen cannot be told; name them with --segment")
    if trained.segments:
        seen = set(trained.segments)
    else:  # recorded before segments were: read them from that version, if it is still there
        candidates = [Path(trained.bundle), version_dir.parent / trained.bundle_version]
        seen_dir = next((d for d in candidates if (d / "manifest.json").is_file()), None)
        if seen_dir is None:
            raise InputError(f"the version the student was trained on ({trained.bundle}) is gone, so which segments "
                             "are new cannot be told: name them with --segment")
        seen = {s.name for s in read_bundle_manifest(seen_dir).parts}
    return [n for n in present if n not in seen]


def disagreeing(version_dir: Path, bundle: BundleManifest, student: Path, unseen: Sequence[str]) -> list[str]:
    """Of the `unseen` segments, those to train on when none is named: those below the agreement threshold
    (models.distill.pick), and those whose agreement is unknown (no sample: today's rule, every unseen segment)."""
    pick = pick_segments(version_dir, bundle, student, unseen)
    log.info("%s", pick.describe())
    if pick.unknown:
        log.info("training on %s: no agreement sample to judge by, so every unseen segment is taken",
                 ", ".join(pick.unknown))
    if pick.below:
        log.info("training on %s: below the agreement threshold", ", ".join(pick.below))
    if pick.agree:
        log.info("leaving out %s: the student agrees with the teacher there", ", ".join(pick.agree))
    names = set(pick.below) | set(pick.unknown)
    if not names:
        raise InputError(f"{version_dir}: the student agrees with the teacher on every segment it has not seen "
                         f"({', '.join(unseen)}): nothing to refresh on; name segments with --segment to train on "
                         "them anyway")
    return [n for n in unseen if n in names]


def segment_documents(version_dir: Path, bundle: BundleManifest, names: Sequence[str]) -> list[Document]:
    """The live documents of the named segments, segment by segment, in row order."""
    out: list[Document] = []
    wanted = set(names)
    for segment, deleted in zip(bundle.parts, tombstone_masks(version_dir, bundle), strict=True):
        if segment.name not in wanted:
            continue
        store = DocStore(version_dir / in_segment(segment, DOCSTORE_FILE))
        try:
            docs = store.range(0, segment.count)
        finally:
            store.close()
        out += [d for d, gone in zip(docs, deleted, strict=True) if not gone]
    return out


def _teacher(bundle: BundleManifest, student: StudentManifest, req: RefreshRequest) -> ModelCard:
    if student.teacher.fingerprint != bundle.teacher.fingerprint:
        raise ContractMismatch(f"{req.student} was aligned to teacher {student.teacher.name!r} but {req.index} was "
                               f"built with {bundle.teacher.name!r}: a student refreshes on its own teacher's index")
    card = load_card(resolve("teacher", req.teacher))
    if card.fingerprint != bundle.teacher.fingerprint:
        raise ContractMismatch(f"the teacher model at {card.path} ({card.name!r}) is not the one {req.index} was built "
                               f"with ({bundle.teacher.name!r}); pass --teacher with that model")
    return card


def _starting_model(req: RefreshRequest, student: StudentManifest, card: ModelCard) -> tuple[StudentModel, ModelCard]:
    """The student's torch model: the backbone's architecture with the student's fp32 graph's weights, checked
    against that graph's own vectors."""
    backbone = load_card(resolve("backbone", req.backbone))
    if backbone.fingerprint != student.backbone_fingerprint:
        raise ContractMismatch(f"{req.student} was trained from backbone {student.backbone!r} (fingerprint "
                               f"{student.backbone_fingerprint[:16]}…) but the backbone at {backbone.path} is "
                               f"{backbone.name!r} ({backbone.fingerprint[:16]}…); pass --backbone with that model")
    model = StudentModel(backbone.hf_dir, card.dim, name=student.backbone, pooling=student.backbone_pooling,  # type: ignore[arg-type]
                         backbone_layers=kept_layers(student, backbone.hf_dir))
    kept = load_onnx_weights(model, req.student / student.onnx_fp32)
    if kept:
        log.info("kept the backbone's %s (the graph does not use them)", ", ".join(kept))
    return model, backbone


def _check_rebuilt(model: StudentModel, tokens: Tokens, directory: Path, texts: Sequence[str]) -> float:
    """Mean cosine of the rebuilt torch model to the student's fp32 graph; raises below the export's own gate."""
    mine = embed(model, tokens, tokens.encode(texts), model.forward, torch.device("cpu"))
    graph = StudentEncoder(directory, precision="fp32", threads=2).encode(texts)
    cosine = float(np.mean(np.sum(mine * graph, axis=1)))
    if cosine < FP32_MIN_COSINE:
        raise ContractMismatch(f"{directory}: the weights read back from its fp32 graph do not reproduce it (mean "
                               f"cosine {cosine:.5f}, needs ≥ {FP32_MIN_COSINE})")
    return cosine


def _sample(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    return np.sort(rng.choice(n, size=min(k, n), replace=False))


def _replayed(old: TrainingData, new: TrainingData, replay: float, rng: np.random.Generator) -> TrainingData:
    """The old split's texts sampled to `replay` times the new training text (validation: as many as the new)."""
    q = _sample(len(old.train.queries), round(replay * len(new.train.queries)), rng)
    p = _sample(len(old.train.passages), round(replay * len(new.train.passages)), rng)
    vq = _sample(len(old.val.queries), len(new.val.queries), rng)
    vp = _sample(len(old.val.passages), len(new.val.passages), rng)
    return TrainingData(
        train=Split([old.train.passages[i] for i in p], [old.train.queries[i] for i in q]),
        val=Split([old.val.passages[i] for i in vp], [old.val.queries[i] for i in vq]),
    )


def run_refresh(req: RefreshRequest) -> StudentManifest:
    """Continue training a student on its index's new segments plus a replay of its corpus; export it as
    `tandem distill` does (same parity gate), with `trained_on` naming the version it now knows."""
    started = time.perf_counter()
    check_target(Path(req.out), req.force)
    student = read_student_manifest(req.student)
    if student.architecture == "static":
        raise InputError(f"{req.student} is a static student: `distill --from` refreshes transformer students only "
                         "so far; distill a new static student on the current version instead")
    trained = student.trained_on
    first = first_training(student)
    recorded = trained.corpus if trained is not None else first.get("corpus")
    if not isinstance(recorded, str) or "preset" not in first:
        raise InputError(f"{req.student}/student.json records neither the corpus nor the preset it was distilled "
                         "with: its training text cannot be replayed; distill a new student instead")
    version_dir = resolve_bundle(req.index)
    bundle = read_bundle_manifest(version_dir)
    card = _teacher(bundle, student, req)
    names = new_segments(version_dir, bundle, student, req.segments)
    if not req.segments and names:
        names = disagreeing(version_dir, bundle, req.student, names)
    new_docs = segment_documents(version_dir, bundle, names)
    if len(new_docs) < 2:
        raise InputError(f"{version_dir}: {len(new_docs)} live documents in the segments to train on "
                         f"({', '.join(names) or 'none: the student has seen every segment'}); nothing to refresh on")
    corpus = Path(recorded)
    if not corpus.is_file():
        raise InputError(f"{corpus}: the corpus {req.student} was distilled from is gone: its training text cannot "
                         "be replayed")
    corpus_sha256 = sha256_file(corpus)
    if trained is not None and corpus_sha256 != trained.corpus_sha256:
        raise ContractMismatch(f"{corpus} changed since {req.student} was distilled from it (sha256): the replay "
                               "would not be what it was trained on")
    old_docs = read_corpus(corpus)
    old_preset = Preset.model_validate(first["preset"])
    old_seed = int(first.get("seed", 0))  # type: ignore[call-overload]
    preset = resolve_preset(req.preset) if req.preset is not None else refresh_preset(student)
    old = build_training_data(old_docs, old_preset, old_seed)
    new = build_training_data(new_docs, preset, req.seed)
    replay = _replayed(old, new, req.replay, np.random.default_rng(req.seed))
    log.info("refresh of %s on %d documents of segments %s: %d new training texts + %d replayed of %s; validation "
             "%d new + %d old", req.student, len(new_docs), ", ".join(names), len(new.train), len(replay.train),
             corpus, len(new.val), len(replay.val))

    targets = TeacherTargets(card, req.device)
    doc_vectors = np.concatenate([targets.documents(old_docs), targets.documents(new_docs)])
    old_vectors = dict(zip(old.train.queries + old.val.queries,
                           targets.queries(old.train.queries + old.val.queries), strict=True))
    new_vectors = targets.queries(new.train.queries + new.val.queries)
    targets.release()  # training needs the memory

    device = pick_device(req.device)
    model, backbone = _starting_model(req, student, card)
    tokens = Tokens(backbone.hf_dir / "tokenizer.json", min(preset.max_seq_length, backbone.max_seq_length))
    passages = [d.passage() for d in old_docs + new_docs]
    shift = len(old_docs)
    n_new = len(new.train.queries)

    def side(queries: list[str], vectors: np.ndarray, rows: list[int]) -> tuple[Examples, Examples]:
        return (Examples(tokens.encode(queries), vectors),
                Examples(tokens.encode([passages[r] for r in rows]), doc_vectors[rows]))

    def stacked(new_side: Split, new_q: np.ndarray, old_side: Split) -> tuple[Examples, Examples]:
        old_q = np.stack([old_vectors[q] for q in old_side.queries]) if old_side.queries else new_q[:0]
        return side(new_side.queries + old_side.queries, np.concatenate([new_q, old_q]),
                    [r + shift for r in new_side.passages] + old_side.passages)

    train_set = stacked(new.train, new_vectors[:n_new], replay.train)
    val_set = stacked(new.val, new_vectors[n_new:], replay.val)
    check = new.val.queries[: CHECK_TEXTS // 2] + [passages[r + shift] for r in new.val.passages[: CHECK_TEXTS // 2]]
    rebuilt = _check_rebuilt(model, tokens, req.student, check)
    model = model.to(device)
    with model.fast_attention():
        result = train(model, tokens, train_set, val_set, doc_vectors, preset, req.seed, device)
    if result.best_epoch == 0:
        log.warning("the refreshed weights did no better on validation than %s: its weights are kept", req.student)

    record = Refreshed(student=str(Path(req.student).resolve()), bundle=str(version_dir.resolve()),
                       bundle_version=bundle.version or version_dir.name, segments=names, documents=len(new_docs),
                       train_texts=len(new.train), replayed_texts=len(replay.train))
    training: dict[str, object] = {
        "refresh": record.model_dump(), "preset": preset.model_dump(), "seed": req.seed, "replay": req.replay,
        "rebuilt_cosine": round(rebuilt, 6), "steps": result.steps, "best_epoch": result.best_epoch,
        "validation": [{"steps": v.steps, "loss": round(v.loss, 5), "overlap_at_10": v.overlap_at_10}
                       for v in result.history],
        "train_seconds": round(result.seconds, 1), "seconds": round(time.perf_counter() - started, 1),
        "previous": student.training,
    }
    known = trained or TrainedOn(  # a student distilled before trained_on: what its training record says
        corpus=str(corpus.resolve()), corpus_sha256=corpus_sha256, documents=len(old_docs), train_texts=len(old.train),
        train_queries=len(old.train.queries), real_queries=old.train.real, bundle="", bundle_version="")
    manifest = student.model_copy(update={
        "training": training, "parity": None, "created": utc_now(),
        "trained_on": known.model_copy(update={"bundle": record.bundle, "bundle_version": record.bundle_version,
                                               "segments": [s.name for s in bundle.parts],
                                               "refreshes": [*known.refreshes, record]}),
    })
    parity_texts = new.val.queries[:100] + replay.val.queries[:100] + [passages[r + shift]
                                                                       for r in new.val.passages[:32]]
    manifest = export_student(model, backbone.hf_dir, manifest, Path(req.out), parity_texts, force=req.force)
    log.info("refresh finished in %.0fs", time.perf_counter() - started)
    return manifest
