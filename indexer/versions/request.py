"""What `tandem index update`, `compact` and `follow` are asked: the version to start from, where the new one
goes, and how the teacher runs for the documents they encode."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from indexer.encoding.encode import TeacherRun, local_device
from indexer.publish import Target
from indexer.sample import sample_size
from models.bundle.manifest import BundleManifest
from models.bundle.versions import is_bundle_root, resolve_bundle
from models.contract import check_same_teacher
from models.embeddings.store import SHARD_SIZE, EmbeddingStore
from models.encoders.precision import AUTO, TeacherPrecision, auto_precision, read_cpu_flags
from models.encoders.registry import ModelCard, load_card, resolve
from models.errors import InputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionRequest:
    """A new version made from a published one: `compact`'s request, and the part of `update`'s it shares."""

    base: Path | None = None
    root: Path | None = None
    out: Path | None = None
    version: str | None = None
    keep: int | None = None
    force: bool = False
    teacher: Path | None = None
    batch_size: int = 32
    device: str | None = None
    store: Path | None = None
    shard_size: int = SHARD_SIZE
    precision: str | None = None  # the teacher's, for texts this version encodes; None or auto: the base's
    # (where the base records none, None is fp32 and auto this device's pick)

    @property
    def target(self) -> Target:
        return Target(out=self.out, root=self.root, version=self.version, keep=self.keep, force=self.force)

    def check(self) -> None:
        if self.shard_size < 1:
            raise InputError(f"--shard-size must be at least 1, got {self.shard_size}")
        sample_size()  # a bad TANDEM_AGREEMENT_SAMPLE is refused before any work
        self.target.check()

    def teacher_for(self, base: BundleManifest) -> tuple[ModelCard, EmbeddingStore, TeacherRun]:
        """The teacher this request names, refused unless `base` was built with it; the embedding store and how
        the teacher runs, for the documents the new version encodes."""
        card = load_card(resolve("teacher", self.teacher))
        check_same_teacher(card.teacher_ref(), base.teacher, what="teacher model")
        run = TeacherRun(device=self.device, batch_size=self.batch_size,
                         precision=version_precision(self.precision, base, self.device))
        run.check()
        return card, EmbeddingStore(self.store, shard_size=self.shard_size), run


def recorded_precision(manifest: BundleManifest) -> str | None:
    """The precision the teacher encoded a version's vectors in, as its manifest records it: one for all of its
    encoded segments; None when none was encoded (imported vectors) or they differ."""
    kinds = {s.embeddings.precision or "fp32" for s in manifest.parts
             if s.embeddings is not None and s.embeddings.kind == "encoded"}
    return kinds.pop() if len(kinds) == 1 else None


def version_precision(requested: str | None, base: BundleManifest, device: str | None = None) -> str:
    """The teacher's precision for the texts a new version of `base` encodes: the base's own unless another is
    given (None and `auto` keep the version consistent). Where the base records none (its vectors were imported),
    None is fp32, the reference, and `auto` what models.encoders.precision.auto_precision picks for `device` (bf16
    on a CPU with AVX-512 BF16 or AMX: a follower of an imported 10M corpus keeps up with 1,000 documents a minute
    in bf16, not in fp32). A precision other than the base's is allowed, with a warning: each segment records the
    one it was encoded in."""
    recorded = recorded_precision(base)
    if requested == AUTO and recorded is None:
        picked = auto_precision(device or local_device(), read_cpu_flags()).value
        log.info("--precision auto: %s (the base records no precision of its own)", picked)
        return picked
    if requested is None or requested == AUTO:
        return recorded or TeacherPrecision.FP32.value
    if recorded is not None and requested != recorded:
        log.warning("the base's vectors were encoded in %s; --precision %s encodes this version's new texts "
                    "otherwise (cosine to fp32 0.9998 and more for bf16: docs/decisions.md)", recorded, requested)
    return requested


@dataclass(frozen=True)
class UpdateRequest(VersionRequest):
    changes: Path | None = None
    delete_ids: Path | None = None


def base_dir(req: VersionRequest) -> Path:
    """--base as a version name under --root, a bundle dir or a root; default: --root's CURRENT."""
    if req.base is None:
        if req.root is None:
            raise InputError("--out needs --base (the bundle to change)")
        if not is_bundle_root(req.root):
            raise InputError(f"{req.root} has no CURRENT version to change; publish one with "
                             "`tandem index build --root`")
        return resolve_bundle(req.root)
    if req.root is not None and len(req.base.parts) == 1 and (req.root / req.base).is_dir():
        return req.root / req.base
    if not Path(req.base).is_dir():
        raise InputError(f"--base {req.base}: not a bundle directory, bundle root or version under --root")
    return resolve_bundle(req.base)
