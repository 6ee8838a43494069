"""Where tandem keeps its git-ignored state: models, embedding caches, bundles."""

from __future__ import annotations

import os
import re
from pathlib import Path

# One path component of its own: never '.', '..', a hidden name, an option, a separator or a control character.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def is_plain_name(name: str) -> bool:
    """Whether `name` (read from a manifest, a command line or a store) may be joined to a directory as one entry in
    it: letters, digits, '.', '_' and '-', starting with a letter or digit. Version, segment, tombstone, embedding
    store and model names are all checked by it before they become paths."""
    return isinstance(name, str) and _PLAIN_NAME.fullmatch(name) is not None


def tandem_home() -> Path:
    """Root of the local store: TANDEM_HOME, else ./.tandem under the working directory."""
    return Path(os.environ.get("TANDEM_HOME", ".tandem")).resolve()


def models_dir() -> Path:
    return tandem_home() / "models"


def embeddings_dir() -> Path:
    return tandem_home() / "embeddings"


def cache_dir() -> Path:
    return tandem_home() / "cache"
