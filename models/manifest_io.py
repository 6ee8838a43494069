"""Reading a manifest (a bundle's or a student's): every failure one readable error naming the file.

Both floors that own a manifest (models.bundle, models.encoders) read theirs through this one reader, so a broken
or foreign file reads the same whichever it is.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from models.errors import ContractMismatch

M = TypeVar("M", bound=BaseModel)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def read_manifest(path: Path, model: type[M], what: str) -> M:
    """Parse a manifest whose model declares its `format_version` default: the only version it reads."""
    if not path.is_file():
        raise ContractMismatch(f"{path.parent} is not a {what}: {path.name} is missing")
    try:
        parsed = model.model_validate_json(path.read_text())
    except ValidationError as exc:  # field and message only: no input echoed, no URL
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'manifest'}: {e['msg']}"
                             for e in exc.errors(include_url=False, include_input=False)[:5])
        raise ContractMismatch(f"{path}: invalid {what} manifest: {problems}") from exc
    except ValueError as exc:
        raise ContractMismatch(f"{path}: invalid {what} manifest: {exc}") from exc
    version = getattr(parsed, "format_version", None)
    expected = model.model_fields["format_version"].default
    if version != expected:
        raise ContractMismatch(f"{path}: {what} format {version} is not supported (expected {expected})")
    return parsed
