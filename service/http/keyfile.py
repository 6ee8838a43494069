"""The scoped key file (TANDEM_KEYS_FILE): one `[[key]]` table per key, read and validated, nothing else.

```toml
[[key]]
id = "acme-search"                  # named in logs and errors; never the key itself
sha256 = "9f86d081884c7d65..."      # the key's sha256 (hex), or `key = "..."` in clear
collections = ["docs"]              # the collections it may see, or ["*"]
filter = {field = "tenant", eq = "acme"}   # optional: ANDed into every search it makes
embeddings = false                  # may it call /v1/embeddings (default false)
```

A file that does not parse, or a table that does not validate, is an InputError naming the file and the line (tomllib
gives it for syntax errors; for a schema error, the line of the offending `[[key]]` header), so `tandem serve`
refuses to start and a reload keeps the keys it had. A key's filter is checked (grammar and fields) against each
collection it may see by service.http.keyring, which knows their fields.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from models.errors import InputError

KEY_CHARS = re.compile(r"^[\x21-\x7e]{1,512}$")  # visible ASCII, as a header value can carry it
_HEX = re.compile(r"^[0-9a-f]{64}$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")
_HEADER = re.compile(r"^\s*\[\[\s*key\s*\]\]")
ALL = "*"


class KeyEntry(BaseModel):
    """One `[[key]]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Names the key in logs and errors (never the key itself).")
    key: str | None = Field(None, description="The key in clear; prefer `sha256`.")
    sha256: str | None = Field(None, description="The key's sha256, 64 lowercase hex digits.")
    collections: list[str] = Field(min_length=1, description='Collection names it may see, or ["*"].')
    filter: dict[str, Any] | None = Field(None, description="ANDed into every search the key makes.")
    embeddings: bool = Field(False, description="Whether it may call /v1/embeddings.")

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError("id: 1 to 128 letters, digits or _.:@- (starting with a letter or digit)")
        return value

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        if value is not None and not KEY_CHARS.match(value):
            raise ValueError("key has spaces, control or non-ASCII characters (or is over 512)")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha(cls, value: str | None) -> str | None:
        if value is not None and not _HEX.match(value.lower()):
            raise ValueError("sha256 must be 64 hex digits (the sha256 of the key)")
        return None if value is None else value.lower()

    @model_validator(mode="after")
    def _one_secret(self) -> KeyEntry:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of `key` and `sha256`")
        if ALL in self.collections and len(self.collections) > 1:
            raise ValueError('collections: "*" stands alone')
        return self

    def digest(self) -> bytes:
        return bytes.fromhex(self.sha256) if self.sha256 is not None else _sha256(self.key or "")


class KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: list[KeyEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> KeyFile:
        ids = [k.id for k in self.key]
        dup = next((i for i in ids if ids.count(i) > 1), None)
        if dup is not None:
            raise ValueError(f"key id {dup!r} appears twice")
        digests = [k.digest() for k in self.key]
        if len(set(digests)) != len(digests):
            raise ValueError("two keys are the same key")
        return self


def toml_error(exc: tomllib.TOMLDecodeError, text: str) -> str:
    """tomllib's message, naming the last line where it says only "end of document"."""
    message = str(exc)
    if "end of document" in message:
        message += f" (line {max(len(text.splitlines()), 1)})"
    return message


def _sha256(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def read_toml(path: Path, what: str) -> tuple[str, dict[str, Any]]:
    """The text of TOML file `path` and what it holds, or InputError naming `what` (the setting), the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{what}: cannot read {path}: {exc}") from exc
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # "(at line L, column C)", or "(at end of document)"
        raise InputError(f"{what}: {path}: not valid TOML: {toml_error(exc, text)}") from None


def read_key_file(path: Path) -> list[KeyEntry]:
    """The keys of `path`, or InputError naming the file and the line (never a key's value)."""
    text, raw = read_toml(path, "TANDEM_KEYS_FILE")
    try:
        return KeyFile.model_validate(raw).key
    except ValidationError as exc:
        raise InputError(f"TANDEM_KEYS_FILE: {path}: {_describe(exc, text, raw)}") from None


def _describe(exc: ValidationError, text: str, raw: dict[str, Any]) -> str:
    """The first problem, at the line of its `[[key]]` header, naming the key's index and id."""
    headers = [n for n, line in enumerate(text.splitlines(), 1) if _HEADER.match(line)]
    err = exc.errors(include_url=False, include_input=False)[0]
    loc = list(err["loc"])
    if len(loc) >= 2 and loc[0] == "key" and isinstance(loc[1], int):
        index = loc[1]
        entries = raw.get("key")
        entry = entries[index] if isinstance(entries, list) and index < len(entries) else None
        ident = entry.get("id") if isinstance(entry, dict) else None
        line = f"line {headers[index]}: " if index < len(headers) else ""
        name = f"key #{index + 1}" + (f" (id {ident!r})" if isinstance(ident, str) else "")
        field = ".".join(str(p) for p in loc[2:])
        return f"{line}{name}: {field + ': ' if field else ''}{err['msg']}"
    field = ".".join(str(p) for p in loc) or "file"
    return f"{field}: {err['msg']} (one [[key]] table per key)"
