"""Typed payload fields: the schema a bundle's payload index is built to, declared or inferred.

A field is a metadata key with one type (docs/decisions.md#a-payload-index-of-sorted-columns):

- `keyword`: a string; eq/in compare it exactly, ranges compare it as written (like the JSON path);
- `keyword-list`: a list of strings (a lone string counts as a list of one), matching when any element
  does, as Qdrant's arrays do;
- `integer`, `float`: numbers (a whole float such as 3.0 is an integer, as JSON does not tell them apart);
- `boolean`: true or false;
- `datetime`: an ISO 8601 string, compared as the instant it names (a bare date is midnight, a time
  without an offset is UTC).

`tandem index build --field NAME:TYPE` declares a field: a value of another type is then an error naming
the corpus file and line. Every other key is inferred from the values it holds (`infer`): one JSON type
gives that type (integers and floats together give float, strings and lists of strings keyword-list);
strings stay keywords even when they look like dates, so an inferred field filters exactly as the JSON
path did; a key whose values have no single type is left unindexed, and filters on it read the docstore.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from models.errors import InputError

PAYLOAD_SUBDIRECTORY = "payload"  # the payload index's columns (models.bundle.payload.writer writes them)

_INT64 = (-(2**63), 2**63 - 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class FieldType(StrEnum):
    KEYWORD = "keyword"
    KEYWORD_LIST = "keyword-list"
    INTEGER = "integer"
    FLOAT = "float"
    BOOLEAN = "boolean"
    DATETIME = "datetime"


class PayloadField(BaseModel):
    """One indexed field; its files are payload/<its position in the list>.<part>.npy."""

    model_config = ConfigDict(extra="forbid")

    name: str
    type: FieldType
    declared: bool = Field(default=False, description="declared with --field (a value of another type is an error); "
                           "else inferred from the corpus")
    documents: int = Field(default=0, description="documents with a value (not null)")
    values: int = Field(default=0, description="distinct values")
    ranks: bool = Field(default=False, description="a `ranks` array gives each row's position in `rows` (absent in "
                        "bundles written before it, and for keyword lists, whose rows repeat)")

    @property
    def origin(self) -> str:
        """How the field got its type, as errors say it."""
        return "declared" if self.declared else "inferred (at the bundle's build) as"


class PayloadInfo(BaseModel):
    """The payload index: typed fields stored as memory-mapped columns under payload/ (absent in older bundles,
    which filter through the docstore's SQL)."""

    model_config = ConfigDict(extra="forbid")

    fields: list[PayloadField] = Field(default_factory=list)
    unindexed: list[str] = Field(default_factory=list, description="metadata keys whose values have no single "
                                 "type: filters on them read the docstore")

    def types(self) -> dict[str, FieldType]:
        return {f.name: f.type for f in self.fields}

    def declared(self) -> dict[str, FieldType]:
        return {f.name: f.type for f in self.fields if f.declared}


def parse_field_option(option: str) -> tuple[str, FieldType]:
    """`NAME:TYPE` (the last colon splits, so a name may hold colons) → (name, type), or an InputError."""
    name, sep, kind = option.rpartition(":")
    choices = ", ".join(t.value for t in FieldType)
    if not sep or not name:
        raise InputError(f"--field {option!r}: expected NAME:TYPE, TYPE one of {choices}")
    try:
        return name, FieldType(kind)
    except ValueError:
        raise InputError(f"--field {option!r}: unknown type {kind!r}; choose one of {choices}") from None


def declared_fields(options: Iterable[str]) -> list[PayloadField]:
    """Every `--field` option as a declared field, each name once."""
    out: dict[str, PayloadField] = {}
    for option in options:
        name, kind = parse_field_option(option)
        if name in out:
            raise InputError(f"--field {name!r} is given twice")
        out[name] = PayloadField(name=name, type=kind, declared=True)
    return list(out.values())


def to_micros(text: str) -> int | None:
    """An ISO 8601 date or datetime as microseconds since the epoch (UTC; naive times are UTC), or None."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // _MICROSECOND


def _whole(value: float) -> int | None:
    if not math.isfinite(value) or not value.is_integer():
        return None
    return int(value) if _INT64[0] <= value <= _INT64[1] else None


def typed(kind: FieldType, value: object) -> object:
    """`value` (not None) as a column of `kind` stores it (int, float, bool, str, a list of str, or µs since the
    epoch); raises ValueError saying what was expected when it has another type."""
    if kind is FieldType.KEYWORD and isinstance(value, str):
        return value
    if kind is FieldType.KEYWORD_LIST:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    if kind is FieldType.BOOLEAN and isinstance(value, bool):
        return value
    if kind in (FieldType.INTEGER, FieldType.FLOAT) and isinstance(value, int | float) and not isinstance(value, bool):
        if kind is FieldType.FLOAT:
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError("expected a finite number")
            return float(value)
        whole = value if isinstance(value, int) else _whole(value)
        if whole is not None and _INT64[0] <= whole <= _INT64[1]:
            return whole
        raise ValueError("expected a whole number within 64 bits")
    if kind is FieldType.DATETIME and isinstance(value, str) and (micros := to_micros(value)) is not None:
        return micros
    raise ValueError(f"expected {_EXPECTED[kind]}")


_EXPECTED = {
    FieldType.KEYWORD: "a string",
    FieldType.KEYWORD_LIST: "a list of strings (or one string)",
    FieldType.INTEGER: "a whole number",
    FieldType.FLOAT: "a number",
    FieldType.BOOLEAN: "true or false",
    FieldType.DATETIME: "an ISO 8601 date or datetime string",
}


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_metadata(meta: Mapping[str, object], fields: Sequence[PayloadField], where: str) -> None:
    """Raise an InputError naming `where` (file:line) when a value of `meta` does not fit its field's type."""
    for field in fields:
        value = meta.get(field.name)
        if value is None:
            continue
        try:
            typed(field.type, value)
        except ValueError as exc:
            raise InputError(f"{where}: field {field.name!r} is {field.origin} {field.type.value}: {exc}, got "
                             f"{_shown(value)}") from None


# The JSON kinds inference tells apart.
_KINDS = ("boolean", "integer", "float", "string", "string list", "other")


def json_kind(value: object) -> str:
    """The kind `infer` counts a (non-null) value as."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer" if _INT64[0] <= value <= _INT64[1] else "other"
    if isinstance(value, float):
        return "float" if math.isfinite(value) else "other"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "string list"
    return "other"


class Tally:
    """The JSON kinds each metadata key holds over a corpus, and whether its strings all read as dates."""

    def __init__(self) -> None:
        self.kinds: dict[str, Counter[str]] = {}
        self.dates: dict[str, bool] = {}

    def add(self, meta: Mapping[str, object]) -> None:
        for name, value in meta.items():
            if value is None:
                continue
            kind = json_kind(value)
            self.kinds.setdefault(name, Counter())[kind] += 1
            if kind == "string":
                self.dates[name] = self.dates.get(name, True) and to_micros(str(value)) is not None


def infer(tally: Tally, name: str) -> FieldType | None:
    """The type of an undeclared key from the kinds its values have; None when they have no single type."""
    kinds = set(tally.kinds.get(name, ()))
    if kinds == {"boolean"}:
        return FieldType.BOOLEAN
    if kinds == {"integer"}:
        return FieldType.INTEGER
    if kinds and kinds <= {"integer", "float"}:
        return FieldType.FLOAT
    if kinds == {"string"}:
        return FieldType.KEYWORD
    if kinds and kinds <= {"string", "string list"}:
        return FieldType.KEYWORD_LIST
    return None


def describe_kinds(counts: Counter[str]) -> str:
    return ", ".join(f"{kind} in {counts[kind]:,}" for kind in _KINDS if counts.get(kind))


def schema_lines(info: PayloadInfo) -> list[str]:
    """The payload schema for people: one line per field, then the keys left unindexed."""
    lines = [f"field {f.name}: {f.type.value} ({'declared' if f.declared else 'inferred'}), {f.documents:,} documents, "
             f"{f.values:,} distinct values" for f in info.fields]
    if info.unindexed:
        lines.append(f"not indexed (values of several types; filters on them read the docstore): "
                     f"{', '.join(info.unindexed)}")
    return lines
