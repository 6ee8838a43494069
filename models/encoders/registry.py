"""Model cards: what a local model directory is, and its fingerprint.

Any HF-format directory, or sentence-transformers directory, can serve as teacher or student
backbone. Its card records the sha256 of the weights, how text becomes a vector (pooling,
prompts, Dense layers: models.encoders.encoder_setup) and the output dimension; the fingerprint over
those is what bundles and students use to prove they share an embedding space.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import ConfigDict

from models.contract import TeacherRef
from models.encoders.encoder_setup import (
    MODULES_FILE,
    DenseLayer,
    EncoderSetup,
    Overrides,
    declared_max_length,
    read_json,
    read_setup,
    weights_file,
)
from models.errors import ModelNotFound
from models.hashing import sha256_file
from models.paths import models_dir

CARD_FILE = "tandem_model.json"
ROLES_FILE = "roles.json"
DEFAULT_TEACHER = "all-mpnet-base-v2"
DEFAULT_BACKBONE = "all-MiniLM-L6-v2"


class ModelCard(EncoderSetup):
    """A provisioned model directory: its weights, its setup (models.encoders.encoder_setup), dim and fingerprint."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: str
    weights_sha256: str
    dim: int
    normalize: bool
    max_seq_length: int
    fingerprint: str

    @property
    def hf_dir(self) -> Path:
        """The directory holding the HF model (config, weights, tokenizer): the model directory or its subfolder."""
        return Path(self.path) / self.transformer

    def setup(self) -> EncoderSetup:
        return EncoderSetup.model_validate(self.model_dump(include=set(EncoderSetup.model_fields)))

    def teacher_ref(self) -> TeacherRef:
        return TeacherRef(name=self.name, fingerprint=self.fingerprint, dim=self.dim, pooling=self.pooling,
                          query_prompt=self.query_prompt, document_prompt=self.document_prompt)


def fingerprint(weights_sha256: str, pooling: str, dim: int, normalize: bool,
                extra: dict[str, object] | None = None) -> str:
    """sha256 over what makes the vectors: weights, pooling, dim, normalization, and `extra` (EncoderSetup.identity).

    `extra` holds only what differs from tandem's original setup (mean, no prompts, no Dense), so a model of
    that setup keeps the fingerprint it always had (docs/decisions.md#the-fingerprint-grows-only-where-a-setup-differs).
    """
    payload = json.dumps(
        {"weights": weights_sha256, "pooling": pooling, "dim": dim, "normalize": normalize, **(extra or {})},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def is_model_dir(path: Path) -> bool:
    """An HF directory (config.json) or a sentence-transformers one (modules.json)."""
    return (path / "config.json").is_file() or (path / MODULES_FILE).is_file()


def _output_dim(hidden: int, setup: EncoderSetup, model_dir: Path) -> int:
    """The vector's width: the pooled width through each Dense layer, then truncate_dim."""
    dim = hidden
    for layer in setup.head:
        if isinstance(layer, DenseLayer):
            if layer.in_features != dim:
                raise ModelNotFound(f"{model_dir / layer.path}: a Dense layer of {layer.in_features} inputs after "
                                    f"{dim}-d vectors")
            dim = layer.out_features
    return dim if setup.truncate_dim is None else min(dim, setup.truncate_dim)


def describe(model_dir: Path, name: str | None = None, overrides: Overrides | None = None) -> ModelCard:
    """Build the card of a model directory (hashing its weights); `overrides` are what `models add` was told."""
    model_dir = Path(model_dir).resolve()
    if not is_model_dir(model_dir):
        raise ModelNotFound(f"{model_dir} is not a model directory (no config.json or {MODULES_FILE})")
    setup = read_setup(model_dir, sha256_file, overrides)
    hf_dir = model_dir / setup.transformer
    config = hf_dir / "config.json"
    if not config.is_file():
        raise ModelNotFound(f"{hf_dir} is not an HF model directory (no config.json)")
    weights = weights_file(hf_dir)
    if not (hf_dir / "tokenizer.json").is_file():
        raise ModelNotFound(f"{hf_dir} has no tokenizer.json (a fast tokenizer file is required)")
    hf = read_json(config)
    try:
        hidden = int(hf["hidden_size"])
        positions = int(hf.get("max_position_embeddings", 514))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelNotFound(f"{config}: no integer hidden_size ({exc})") from exc
    dim = _output_dim(hidden, setup, model_dir)
    weights_sha = sha256_file(weights)
    return ModelCard(
        **setup.model_dump(),
        name=name or model_dir.name,
        path=str(model_dir),
        weights_sha256=weights_sha,
        dim=dim,
        normalize=True,
        max_seq_length=declared_max_length(hf_dir, positions),
        fingerprint=fingerprint(weights_sha, setup.pooling, dim, True, setup.identity()),
    )


def write_card(card: ModelCard) -> None:
    (Path(card.path) / CARD_FILE).write_text(card.model_dump_json(indent=2) + "\n")


def load_card(model_dir: Path) -> ModelCard:
    """The recorded card if present (fast), else describe the directory now."""
    model_dir = Path(model_dir)
    card_path = model_dir / CARD_FILE
    if card_path.is_file():
        card = ModelCard.model_validate_json(card_path.read_text())
        return card.model_copy(update={"path": str(model_dir.resolve())})
    return describe(model_dir)


def record_role(role: str, model_dir: Path) -> None:
    """Remember which directory plays `role` ('teacher' or 'backbone') for later commands."""
    roles_path = models_dir() / ROLES_FILE
    roles = read_json(roles_path)
    roles[role] = str(Path(model_dir).resolve())
    roles_path.parent.mkdir(parents=True, exist_ok=True)
    roles_path.write_text(json.dumps(roles, indent=2) + "\n")


def resolve(role: str, explicit: Path | None = None) -> Path:
    """Model directory for a role: an explicit path, else the store's recorded role, else the default."""
    if explicit is not None:
        path = Path(explicit)
    else:
        recorded = read_json(models_dir() / ROLES_FILE).get(role)
        default = DEFAULT_TEACHER if role == "teacher" else DEFAULT_BACKBONE
        path = Path(recorded) if recorded else models_dir() / default
    if not is_model_dir(path):
        raise ModelNotFound(f"no {role} model at {path}; run `tandem models fetch` (or pass a model directory)")
    return path
