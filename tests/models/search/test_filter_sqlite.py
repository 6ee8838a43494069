"""A filter the parser accepts never meets one of SQLite's limits in the docstore's SQL (an unindexed key's path, and
a bundle without a payload index): wide `in` lists, wide and deep `and`/`or`, long values, every parameter bound.
The docstore's scan connection is tightened to a fifth of SQLite's expression depth (1,000) and to its default
variable count (32,766), so a margin is tested, not luck. Each answer is checked against `Filter.matches`, the
semantics in Python. A real SQLite docstore, no model."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.bundle.storage.docstore import DocStore, write_docstore
from models.corpus import Document
from models.search.filters import (
    MAX_IN_VALUES,
    MAX_NODES,
    MAX_SQL_LEVELS,
    MAX_VALUES,
    FilterLimits,
    parse_filter,
    sql_levels,
)
from models.search.query import docstore_mask
from service.settings import MAX_FILTER_CONDITIONS, MAX_FILTER_DEPTH

ROWS = 300
LONG = "x" * 200_000  # a stored and asked value far past any SQL-text or LIKE-pattern length SQLite could take inline


def _meta(i: int) -> dict[str, Any]:
    """`code` holds numbers, strings and booleans across rows: a key no payload index types, so SQL answers it."""
    code: Any = i if i % 3 == 0 else str(i) if i % 3 == 1 else i % 2 == 0
    meta: dict[str, Any] = {"code": code, "n": i, "half": i / 2}
    if i == 7:
        meta["code"] = LONG
    return meta


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> DocStore:
    path = Path(tmp_path_factory.mktemp("sqlite-limits")) / "docs.sqlite"
    write_docstore(path, (Document(id=f"d{i}", title="", text="", metadata=json.dumps(_meta(i)))
                          for i in range(ROWS)))
    docs = DocStore(path)
    docs.rows_where("1", [])  # opens the scan connection, then tighten it
    assert docs._scan_con is not None
    docs._scan_con.setlimit(sqlite3.SQLITE_LIMIT_EXPR_DEPTH, 200)
    docs._scan_con.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766)
    return docs


FIELDS = frozenset({"code", "n", "half"})
WIDE = FilterLimits(depth=MAX_FILTER_DEPTH, nodes=MAX_FILTER_CONDITIONS, values=MAX_FILTER_CONDITIONS * 4)


def _check(store: DocStore, obj: object, limits: FilterLimits | None = None, scans: int | None = 1) -> np.ndarray:
    """The rows the docstore's SQL finds, checked against Python's semantics (and its scans, when given)."""
    flt = parse_filter(obj, FIELDS, limits)
    before = store.scans
    found = np.flatnonzero(docstore_mask(store, flt.tree, ROWS))
    assert found.tolist() == [i for i in range(ROWS) if flt.matches(_meta(i))]
    if scans is not None:
        assert store.scans - before == scans
    return found


def _nest(leaf: dict[str, Any], depth: int) -> dict[str, Any]:
    """`leaf` under `depth` levels of and/or/not in turn, each and/or with a second branch."""
    out = leaf
    for level in range(depth):
        kind = ("and", "or", "not")[level % 3]
        out = {"not": out} if kind == "not" else {kind: [out, {"field": "n", "gte": level}]}
    return out


def test_a_full_in_list_of_mixed_kinds_answers(store: DocStore) -> None:
    values: list[Any] = [*range(0, 2 * MAX_IN_VALUES, 6), *(str(i) for i in range(1, 1200, 3)), True, False]
    values = values[:MAX_IN_VALUES]
    assert len(_check(store, {"field": "code", "in": values})) > 0
    assert len(_check(store, {"field": "code", "in": [str(i) for i in range(MAX_IN_VALUES)]})) == ROWS // 3 - 1
    _check(store, {"field": "half", "in": [i / 2 for i in range(MAX_IN_VALUES)]})  # reals: 1.0 matches 1 too


def test_every_value_a_filter_may_hold_at_once(store: DocStore) -> None:
    lists = [{"field": "code", "in": list(range(j, j + MAX_IN_VALUES))} for j in range(0, MAX_VALUES, MAX_IN_VALUES)]
    _check(store, {"or": lists})
    _check(store, {"not": {"and": [{"not": x} for x in lists]}})


def test_the_widest_and_or_a_setting_allows(store: DocStore) -> None:
    wide = [{"field": "code", "eq": i} for i in range(MAX_FILTER_CONDITIONS - 1)]
    _check(store, {"or": wide}, WIDE)
    sql, params = parse_filter({"or": wide}, FIELDS, WIDE).sql()
    assert sql.count("json_extract(") == 1 and len(params) == len(wide) + 1  # the key read once a row, values once
    ranges = [{"field": "n", "gte": i, "lte": i + 1, "lt": 9_000, "gt": -1} for i in range(MAX_FILTER_CONDITIONS - 1)]
    _check(store, {"or": ranges}, WIDE)  # 9 parameters a condition: 27k, under SQLite's default 32,766
    _check(store, {"and": [{"not": {"field": "code", "eq": str(i)}} for i in range(MAX_FILTER_CONDITIONS // 2 - 1)]},
           WIDE)
    _check(store, {"or": [{"field": "code", "eq": i} for i in range(MAX_NODES - 1)]})


def test_the_deepest_filter_a_setting_allows(store: DocStore) -> None:
    """Nested past what SQLite's parser takes in one query: split into a few shallow ones, the same rows."""
    deep = _nest({"field": "code", "in": [*range(500), *map(str, range(500)), True]}, MAX_FILTER_DEPTH)
    assert sql_levels(parse_filter(deep, FIELDS, WIDE).tree) > MAX_SQL_LEVELS
    _check(store, deep, WIDE, scans=None)
    assert store.scans <= 2 * MAX_FILTER_DEPTH
    _check(store, _nest({"field": "code", "in": [1, "2", False]}, MAX_SQL_LEVELS - 2))  # one query, at the bound


def test_long_values_are_bound(store: DocStore) -> None:
    assert _check(store, {"field": "code", "eq": LONG}).tolist() == [7]
    assert _check(store, {"field": "code", "in": [LONG, LONG + "y", 3]}).tolist() == [3, 7]


_leaf = st.one_of(
    st.builds(lambda v: {"field": "code", "eq": v}, st.one_of(st.integers(0, ROWS), st.booleans(),
                                                              st.integers(0, ROWS).map(str))),
    st.builds(lambda vs: {"field": "code", "in": vs},
              st.lists(st.one_of(st.integers(0, 4 * ROWS), st.integers(0, ROWS).map(str), st.booleans()),
                       min_size=1, max_size=MAX_IN_VALUES)),
    st.builds(lambda lo: {"field": "n", "gte": lo}, st.integers(0, ROWS)),
    st.builds(lambda b: {"field": "code", "exists": b}, st.booleans()),
)
_tree = st.recursive(_leaf, lambda inner: st.one_of(
    st.builds(lambda xs: {"and": xs}, st.lists(inner, min_size=1, max_size=40)),
    st.builds(lambda xs: {"or": xs}, st.lists(inner, min_size=1, max_size=40)),
    st.builds(lambda x: {"not": x}, inner),
), max_leaves=200)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(obj=_tree)
def test_wide_and_deep_filters_on_an_unindexed_key_answer_as_python(store: DocStore, obj: dict[str, Any]) -> None:
    limits = FilterLimits(depth=MAX_FILTER_DEPTH, nodes=MAX_FILTER_CONDITIONS, values=MAX_FILTER_CONDITIONS * 8)
    _check(store, obj, limits, scans=None)
