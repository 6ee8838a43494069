"""Where tandem keeps its git-ignored state: models, embedding caches, bundles."""

from __future__ import annotations

import os
from pathlib import Path


def tandem_home() -> Path:
    """Root of the local store: TANDEM_HOME, else ./.tandem under the working directory."""
    return Path(os.environ.get("TANDEM_HOME", ".tandem")).resolve()


def models_dir() -> Path:
    return tandem_home() / "models"


def embeddings_dir() -> Path:
    return tandem_home() / "embeddings"


def cache_dir() -> Path:
    return tandem_home() / "cache"
