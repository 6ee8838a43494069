"""`tandem distill`: corpus + bundle → teacher targets → ridge-initialized student → training → ONNX.

With preset `members` > 1, several students train on their own pseudo-queries and the ONNX
student is the average of their weights (models/distill/training/soup.py).

The bundle names the teacher whose space the student must learn; the teacher model given
(or recorded) must be that very model, by fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from models.bundle.manifest import BundleManifest
from models.bundle.staging import check_target
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import resolve_bundle
from models.corpus import read_corpus
from models.datasets.teacher_targets import TeacherTargets
from models.distill.exporting.export import export_student
from models.distill.exporting.export_static import export_static
from models.distill.model import Student, StudentModel, depth
from models.distill.presets import Preset, resolve_preset
from models.distill.static import StaticModel, initial_table
from models.distill.texts.data import TrainingData, build_training_data
from models.distill.texts.dataset import Examples
from models.distill.texts.queries import read_train_queries
from models.distill.texts.tokens import Tokens, embed
from models.distill.training.checkpoints import LAST
from models.distill.training.int8_emulation import int8_emulation
from models.distill.training.ridge import fit_ridge
from models.distill.training.soup import average_states, member_seed
from models.distill.training.trainer import TrainResult, Validation, train, validate
from models.encoders.pooling import Head
from models.encoders.precision import PrecisionChoice
from models.encoders.registry import ModelCard, load_card, resolve
from models.encoders.student_manifest import StudentManifest, TrainedOn
from models.encoders.teacher import pick_device
from models.errors import ContractMismatch
from models.hashing import sha256_file
from models.paths import cache_dir

log = logging.getLogger(__name__)

PARITY_QUERIES = 200
PARITY_PASSAGES = 32


class DistillRequest(BaseModel):
    """What `tandem distill` was asked: the corpus, its bundle (whose teacher the student aligns to), out, preset."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    corpus: Path
    index: Path = Field(description="a bundle directory, or a bundle root (its CURRENT version)")
    out: Path
    preset: str | Preset = "default"
    train_queries: Path | None = None
    teacher: Path | None = None
    backbone: Path | None = None
    device: str | None = None
    precision: PrecisionChoice | None = Field(
        default=None, description="the teacher's for the targets it computes (pseudo-queries; passages the bundle "
        "does not hold), as `index build --precision` takes it: None fp32 on CPU (fp16 on CUDA), auto bf16 on a "
        "CPU that computes it natively")
    seed: int = 0
    force: bool = False


def _teacher_of(bundle: BundleManifest, req: DistillRequest) -> ModelCard:
    card = load_card(resolve("teacher", req.teacher))
    if card.fingerprint != bundle.teacher.fingerprint:
        raise ContractMismatch(
            f"{req.index} was built with teacher {bundle.teacher.name!r} (fingerprint "
            f"{bundle.teacher.fingerprint[:16]}…, {bundle.teacher.setup_text()}) but the teacher model at {card.path} "
            f"is {card.name!r} (fingerprint {card.fingerprint[:16]}…, {card.teacher_ref().setup_text()}); pass "
            "--teacher with the bundle's teacher model, set up as it was"
        )
    return card


def _examples(
    data: TrainingData, passages: list[str], doc_vectors: np.ndarray, query_vectors: np.ndarray, tokens: Tokens,
    repeats: int = 1,
) -> tuple[tuple[Examples, Examples], tuple[Examples, Examples]]:
    """(queries, passages) examples for train and validation; query_vectors cover train then val queries.

    Training's real queries appear `repeats` times: validation is left as it is.
    """
    n_train = len(data.train.queries)
    sides = []
    splits = ((data.train, query_vectors[:n_train], repeats), (data.val, query_vectors[n_train:], 1))
    for split, vectors, times in splits:
        queries = Examples(tokens.encode(split.queries), vectors).repeat_last(split.real, times)
        docs = Examples(tokens.encode([passages[r] for r in split.passages]), doc_vectors[split.passages])
        sides.append((queries, docs))
    return sides[0], sides[1]


def _ridge_init(
    model: Student, tokens: Tokens, train_set: tuple[Examples, Examples], val_all: Examples, preset: Preset,
    seed: int, device: torch.device,
) -> float:
    """Fit the projection in closed form on a sample of training texts; returns the validation loss.

    The sample mixes queries and passages as an epoch does, which also keeps 256-token passages
    from dominating the cost of the backbone's forward passes.
    """
    rng = np.random.default_rng(seed)
    queries, passages = train_set
    picked = rng.choice(len(passages), preset.epoch_passages(len(passages)), replace=False)
    pool = Examples.concat(queries, passages.take(np.sort(picked)))
    sample = pool.take(np.sort(rng.choice(len(pool), min(preset.ridge_texts, len(pool)), replace=False)))
    x = embed(model, tokens, sample.ids, model.pooled, device)
    x_val = embed(model, tokens, val_all.ids, model.pooled, device)
    fit = fit_ridge(x, sample.targets, x_val, val_all.targets)
    model.set_projection(torch.from_numpy(fit.weight), torch.from_numpy(fit.bias))
    return fit.val_loss


def _starting_card(card: ModelCard, preset: Preset, backbone: Path | None) -> ModelCard:
    """The model the student starts from: the backbone, or the teacher itself for teacher-layers and static."""
    return card if preset.student in ("teacher-layers", "static") else load_card(resolve("backbone", backbone))


def _student_model(start: ModelCard, card: ModelCard, preset: Preset, device: torch.device
                   ) -> Student:
    if preset.student == "static":
        log.info("student: static table of %s's vocabulary (init: %s, weights: %s), + Linear to %d-d", card.name,
                 preset.static_init, preset.static_weights, card.dim)
        return StaticModel(initial_table(card, preset.static_init, device), card.dim,
                           name=f"{card.name} static ({preset.static_init})")
    if preset.student == "teacher-layers":
        total = depth(card.hf_dir)
        layers = preset.layer_indices(total)
        log.info("student: %s layers %s of %d (teacher-layer extraction), %s", card.name, layers, total,
                 card.summary())
        return StudentModel(card.hf_dir, card.dim, keep_layers=layers, name=f"{card.name} layers {layers}",
                            pooling=card.pooling, head=Head(card, Path(card.path)))
    total = depth(start.hf_dir)
    keep = preset.backbone_layer_indices(total)
    log.info("student: %s%s, pooling %s, + Linear to %d-d", start.name,
             f" layers {keep} of {total}" if keep is not None else "", start.pooling, card.dim)
    return StudentModel(start.hf_dir, card.dim, name=start.name if keep is None else f"{start.name} layers {keep}",
                        pooling=start.pooling, backbone_layers=keep)


def checkpoint_dir(req: DistillRequest, preset: Preset, *fingerprints: str) -> Path:
    """Private to one run's inputs, so a resumed run never continues another run's training."""
    identity = {"preset": preset.model_dump(), "seed": req.seed, "inputs": fingerprints}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / "checkpoints" / digest


@dataclass
class _Member:
    """One trained member: how many texts it trained on, its run of train(), and its final weights (for a soup)."""

    seed: int
    train_texts: int
    result: TrainResult
    ridge_loss: float | None
    state: dict[str, torch.Tensor]
    checkpoints: Path

    def record(self) -> dict[str, object]:
        r = self.result
        return {
            "epochs": r.epochs,
            "steps": r.steps,
            "ridge_val_loss": None if self.ridge_loss is None else round(self.ridge_loss, 5),
            "best_epoch": r.best_epoch,
            "resumed_from_epoch": r.resumed_from,
            "validation": [_rounded(h) for h in r.history],
            "final_val_loss": round(r.history[r.best_epoch].loss, 5),
            "train_seconds": round(r.seconds, 1),
        }


def _rounded(v: Validation) -> dict[str, object]:
    return {k: round(x, 5) if isinstance(x, float) else x for k, x in asdict(v).items()}


def run_distill(req: DistillRequest) -> StudentManifest:
    """Train a student into the bundle's teacher space and export it to ONNX (fp32 and int8) with a parity report.

    Resumable: the teacher's targets are cached and each epoch is checkpointed, so a killed run picks up where it
    stopped. The student directory is published only when complete (models.bundle.staging).
    """
    started = time.perf_counter()
    preset = resolve_preset(req.preset)
    check_target(Path(req.out), req.force)
    version_dir = resolve_bundle(req.index)  # a bundle root: its CURRENT version, as serve does
    bundle = read_bundle_manifest(version_dir)
    card = _teacher_of(bundle, req)
    backbone = _starting_card(card, preset, req.backbone)  # before any heavy work: a missing model fails fast
    backbone_dir = backbone.hf_dir
    docs = read_corpus(req.corpus)
    corpus_sha256 = sha256_file(Path(req.corpus))
    if corpus_sha256 != bundle.corpus.sha256:
        log.warning("%s is not the corpus %s was built from (%s)", req.corpus, req.index, bundle.corpus.path)
    extra = read_train_queries(req.train_queries) if req.train_queries is not None else []
    datas = [build_training_data(docs, preset, req.seed, extra, member=m) for m in range(preset.members)]
    data = datas[0]
    log.info("training text: %d passages + %d queries (%d real, each %d× per epoch)%s; validation: %d passages + "
             "%d queries (%d real)", len(data.train.passages), len(data.train.queries), data.train.real,
             preset.real_query_repeats, f", for each of {preset.members} members" if preset.members > 1 else "",
             len(data.val.passages), len(data.val.queries), data.val.real)

    targets = TeacherTargets(card, req.device, precision=req.precision)
    built_from = bundle.embeddings.store_key if corpus_sha256 == bundle.corpus.sha256 else None
    doc_vectors = targets.documents(docs, built_from)
    query_vectors = [targets.queries(d.train.queries + d.val.queries) for d in datas]
    targets.release()  # frees the teacher, if it was loaded (or kept by a build in this process): training needs it

    device = pick_device(req.device)
    tokens = Tokens(backbone_dir / "tokenizer.json", min(preset.max_seq_length, backbone.max_seq_length))
    passages = [d.passage() for d in docs]
    members: list[_Member] = []
    for m, (member_data, vectors) in enumerate(zip(datas, query_vectors, strict=True)):
        seed = member_seed(req.seed, m)
        torch.manual_seed(seed)
        model = _student_model(backbone, card, preset, device).to(device)
        train_set, val_set = _examples(member_data, passages, doc_vectors, vectors, tokens, preset.real_query_repeats)
        if isinstance(model, StaticModel) and preset.static_weights == "sif":
            model.set_sif_weights(train_set[0].ids + train_set[1].ids)
        texts_digest = hashlib.sha256("\x00".join(member_data.train.queries + member_data.val.queries).encode())
        checkpoints = checkpoint_dir(req, preset, card.fingerprint, backbone.fingerprint, bundle.corpus.sha256,
                                     texts_digest.hexdigest())
        if preset.members > 1:
            log.info("member %d of %d (seed %d)", m + 1, preset.members, seed)
        ridge_loss = None
        with model.fast_attention() as attention:
            log.info("student attention while training: %s", attention)
            if model.has_projection and not (checkpoints / LAST).is_file():  # resuming restores the projection
                ridge_loss = _ridge_init(model, tokens, train_set, Examples.concat(*val_set), preset, seed, device)
            result = train(model, tokens, train_set, val_set, doc_vectors, preset, seed, device, checkpoints)
        # a one-member run publishes the model as it is: only a soup needs each member's weights kept aside
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()} if preset.members > 1 else {}
        members.append(_Member(seed, len(member_data.train), result, ridge_loss, state, checkpoints))

    training: dict[str, object] = {
        "preset": preset.model_dump(),
        "seed": req.seed,
        "corpus": str(Path(req.corpus).resolve()),
        "texts": {"train": len(data.train), "val": len(data.val), "train_queries": len(extra)},
    }
    if len(members) == 1:
        training |= members[0].record()
    else:
        model.load_state_dict(average_states([mb.state for mb in members]))
        soup = _validate_soup(model, tokens, val_set, doc_vectors, preset, sum(mb.result.steps for mb in members),
                              device)
        log.info("soup of %d members: %s", len(members), soup)
        training |= {"members": [{"seed": mb.seed, "train_texts": mb.train_texts} | mb.record() for mb in members],
                     "soup_validation": _rounded(soup), "final_val_loss": round(soup.loss, 5),
                     "train_seconds": round(sum(mb.result.seconds for mb in members), 1)}
    training["seconds"] = round(time.perf_counter() - started, 1)
    manifest = StudentManifest(
        teacher=card.teacher_ref(),
        backbone=model.name,
        backbone_fingerprint=backbone.fingerprint,
        backbone_pooling=model.pooling,
        max_seq_length=backbone.max_seq_length,
        training=training,
        trained_on=TrainedOn(
            corpus=str(Path(req.corpus).resolve()), corpus_sha256=corpus_sha256, documents=len(docs),
            train_texts=len(data.train), train_queries=len(data.train.queries), real_queries=data.train.real,
            bundle=str(version_dir.resolve()), bundle_version=bundle.version or version_dir.name,
            segments=[segment.name for segment in bundle.parts], teacher_precision=targets.precision,
        ),
    )
    parity_passages = [docs[r].passage() for r in data.val.passages[:PARITY_PASSAGES]]
    parity_texts = data.val.queries[:PARITY_QUERIES] + parity_passages
    if isinstance(model, StaticModel):
        manifest = export_static(model, backbone_dir, manifest, Path(req.out), parity_texts, force=req.force)
    else:
        manifest = export_student(model, backbone_dir, manifest, Path(req.out), parity_texts, force=req.force)
    for mb in members:
        shutil.rmtree(mb.checkpoints, ignore_errors=True)  # the published student supersedes them
    log.info("distillation finished in %.0fs", time.perf_counter() - started)
    return manifest


def _validate_soup(
    model: Student, tokens: Tokens, val_set: tuple[Examples, Examples], doc_vectors: np.ndarray, preset: Preset,
    steps: int, device: torch.device,
) -> Validation:
    """The averaged weights on the members' shared validation texts, through the int8 rounding if they trained so."""
    bank = torch.from_numpy(np.ascontiguousarray(doc_vectors, dtype=np.float32)).to(device)
    emulate = preset.int8_epochs > 0
    with model.fast_attention(), int8_emulation(model, enabled=emulate):
        return validate(model, tokens, val_set, bank, steps, device, int8=emulate)
