"""models.search.filters: the filter language's parse errors, each naming the problem and where in the filter it
is; and a parsed filter's canonical tree, SQL and in-Python match (bounds: test_filter_limits.py; agreement of the
evaluators on random filters: test_filter_property.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from models.bundle.storage.docstore import DocStore, write_docstore
from models.corpus import Document
from models.search.filters import FilterError, parse_filter
from models.search.query import SearchOptions

FIELDS = frozenset({"year", "tag", "date", "doi"})


@pytest.mark.parametrize(
    ("flt", "path", "message"),
    [
        ([1], (), "must be a JSON object"),
        ({"eq": 1}, ("field",), "needs 'field'"),
        ({"field": "colour", "eq": "red"}, ("field",), "unknown field 'colour'; known fields: date, doi, tag, year"),
        ({"field": "year", "near": 3}, ("near",), "unknown operator 'near'"),
        ({"field": "year"}, (), "condition on 'year' has no operator"),
        ({"field": "year", "eq": 1, "gt": 0}, (), "each stand alone"),
        ({"field": "year", "eq": [1]}, ("eq",), "eq takes a string, a finite number or a boolean"),
        ({"field": "tag", "in": []}, ("in",), "in takes a non-empty list"),
        ({"field": "doi", "exists": "yes"}, ("exists",), "exists takes true or false"),
        ({"field": "year", "gt": "soon"}, ("gt",), "gt takes a finite number or an ISO 8601 date, got 'soon'"),
        ({"field": "year", "gt": 1, "lt": "2020-01-01"}, (), "range bounds must all be numbers or all be dates"),
        ({"and": [], "or": []}, (), "'and' must be the only key"),
        ({"or": []}, ("or",), "'or' takes a non-empty list of filters"),
        ({"and": [{"field": "year", "eq": 1}, {"not": {"field": "x", "eq": 1}}]}, ("and", 1, "not", "field"),
         "unknown field 'x'"),
    ],
)
def test_a_malformed_filter_is_refused_with_its_path(flt: object, path: tuple[object, ...], message: str) -> None:
    with pytest.raises(FilterError) as caught:
        parse_filter(flt, FIELDS)
    assert message in caught.value.message and caught.value.path == path


def test_a_bundle_without_metadata_says_so() -> None:
    with pytest.raises(FilterError, match="none: this bundle has no metadata"):
        parse_filter({"field": "year", "eq": 1}, frozenset())


DOCS: list[dict[str, Any]] = [
    {"year": 2019, "tag": "a", "date": "2019-05-01"},
    {"year": 2020, "tag": "b", "doi": "10.1/x"},
    {"year": 2021, "tag": "c", "doi": None, "date": "2021-01-01"},
]


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({"field": "year", "eq": 2020}, [1]),
        ({"field": "tag", "in": ["a", "c", "a"]}, [0, 2]),
        ({"field": "year", "gte": 2020, "lt": 2021}, [1]),
        ({"field": "date", "gte": "2020-01-01"}, [2]),
        ({"field": "doi", "exists": True}, [1]),
        ({"not": {"field": "doi", "exists": True}}, [0, 2]),
        ({"or": [{"field": "tag", "eq": "a"}, {"and": [{"field": "year", "gt": 2020}, {"field": "tag", "eq": "c"}]}]},
         [0, 2]),
    ],
)
def test_the_sql_and_the_python_match_select_the_same_documents(flt: dict[str, Any], expected: list[int],
                                                                 tmp_path: Path) -> None:
    parsed = parse_filter(flt, FIELDS)
    assert [i for i, meta in enumerate(DOCS) if parsed.matches(meta)] == expected
    write_docstore(tmp_path / "docs.sqlite", [Document(id=str(i), title="", text="t", metadata=json.dumps(m))
                                              for i, m in enumerate(DOCS)])
    store = DocStore(tmp_path / "docs.sqlite")
    try:
        assert store.rows_where(*parsed.sql()).tolist() == expected
    finally:
        store.close()


def test_in_values_are_canonical_so_equal_filters_are_equal() -> None:
    one = parse_filter({"field": "tag", "in": ["a", "b", "a"]}, FIELDS)
    assert one == parse_filter({"field": "tag", "in": ["a", "b"]}, FIELDS) and hash(one) is not None
    assert one.tree == ("in", "tag", ("a", "b"))


def test_filters_and_options_equal_only_in_value_and_type() -> None:
    """Python's `True == 1 == 1.0` (equal hashes too) must not make two filters, or two requests' options, equal:
    the batcher groups requests by them, and `{"eq": true}` on a boolean field answers what `{"eq": 1}` does not."""
    fields = {"flag", "year"}
    spelled = [True, 1, 1.0, "1", False, 0, 0.0, "true"]
    filters = [parse_filter({"field": "flag", "eq": v}, fields) for v in spelled]
    assert len({f: None for f in filters}) == len(spelled)  # eight dict keys, not four
    assert len({f.key for f in filters}) == len(spelled)
    assert parse_filter({"field": "flag", "eq": 1}, fields) == parse_filter({"field": "flag", "eq": 1}, fields)
    nested = [parse_filter({"or": [{"field": "flag", "in": [v, "a"]}, {"field": "year", "gte": 2000}]}, fields)
              for v in (True, 1)]
    assert nested[0] != nested[1]
    options = [SearchOptions(top_k=3, filter=f) for f in filters]
    assert len(set(options)) == len(spelled)
    assert SearchOptions(top_k=3, min_score=1) != SearchOptions(top_k=3, min_score=True)
    # the deadline is not part of what a search answers: requests with different deadlines still share one
    assert SearchOptions(top_k=3, filter=filters[1], deadline=1.0) == SearchOptions(top_k=3, filter=filters[1])
