"""How a model directory turns text into a vector, read as sentence-transformers reads it (no torch here).

A sentence-transformers directory describes itself: `modules.json` lists its modules in order
(Transformer, Pooling, then Dense and Normalize layers), each module's folder holds its config,
and `config_sentence_transformers.json` holds the prompts. A plain HF directory says none of
this: it is mean-pooled and unprompted unless `models add` is told otherwise (`Overrides`).

Queries and documents are told apart as sentence-transformers' `encode_query` and
`encode_document` do, with one difference: an empty prompt never hides a non-empty one
(docs/decisions.md#prompts-of-a-sentence-transformers-directory).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from models.contract import prompts_text
from models.errors import InputError, ModelNotFound

PoolingMode = Literal["mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
POOLING_MODES: tuple[str, ...] = PoolingMode.__args__  # type: ignore[attr-defined]
# sentence-transformers' older Pooling configs: one boolean per mode (its own table, in its order)
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"
TRANSFORMER_CONFIG_FILE = "sentence_bert_config.json"
QUERY_PROMPT_NAMES = ("query",)
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")  # encode_document's order
DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"  # Dense's default, as sentence-transformers has it
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class DenseLayer(BaseModel):
    """A sentence-transformers Dense module: activation(linear(x)), plus x (or a projection of it) if residual."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["dense"] = "dense"
    path: str = Field(description="its folder, relative to the model directory")
    weights: str = Field(description="its weight file, relative to the model directory")
    weights_sha256: str
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = DEFAULT_ACTIVATION
    residual: bool = False

    def identity(self) -> dict[str, object]:
        """What of it changes a vector (its place on disk does not)."""
        out: dict[str, object] = {"dense": self.weights_sha256, "in": self.in_features, "out": self.out_features,
                                  "bias": self.bias, "activation": self.activation}
        if self.residual:
            out["residual"] = True
        return out


class NormalizeLayer(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["normalize"] = "normalize"

    def identity(self) -> str:
        return "normalize"


HeadLayer = Annotated[DenseLayer | NormalizeLayer, Field(discriminator="kind")]


class EncoderSetup(BaseModel):
    """Everything between the transformer's token states and the vector, and what is prepended to the text.

    The defaults are tandem's original setup (mean pooling, no prompts, nothing after pooling):
    cards written before this existed read as exactly that.
    """

    model_config = ConfigDict(frozen=True)

    transformer: str = Field(default="", description="the folder holding the HF model, relative to the directory")
    pooling: PoolingMode = "mean"
    include_prompt: bool = Field(default=True, description="False: the prompt's tokens are left out of the pooling")
    query_prompt: str = ""
    document_prompt: str = ""
    head: list[HeadLayer] = Field(default_factory=list, description="Dense and Normalize layers after pooling")
    lowercase: bool = Field(default=False, description="the text is lowercased before tokenizing (do_lower_case)")
    truncate_dim: int | None = Field(default=None, description="the vector is cut to this many dims (then normalized)")

    def prompt(self, role: Literal["query", "document"]) -> str:
        return self.query_prompt if role == "query" else self.document_prompt

    def effective_head(self) -> list[HeadLayer]:
        """The head without its trailing Normalize layers: tandem normalizes every vector last anyway."""
        head = list(self.head)
        while head and isinstance(head[-1], NormalizeLayer):
            head.pop()
        return head

    def identity(self) -> dict[str, Any]:
        """What sets this setup apart from the original one, for the fingerprint; {} for the original.

        Only what changes a vector is here: a trailing Normalize does not (every vector is normalized
        last), include_prompt does not without prompts, and truncate_dim shows in the output dim.
        """
        out: dict[str, Any] = {}
        if self.query_prompt:
            out["query_prompt"] = self.query_prompt
        if self.document_prompt:
            out["document_prompt"] = self.document_prompt
        if not self.include_prompt and (self.query_prompt or self.document_prompt):
            out["include_prompt"] = False
        head = self.effective_head()
        if head:
            out["head"] = [layer.identity() for layer in head]
        if self.lowercase:
            out["lowercase"] = True
        return out

    def summary(self) -> str:
        """One line for people: pooling, prompts, head."""
        parts = [f"pooling {self.pooling}" + ("" if self.include_prompt else " (prompt excluded)")]
        parts.append(prompts_text(self.query_prompt, self.document_prompt))
        dense = [layer for layer in self.head if isinstance(layer, DenseLayer)]
        if dense:
            parts.append(" → ".join(f"Dense {d.in_features}→{d.out_features}" for d in dense))
        if self.truncate_dim is not None:
            parts.append(f"truncated to {self.truncate_dim}")
        return ", ".join(parts)


class Overrides(BaseModel):
    """What `tandem models add` (or `fetch --teacher`) was told beyond the directory's own files."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pooling: PoolingMode | None = None
    query_prompt: str | None = None
    document_prompt: str | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.pooling, self.query_prompt, self.document_prompt))


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelNotFound(f"{path}: not a readable JSON file ({exc})") from exc


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, {} when absent; a file that is not a JSON object is an error naming it."""
    if not path.is_file():
        return {}
    data = _load(path)
    if not isinstance(data, dict):
        raise ModelNotFound(f"{path}: expected a JSON object")
    return data


def _modules(model_dir: Path) -> list[tuple[str, str]]:
    """(class name, folder) of each module listed in modules.json, in order; [] without the file."""
    path = model_dir / MODULES_FILE
    if not path.is_file():
        return []
    entries = _load(path)
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("type"), str)
                                                 for e in entries):
        raise ModelNotFound(f"{path}: expected a list of modules, each with a 'type'")
    out = []
    for entry in entries:
        folder = str(entry.get("path") or "")
        if Path(folder).is_absolute() or ".." in Path(folder).parts:
            raise ModelNotFound(f"{path}: module path {folder!r} leaves the model directory")
        out.append((entry["type"].rsplit(".", 1)[-1], folder))
    return out


def _pooling(config: dict[str, Any], where: Path) -> tuple[PoolingMode, bool]:
    """The mode and include_prompt of a Pooling config, in either of its formats."""
    mode: object = config.get("pooling_mode")
    if mode is None:
        active = [m for key, m in LEGACY_POOLING_KEYS.items() if config.get(key)]
        mode = active or ["mean"]
    if isinstance(mode, list | tuple):
        if len(mode) != 1:
            raise ModelNotFound(f"{where}: pooling modes {list(mode)} are combined (concatenated); tandem takes "
                                f"one of {', '.join(POOLING_MODES)}")
        mode = mode[0]
    if mode not in POOLING_MODES:
        raise ModelNotFound(f"{where}: pooling mode {mode!r} is not one of {', '.join(POOLING_MODES)}")
    return mode, bool(config.get("include_prompt", True))  # type: ignore[return-value]


def weights_file(folder: Path) -> Path:
    """The weights of a model folder, safetensors before PyTorch's (WEIGHT_FILES' order)."""
    found = next((folder / w for w in WEIGHT_FILES if (folder / w).is_file()), None)
    if found is None:
        raise ModelNotFound(f"{folder} has no weights ({' or '.join(WEIGHT_FILES)})")
    return found


def _dense(model_dir: Path, folder: str, sha256: Any) -> DenseLayer:
    where = model_dir / folder / "config.json"
    config = read_json(where)
    if not config:
        raise ModelNotFound(f"{where} is missing: a Dense module needs its config")
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, "sentence_embedding") not in ("sentence_embedding", None):
            raise ModelNotFound(f"{where}: {key} {config[key]!r}; tandem reads Dense layers over the sentence "
                                "embedding only")
    activation = str(config.get("activation_function") or DEFAULT_ACTIVATION)
    if not activation.startswith("torch.nn."):  # sentence-transformers imports these only with trust_remote_code
        raise ModelNotFound(f"{where}: activation {activation!r} is not a torch.nn module; tandem runs no code "
                            "from a model directory")
    weights = weights_file(model_dir / folder)
    try:
        return DenseLayer(path=folder, weights=str(weights.relative_to(model_dir)), weights_sha256=sha256(weights),
                          in_features=int(config["in_features"]), out_features=int(config["out_features"]),
                          bias=bool(config.get("bias", True)), activation=activation,
                          residual=bool(config.get("use_residual", False)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelNotFound(f"{where}: in_features and out_features must be integers ({exc})") from exc


def _role_prompt(prompts: dict[str, str], names: tuple[str, ...], default: str) -> str:
    """The first non-empty prompt of `names`, else the default prompt (default_prompt_name's), else none.

    sentence-transformers 6 saves an empty "document" prompt into every model it writes, and its
    encode_document takes that one even beside a non-empty "passage": an empty prompt here never
    hides a named one.
    """
    return next((prompts[n] for n in names if prompts.get(n)), default)


def _prompts(model_dir: Path) -> tuple[str, str, int | None]:
    path = model_dir / ST_CONFIG_FILE
    config = read_json(path)
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str | None) for v in prompts.values()):
        raise ModelNotFound(f"{path}: 'prompts' must map names to strings")
    prompts = {k: v or "" for k, v in prompts.items()}
    default_name = config.get("default_prompt_name")
    if default_name is not None and default_name not in prompts:
        raise ModelNotFound(f"{path}: default_prompt_name {default_name!r} is not among the prompts "
                            f"({', '.join(prompts) or 'none'})")
    default = prompts.get(default_name, "") if default_name else ""
    truncate_dim = config.get("truncate_dim")
    if truncate_dim is not None and (not isinstance(truncate_dim, int) or truncate_dim < 1):
        raise ModelNotFound(f"{path}: truncate_dim must be a positive integer, got {truncate_dim!r}")
    return (_role_prompt(prompts, QUERY_PROMPT_NAMES, default), _role_prompt(prompts, DOCUMENT_PROMPT_NAMES, default),
            truncate_dim)


def read_setup(model_dir: Path, sha256: Any, overrides: Overrides | None = None) -> EncoderSetup:
    """The setup a directory declares (modules.json and the module configs), with `overrides` applied.

    `sha256(path)` hashes a Dense layer's weights. Anything tandem cannot run exactly as
    sentence-transformers does (another module type, combined pooling modes, code named by a
    config) is refused, naming the file: a vector computed differently would not be the model's.
    """
    overrides = overrides or Overrides()
    modules = _modules(model_dir)
    if not modules:  # a plain HF directory: nothing declared
        return EncoderSetup(pooling=overrides.pooling or "mean", query_prompt=overrides.query_prompt or "",
                            document_prompt=overrides.document_prompt or "")
    where = model_dir / MODULES_FILE
    kinds = [kind for kind, _ in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or any(k not in ("Dense", "Normalize") for k in kinds[2:]):
        raise ModelNotFound(f"{where}: modules {kinds}; tandem reads a Transformer, then Pooling, then Dense and "
                            "Normalize layers")
    transformer = modules[0][1]
    pooling_config = model_dir / modules[1][1] / "config.json"
    pooling, include_prompt = _pooling(read_json(pooling_config), pooling_config)
    if overrides.pooling is not None and overrides.pooling != pooling:
        raise InputError(f"--pooling {overrides.pooling}: {pooling_config} says {pooling}; a sentence-transformers "
                         "directory keeps its own pooling (edit that file to change it)")
    head: list[HeadLayer] = [
        _dense(model_dir, folder, sha256) if kind == "Dense" else NormalizeLayer() for kind, folder in modules[2:]
    ]
    query_prompt, document_prompt, truncate_dim = _prompts(model_dir)
    st_config = read_json(model_dir / transformer / TRANSFORMER_CONFIG_FILE)
    return EncoderSetup(
        transformer=transformer, pooling=pooling, include_prompt=include_prompt,
        query_prompt=query_prompt if overrides.query_prompt is None else overrides.query_prompt,
        document_prompt=document_prompt if overrides.document_prompt is None else overrides.document_prompt,
        head=head, lowercase=bool(st_config.get("do_lower_case", False)), truncate_dim=truncate_dim,
    )


def declared_max_length(hf_dir: Path, positions: int) -> int:
    """The longest input, as sentence-transformers takes it: sentence_bert_config.json's max_seq_length, else the
    tokenizer's model_max_length; either only within the model's positions. Else min(positions − 2, 512)."""
    fallback = min(positions - 2, 512)
    for value in (read_json(hf_dir / TRANSFORMER_CONFIG_FILE).get("max_seq_length"),
                  read_json(hf_dir / "tokenizer_config.json").get("model_max_length")):
        if isinstance(value, int) and 0 < value <= positions:
            return value
    return fallback
