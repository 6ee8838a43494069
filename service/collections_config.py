"""What collections a service serves: `--collection NAME=INDEX,STUDENT` flags, or a TOML config file (`--config`).

```toml
[[collection]]
name = "docs"
index = "/srv/bundles/docs"       # a bundle, or a bundle root (its CURRENT version, watched)
student = "/srv/students/quick"   # relative paths are relative to this file
```

Read and validated here (pydantic), before anything loads: a bad flag or file is an InputError naming the flag or
the file and line, so `tandem serve` refuses to start. The runtime side (a loader and a reloader per collection) is
service.core.collections.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.errors import InputError
from service.http.keyfile import read_toml
from service.settings import DEFAULT, CollectionSpec, check_unique

_HEADER = re.compile(r"^\s*\[\[\s*collection\s*\]\]")


class CollectionsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    collection: list[CollectionSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> CollectionsFile:
        check_unique(self.collection)
        return self


def parse_flag(flag: str) -> CollectionSpec:
    """`NAME=INDEX,STUDENT` → a CollectionSpec, or InputError naming the flag."""
    name, eq, rest = flag.partition("=")
    index, comma, student = rest.rpartition(",")
    if not eq or not comma or not index or not student:
        raise InputError(f"--collection {flag!r}: expected NAME=INDEX,STUDENT")
    try:
        return CollectionSpec(name=name.strip(), index=Path(index.strip()), student=Path(student.strip()))
    except ValidationError as exc:
        raise InputError(f"--collection {flag!r}: {exc.errors(include_url=False)[0]['msg']}") from None


def read_config(path: Path) -> list[CollectionSpec]:
    """The collections of a TOML config file, paths resolved against its directory; InputError naming the line."""
    text, raw = read_toml(path, "--config")
    try:
        specs = CollectionsFile.model_validate(raw).collection
    except ValidationError as exc:
        err = exc.errors(include_url=False, include_input=False)[0]
        loc = list(err["loc"])
        headers = [n for n, line in enumerate(text.splitlines(), 1) if _HEADER.match(line)]
        where = ""
        if len(loc) >= 2 and loc[0] == "collection" and isinstance(loc[1], int) and loc[1] < len(headers):
            where = f"line {headers[loc[1]]}: collection #{loc[1] + 1}: "
            loc = loc[2:]
        field = ".".join(str(p) for p in loc)
        raise InputError(f"--config: {path}: {where}{field + ': ' if field else ''}{err['msg']}") from None
    base = Path(path).parent
    return [s.model_copy(update={"index": base / s.index, "student": base / s.student}) for s in specs]


def collection_settings(index: Path | None, student: Path | None, flags: list[str],
                        config: Path | None) -> dict[str, object]:
    """ServiceSettings' index, student and collections from `tandem serve`'s options: `--index/--student` alone
    serve one collection, 'default', as before collections; with `--collection` or `--config` they add 'default' to
    those. index and student are then the default collection's, or the first one's (what /admin/reload confines
    paths by, when no default is served)."""
    if (index is None) != (student is None):
        raise InputError("--index and --student go together (or declare collections with --collection/--config)")
    from_file = read_config(config) if config is not None else []
    specs = [parse_flag(flag) for flag in flags] + from_file
    if not specs:
        if index is None or student is None:
            raise InputError("nothing to serve: give --index and --student, or --collection NAME=INDEX,STUDENT, "
                             "or --config FILE")
        return {"index": index, "student": student}
    if index is not None and student is not None:
        specs.insert(0, CollectionSpec(name=DEFAULT, index=index, student=student))
    try:
        check_unique(specs)
    except ValueError as exc:
        raise InputError(f"--collection: {exc}") from None
    first = specs[0]
    out: dict[str, object] = {"index": first.index, "student": first.student, "collections": tuple(specs)}
    if config is not None:
        out["collections_config"] = config  # re-read on SIGHUP and change (service.core.collections_reload)
        out["config_collections"] = tuple(spec.name for spec in from_file)
    return out
