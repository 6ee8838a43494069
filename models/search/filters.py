"""Metadata filters: parsed from request JSON, checked against the bundle's fields, compiled to SQL.

A filter is a condition or a combination of them:

    {"field": "year", "eq": 2020}                 equality (string, number or boolean)
    {"field": "tag", "in": ["a", "b"]}            one of
    {"field": "year", "gte": 2018, "lt": 2021}    numeric range (gt, gte, lt, lte)
    {"field": "date", "gte": "2020-01-01"}        date range: ISO 8601 strings, compared as written
    {"field": "doi", "exists": true}              present and not null
    {"and": [...]}, {"or": [...]}, {"not": {...}}

A bundle with a payload index evaluates the tree on its typed columns (models.bundle.payload.index), where a
keyword-list field matches when any element does and a datetime field compares instants; older bundles,
and keys the index leaves out, run the SQL here in the docstore (SQLite's JSON functions over the metadata
column), so choosing the matching rows never loads documents. `Filter.matches` is the same semantics in
Python, typed fields included: tests check the others against it.

A filter is bounded before any work (`FilterLimits`): its depth, its conditions, the values of one `in` list and
of the whole filter; an `in` list's values are deduplicated as it is parsed. A value SQLite or the payload index
could not hold (a non-finite number, an integer past 64 bits, a string that is not valid Unicode) is refused
with its path. The SQL is compiled only where a segment needs it (`Filter.sql`), on the worker that searches.

The SQL never meets one of SQLite's limits, whatever the filter within those bounds: an `in` list is one bound JSON
array per kind of value, read by `json_each` (a constant number of terms and parameters, however long the list),
and the items of an `and`/`or` are joined as a balanced tree, so the expression's depth grows with the logarithm of
their count (SQLite refuses an expression deeper than SQLITE_MAX_EXPR_DEPTH, 1,000: a 1,000-value list written as
ORs did). Values are bound, never written into the SQL text, and no LIKE is used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from functools import cached_property
from typing import Any

from models.bundle.payload.fields import FieldType, to_micros

_RANGE = ("gt", "gte", "lt", "lte")
_SQL_OP = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
MAX_NODES = 256  # conditions and combinators in one filter
MAX_DEPTH = 16
MAX_IN_VALUES = 1024  # values of one `in` list
MAX_VALUES = 4096  # values of a whole filter (each eq one, each in its list's length)


@dataclass(frozen=True)
class FilterLimits:
    """How large a filter may be, checked while it is parsed (the service takes them from its settings)."""

    depth: int = MAX_DEPTH
    nodes: int = MAX_NODES
    in_values: int = MAX_IN_VALUES
    values: int = MAX_VALUES


class FilterError(ValueError):
    """A malformed filter, or one naming an unknown field; `path` locates it inside the filter."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.path, self.message = path, message


Scalar = str | int | float | bool


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_date(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        (datetime if "T" in value or " " in value else date).fromisoformat(value)
    except ValueError:
        return False
    return True


_INT64 = (-(2**63), 2**63 - 1)


def valid_text(value: str) -> bool:
    """Whether a string is valid Unicode: JSON's escapes can spell a lone surrogate, which neither UTF-8 (SQLite,
    the payload dictionaries) nor an answer can hold."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_kind(value: object) -> str:
    """The kind a value has in JSON, as SQLite's json_type names it (integer and real are both 'number');
    'other' for what a filter cannot hold (an integer SQLite cannot bind, a non-finite number, a string that is
    not valid Unicode, a list)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        return "other"
    if isinstance(value, float) and not math.isfinite(value):
        return "other"
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "text" if valid_text(value) else "other"
    return "other"


def tagged(value: object) -> object:
    """`value` with every scalar in it paired with its type: a key under which `True`, `1`, `1.0` and `"1"` are four
    different things. Python's `True == 1 == 1.0` (with equal hashes) would otherwise make two filters that answer
    differently (`{"eq": true}` on a boolean field matches its true rows, `{"eq": 1}` none) one dict key, and the
    requests that carry them one batch with one answer (issue 55). Sequences are tagged element by element."""
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(tagged(v) for v in value))
    return (type(value).__name__, value)


@dataclass(frozen=True, eq=False)
class Filter:
    """A checked filter in its canonical form, hashable: the batcher groups requests by it.

    Two filters are equal when their trees are equal value for value *and type for type* (`tagged`): a boolean
    never equals a number, an int never equals a float, a string never equals either. The matching itself treats an
    int and a float of the same value alike (both are JSON numbers: `_same`, the payload's `typed`, SQLite's
    comparison), but equal filters must give equal answers on every path, so a key that merges them would rest on
    every evaluator agreeing for every number; keeping them apart costs at most a shared search."""

    tree: tuple[Any, ...]

    @cached_property
    def key(self) -> object:
        """The type-tagged tree: what equality and hashing compare (built once per filter)."""
        return tagged(self.tree)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Filter) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def sql(self) -> tuple[str, list[Any]]:
        """Its SQL over the docstore's `metadata` column and the parameters: compiled on demand, for a segment
        without a payload index (older bundles)."""
        return sql_of(self.tree)

    def matches(self, metadata: dict[str, Any], types: Mapping[str, FieldType] | None = None) -> bool:
        """Whether one document's metadata passes; `types`: the bundle's payload fields (lists and datetimes)."""
        return _match(self.tree, metadata, types or {})


def parse_filter(obj: object, fields: set[str] | frozenset[str], limits: FilterLimits | None = None) -> Filter:
    """Check `obj` against the grammar, the known `fields` and the `limits`; raise FilterError naming the problem."""
    return Filter(tree=_Parser(fields, limits or FilterLimits()).parse(obj, (), 0))


class _Parser:
    """One filter's parse: the fields it may name, its limits, and what it has used of them so far."""

    def __init__(self, fields: set[str] | frozenset[str], limits: FilterLimits) -> None:
        self.fields, self.limits = fields, limits
        self.nodes = self.values = 0

    def parse(self, obj: object, path: tuple[str | int, ...], depth: int) -> tuple[Any, ...]:
        self.nodes += 1
        if self.nodes > self.limits.nodes or depth > self.limits.depth:
            raise FilterError(path, f"filter is too large (at most {self.limits.nodes} conditions, "
                              f"{self.limits.depth} levels deep)")
        if not isinstance(obj, dict):
            raise FilterError(path, "a filter must be a JSON object")
        logic = [k for k in ("and", "or", "not") if k in obj]
        if not logic:
            return self.count(_condition(obj, path, self.fields, self.limits), path)
        if len(obj) != 1:
            raise FilterError(path, f"'{logic[0]}' must be the only key of its object")
        key = logic[0]
        if key == "not":
            return ("not", self.parse(obj["not"], (*path, "not"), depth + 1))
        items = obj[key]
        if not isinstance(items, list) or not items:
            raise FilterError((*path, key), f"'{key}' takes a non-empty list of filters")
        if self.nodes + len(items) > self.limits.nodes:  # refused before any item is looked at
            raise FilterError((*path, key), f"filter is too large (at most {self.limits.nodes} conditions)")
        return (key, tuple(self.parse(x, (*path, key, i), depth + 1) for i, x in enumerate(items)))

    def count(self, leaf: tuple[Any, ...], path: tuple[str | int, ...]) -> tuple[Any, ...]:
        """A condition, once its values fit the filter's total."""
        self.values += len(leaf[2]) if leaf[0] == "in" else 1
        if self.values > self.limits.values:
            raise FilterError(path, f"filter has more than {self.limits.values} values in all")
        return leaf


def _unique(values: list[Any]) -> tuple[Any, ...]:
    """An `in` list's values, each once (in first-seen order): 1 and 1.0 are one value, true and 1 are two."""
    seen: dict[tuple[str, Any], Any] = {}
    for value in values:
        seen.setdefault((_json_kind(value), value), value)
    return tuple(seen.values())


def _condition(obj: dict[str, Any], path: tuple[str | int, ...], fields: set[str] | frozenset[str],
               limits: FilterLimits) -> tuple[Any, ...]:
    name = obj.get("field")
    if not isinstance(name, str):
        raise FilterError((*path, "field"), "a condition needs 'field' (a metadata key), or use and/or/not")
    if name not in fields:
        known = ", ".join(sorted(fields)[:20]) or "none: this bundle has no metadata"
        raise FilterError((*path, "field"), f"unknown field {name!r}; known fields: {known}")
    ops = [k for k in obj if k != "field"]
    unknown = [k for k in ops if k not in ("eq", "in", "exists", *_RANGE)]
    if unknown:
        raise FilterError((*path, unknown[0]), f"unknown operator {unknown[0]!r}; use eq, in, exists, gt, gte, lt "
                          "or lte")
    if not ops:
        raise FilterError(path, f"condition on {name!r} has no operator (eq, in, exists, gt, gte, lt, lte)")
    ranges = [k for k in ops if k in _RANGE]
    if len(ops) != len(ranges) and len(ops) > 1:
        raise FilterError(path, "eq, in and exists each stand alone in a condition; combine conditions with and")
    if "eq" in ops:
        value = obj["eq"]
        if _json_kind(value) == "other":
            raise FilterError((*path, "eq"), "eq takes a string, a finite number or a boolean")
        return ("eq", name, value)
    if "in" in ops:
        values = obj["in"]
        if isinstance(values, list) and len(values) > limits.in_values:  # refused before any value is looked at
            raise FilterError((*path, "in"), f"in takes at most {limits.in_values} values, got {len(values)}")
        if not isinstance(values, list) or not values or any(_json_kind(v) == "other" for v in values):
            raise FilterError((*path, "in"), "in takes a non-empty list of strings, finite numbers or booleans")
        return ("in", name, _unique(values))
    if "exists" in ops:
        if not isinstance(obj["exists"], bool):
            raise FilterError((*path, "exists"), "exists takes true or false")
        return ("exists", name, obj["exists"])
    bounds = {k: obj[k] for k in _RANGE if k in obj}
    kinds = {"number" if _is_number(v) else "date" if _is_date(v) else "bad" for v in bounds.values()}
    for k, v in bounds.items():
        if not ((_is_number(v) and _json_kind(v) == "number") or _is_date(v)):
            raise FilterError((*path, k), f"{k} takes a finite number or an ISO 8601 date, got {v!r}")
    if len(kinds) != 1:
        raise FilterError(path, "range bounds must all be numbers or all be dates")
    return ("range", name, kinds.pop(), tuple(sorted(bounds.items())))


def _json_path(name: str) -> str:
    return '$."' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


# Levels of parentheses (not, and/or halves) one SQL query may nest: SQLite 3.40's parser refuses an expression
# nested past ~30 such levels ("parser stack overflow", YYSTACKDEPTH 100 entries; a leaf takes a few of its own).
MAX_SQL_LEVELS = 16


def sql_levels(tree: tuple[Any, ...]) -> int:
    """How many levels of parentheses the SQL of `tree` nests (models.search.query splits a filter deeper than
    MAX_SQL_LEVELS into queries that are not, combining their rows in numpy)."""
    op = tree[0]
    if op == "not":
        return 1 + sql_levels(tree[1])
    if op in ("and", "or"):
        return math.ceil(math.log2(len(tree[1]))) + max(sql_levels(t) for t in tree[1])
    return 2 if op == "in" else 0  # an in list: up to four terms ORed


def sql_of(tree: tuple[Any, ...]) -> tuple[str, list[Any]]:
    """The SQL over the docstore's metadata column of a filter tree (or of one of its conditions).

    A key that several leaves name is read once per row: the tree is tested in a scalar subquery on columns (its
    JSON type and value) of a subquery SQLite runs as a co-routine. Written leaf by leaf, a 3,000-condition `or`
    on one key parsed a row's whole metadata 3,000 times (a long stored value made that gigabytes). Parameters are
    numbered (?N), each path and each value bound once: SQLite's code generator looks every constant up in a list
    of those it has seen, so preparing a statement grows with the square of its distinct constants."""
    binds = _Binds(_shared_keys(tree))
    where = _sql(tree, binds)
    if not binds.shared:
        return where, binds.values
    columns = ", ".join(f"json_type(metadata, {binds(_json_path(name))}) AS k{i}, "
                        f"json_extract(metadata, {binds(_json_path(name))}) AS v{i}"
                        for name, i in binds.shared.items())
    return f"(SELECT {where} FROM (SELECT {columns}))", binds.values


MAX_SHARED_KEYS = 500  # keys read once per row as columns: two each, under SQLite's 2,000 columns of a result


def _shared_keys(tree: tuple[Any, ...]) -> dict[str, int]:
    """The keys more than one leaf of `tree` names (the first MAX_SHARED_KEYS), numbered."""
    counts: dict[str, int] = {}
    stack = [tree]
    while stack:
        node = stack.pop()
        if node[0] == "not":
            stack.append(node[1])
        elif node[0] in ("and", "or"):
            stack.extend(node[1])
        else:
            counts[node[1]] = counts.get(node[1], 0) + 1
    shared = [name for name, n in counts.items() if n > 1][:MAX_SHARED_KEYS]
    return {name: i for i, name in enumerate(shared)}


class _Binds:
    """One statement's parameters, each distinct value once (by its JSON kind: 1, 1.0 and true stay apart), and
    how a leaf reads a key: the columns of a shared key, json_type and json_extract of another."""

    def __init__(self, shared: dict[str, int]) -> None:
        self.shared = shared
        self.values: list[Any] = []
        self.numbers: dict[object, str] = {}

    def __call__(self, value: Any) -> str:
        key = tagged(value)
        if key not in self.numbers:
            self.values.append(value)
            self.numbers[key] = f"?{len(self.values)}"
        return self.numbers[key]

    def columns(self, name: str) -> tuple[str, str]:
        """The JSON type and the value of metadata key `name`, as SQL."""
        if name in self.shared:
            return f"k{self.shared[name]}", f"v{self.shared[name]}"
        path = self(_json_path(name))
        return f"json_type(metadata, {path})", f"json_extract(metadata, {path})"


def _sql(tree: tuple[Any, ...], binds: _Binds) -> str:
    """Every leaf is COALESCEd to 0 or 1, so NOT of a row without metadata is true, as in Python."""
    op = tree[0]
    if op == "not":
        return f"(NOT {_sql(tree[1], binds)})"
    if op in ("and", "or"):
        return _balanced(op.upper(), [_sql(t, binds) for t in tree[1]])
    kind, value = binds.columns(tree[1])
    if op == "exists":
        present = f"COALESCE({kind} NOT IN ('null'), 0)"
        return present if tree[2] else f"(NOT {present})"
    if op == "eq":
        return _eq_sql(kind, value, tree[2], binds)
    if op == "in":
        return _in_sql(kind, value, tree[2], binds)
    types = "('integer', 'real')" if tree[2] == "number" else "('text')"
    clauses = " AND ".join(f"{value} {_SQL_OP[k]} {binds(v)}" for k, v in tree[3])
    return f"COALESCE({kind} IN {types} AND {clauses}, 0)"


def _balanced(op: str, parts: Sequence[str]) -> str:
    """`parts` joined by AND or OR as a balanced tree: "a OR b OR c ..." parses as a chain as deep as it is long,
    and SQLite refuses an expression deeper than 1,000; halves keep the depth at log2 of the count."""
    if len(parts) == 1:
        return parts[0]
    return f"({_balanced(op, parts[: len(parts) // 2])} {op} {_balanced(op, parts[len(parts) // 2 :])})"


def _in_sql(kind: str, value: str, values: Sequence[Scalar], binds: _Binds) -> str:
    """One of `values`, however many: the numbers and the strings each as one JSON array bound as a parameter and
    read by SQLite's json_each (a list's length changes neither the SQL nor its parameters' count); true and false
    are one `eq` each. A number matches a stored number (1 and 1.0 alike), a string a stored string, as `eq`."""
    numbers = [v for v in values if _is_number(v)]
    texts = [v for v in values if isinstance(v, str)]
    parts = [_eq_sql(kind, value, v, binds) for v in values if isinstance(v, bool)]
    for kinds, group in (("('integer', 'real')", numbers), ("('text')", texts)):
        if group:
            parts.append(f"COALESCE({kind} IN {kinds} AND {value} IN (SELECT value FROM json_each("
                         f"{binds(json.dumps(group))})), 0)")
    return _balanced("OR", parts)


def _eq_sql(kind: str, value: str, wanted: Scalar, binds: _Binds) -> str:
    if isinstance(wanted, bool):
        return f"COALESCE({kind} = {binds('true' if wanted else 'false')}, 0)"
    if _is_number(wanted):
        return f"COALESCE({kind} IN ('integer', 'real') AND {value} = {binds(wanted)}, 0)"
    return f"COALESCE({kind} = 'text' AND {value} = {binds(wanted)}, 0)"


def _same(stored: object, value: Scalar) -> bool:
    """Equal and of one JSON kind (1 is not true). Python's `==` first: it rules out most pairs of an `in` list or
    a wide `or` for less than the two kinds cost."""
    return stored == value and _json_kind(stored) == _json_kind(value)


def _match(tree: tuple[Any, ...], meta: dict[str, Any], types: Mapping[str, FieldType]) -> bool:
    op = tree[0]
    if op == "not":
        return not _match(tree[1], meta, types)
    if op == "and":
        return all(_match(t, meta, types) for t in tree[1])
    if op == "or":
        return any(_match(t, meta, types) for t in tree[1])
    stored = meta.get(tree[1])
    if op == "exists":
        return (stored is not None) == tree[2]
    kind = types.get(tree[1])
    if kind is FieldType.KEYWORD_LIST and stored is not None:  # any element (a lone string is a list of one)
        return any(_leaf(tree, element) for element in (stored if isinstance(stored, list) else [stored]))
    if kind is FieldType.DATETIME:
        return _instant_leaf(tree, stored)
    return _leaf(tree, stored)


def _leaf(tree: tuple[Any, ...], stored: object) -> bool:
    op = tree[0]
    if op == "eq":
        return _same(stored, tree[2])
    if op == "in":
        return any(_same(stored, v) for v in tree[2])
    kind, bounds = tree[2], tree[3]
    if (kind == "number" and not _is_number(stored)) or (kind == "date" and not isinstance(stored, str)):
        return False
    return all(_CHECKS[k](stored, v) for k, v in bounds)


_CHECKS = {"gt": lambda a, b: a > b, "gte": lambda a, b: a >= b, "lt": lambda a, b: a < b, "lte": lambda a, b: a <= b}


def _instant_leaf(tree: tuple[Any, ...], stored: object) -> bool:
    """A condition on a datetime field: ISO strings compared as the instants they name."""
    at = to_micros(stored) if isinstance(stored, str) else None
    if at is None:
        return False
    op = tree[0]
    if op in ("eq", "in"):
        values = [tree[2]] if op == "eq" else tree[2]
        return any(isinstance(v, str) and to_micros(v) == at for v in values)
    if tree[2] != "date":
        return False
    bounds = [(k, to_micros(v)) for k, v in tree[3]]
    return all(v is not None and _CHECKS[k](at, v) for k, v in bounds)
