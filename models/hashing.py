"""File hashing: the sha256 that fingerprints model weights, embedding imports, and a bundle's files.

One home on the lowest floor, so the indexer, the encoders, the embedding store, training and the CLI hash a file
the same way without importing the model registry for it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
