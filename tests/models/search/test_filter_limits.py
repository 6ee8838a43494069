"""A filter is bounded as it parses (models.search.filters.FilterLimits) and refuses what SQLite or the payload index
could not hold, naming where: no model, no bundle."""

from __future__ import annotations

import json

import pytest

from models.search.filters import MAX_IN_VALUES, MAX_VALUES, FilterError, FilterLimits, parse_filter

FIELDS = frozenset({"year", "tag"})


def _refused(obj: object, limits: FilterLimits | None = None) -> FilterError:
    with pytest.raises(FilterError) as caught:
        parse_filter(obj, FIELDS, limits)
    return caught.value


def test_an_in_list_is_capped_before_its_values_are_read() -> None:
    assert MAX_IN_VALUES == 1024 and MAX_VALUES == 4096  # the documented defaults (docs/http-api.md)
    parse_filter({"field": "year", "in": list(range(MAX_IN_VALUES))}, FIELDS)
    error = _refused({"field": "year", "in": [*range(MAX_IN_VALUES), object()]})  # too many, whatever the values
    assert error.path == ("in",) and "at most 1024 values" in error.message
    assert _refused({"field": "tag", "in": ["a"] * 3}, FilterLimits(in_values=2)).path == ("in",)


def test_a_whole_filter_is_capped_in_values_conditions_and_depth() -> None:
    five = {"or": [{"field": "year", "in": list(range(1000))} for _ in range(5)]}
    error = _refused(five)
    assert error.path == ("or", 4) and "more than 4096 values" in error.message
    assert _refused({"and": [{"field": "year", "eq": 1}] * 3}, FilterLimits(values=2)).path == ("and", 2)
    wide = {"and": [{"field": "year", "eq": i} for i in range(300)]}
    assert _refused(wide).path == ("and",)  # refused before its 300 items are parsed
    deep: dict[str, object] = {"field": "year", "eq": 1}
    for _ in range(17):
        deep = {"not": deep}
    assert "16 levels deep" in _refused(deep).message
    parse_filter(deep, FIELDS, FilterLimits(depth=17))


def test_in_values_are_deduplicated_by_kind_and_value() -> None:
    parsed = parse_filter({"field": "year", "in": [1, 1.0, True, "1", 1, True, 2]}, FIELDS)
    assert parsed.tree == ("in", "year", (1, True, "1", 2))  # 1 and 1.0 are one number; true and "1" are not it


@pytest.mark.parametrize(("text", "path"), [
    ('{"field": "year", "gte": 1e999}', ("gte",)),
    ('{"field": "year", "lt": -Infinity}', ("lt",)),
    ('{"field": "year", "eq": NaN}', ("eq",)),
    ('{"field": "year", "in": [1, NaN]}', ("in",)),
    ('{"field": "year", "eq": 9223372036854775808}', ("eq",)),
    ('{"field": "tag", "eq": "\\ud800"}', ("eq",)),
    ('{"and": [{"field": "tag", "in": ["a", "b\\udfff"]}]}', ("and", 0, "in")),
    ('{"field": "tag", "gte": "2020-01-01\\ud800"}', ("gte",)),
])
def test_what_sqlite_or_the_index_cannot_hold_is_refused_with_its_path(text: str, path: tuple[object, ...]) -> None:
    assert _refused(json.loads(text)).path == path


def test_the_sql_is_compiled_on_demand() -> None:
    parsed = parse_filter({"field": "tag", "in": ["a", "a", "b"]}, FIELDS)
    sql, params = parsed.sql()
    assert " OR " not in sql and params.count('["a", "b"]') == 1  # two values, once each, one bound JSON array
    assert parsed == parse_filter({"field": "tag", "in": ["a", "b"]}, FIELDS)  # equal filters share a batch
