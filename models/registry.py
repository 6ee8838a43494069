"""Model cards: what a local HF model directory is, and its fingerprint.

Any HF-format directory can serve as teacher or student backbone. Its card records the
sha256 of the weights, the pooling and the output dimension; the fingerprint over those is
what bundles and students use to prove they share an embedding space.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from models.contract import TeacherRef
from models.errors import ModelNotFound
from models.paths import models_dir

CARD_FILE = "tandem_model.json"
ROLES_FILE = "roles.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
DEFAULT_TEACHER = "all-mpnet-base-v2"
DEFAULT_BACKBONE = "all-MiniLM-L6-v2"


class ModelCard(BaseModel):
    """A provisioned model directory and its fingerprint (over its weights, pooling, dim and normalization)."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: str
    weights_sha256: str
    pooling: str
    dim: int
    normalize: bool
    max_seq_length: int
    fingerprint: str

    def teacher_ref(self) -> TeacherRef:
        return TeacherRef(name=self.name, fingerprint=self.fingerprint, dim=self.dim)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(weights_sha256: str, pooling: str, dim: int, normalize: bool) -> str:
    payload = json.dumps(
        {"weights": weights_sha256, "pooling": pooling, "dim": dim, "normalize": normalize}, sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _pooling(model_dir: Path) -> str:
    cfg = _read_json(model_dir / "1_Pooling" / "config.json")
    for mode in ("cls_token", "max_tokens", "mean_sqrt_len_tokens"):
        if cfg.get(f"pooling_mode_{mode}"):
            raise ModelNotFound(f"{model_dir}: pooling mode {mode!r} is not supported; tandem uses mean pooling")
    return "mean"


def describe(model_dir: Path, name: str | None = None) -> ModelCard:
    """Build the card of an HF model directory (hashing its weights)."""
    model_dir = Path(model_dir).resolve()
    config = model_dir / "config.json"
    if not config.is_file():
        raise ModelNotFound(f"{model_dir} is not an HF model directory (no config.json)")
    weights = next((model_dir / w for w in WEIGHT_FILES if (model_dir / w).is_file()), None)
    if weights is None:
        raise ModelNotFound(f"{model_dir} has no weights ({' or '.join(WEIGHT_FILES)})")
    if not (model_dir / "tokenizer.json").is_file():
        raise ModelNotFound(f"{model_dir} has no tokenizer.json (a fast tokenizer file is required)")
    hf = json.loads(config.read_text())
    st = _read_json(model_dir / "sentence_bert_config.json")
    max_len = int(st.get("max_seq_length") or min(int(hf.get("max_position_embeddings", 514)) - 2, 512))
    dim = int(hf["hidden_size"])
    pooling = _pooling(model_dir)
    weights_sha = sha256_file(weights)
    return ModelCard(
        name=name or model_dir.name,
        path=str(model_dir),
        weights_sha256=weights_sha,
        pooling=pooling,
        dim=dim,
        normalize=True,
        max_seq_length=max_len,
        fingerprint=fingerprint(weights_sha, pooling, dim, True),
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
    roles = _read_json(roles_path)
    roles[role] = str(Path(model_dir).resolve())
    roles_path.parent.mkdir(parents=True, exist_ok=True)
    roles_path.write_text(json.dumps(roles, indent=2) + "\n")


def resolve(role: str, explicit: Path | None = None) -> Path:
    """Model directory for a role: an explicit path, else the store's recorded role, else the default."""
    if explicit is not None:
        path = Path(explicit)
    else:
        recorded = _read_json(models_dir() / ROLES_FILE).get(role)
        default = DEFAULT_TEACHER if role == "teacher" else DEFAULT_BACKBONE
        path = Path(recorded) if recorded else models_dir() / default
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"no {role} model at {path}; run `tandem models fetch` (or pass a model directory)")
    return path
