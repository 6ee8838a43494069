"""Typed payload fields: the --field option, what each type accepts, and what inference makes of a corpus."""

from __future__ import annotations

import pytest

from models.bundle.payload.fields import (
    FieldType,
    PayloadField,
    Tally,
    check_metadata,
    declared_fields,
    infer,
    to_micros,
    typed,
)
from models.errors import InputError


def test_field_options_parse_and_refuse_clearly() -> None:
    fields = declared_fields(["year:integer", "a:b:keyword-list", "when:datetime"])
    assert [(f.name, f.type, f.declared) for f in fields] == [
        ("year", FieldType.INTEGER, True), ("a:b", FieldType.KEYWORD_LIST, True), ("when", FieldType.DATETIME, True)]
    with pytest.raises(InputError, match=r"--field 'year': expected NAME:TYPE"):
        declared_fields(["year"])
    with pytest.raises(InputError, match=r"unknown type 'int'; choose one of keyword, keyword-list, integer"):
        declared_fields(["year:int"])
    with pytest.raises(InputError, match=r"--field 'year' is given twice"):
        declared_fields(["year:integer", "year:float"])


@pytest.mark.parametrize(("kind", "value", "stored"), [
    (FieldType.KEYWORD, "en", "en"),
    (FieldType.KEYWORD_LIST, "en", ["en"]),  # a lone string is a list of one
    (FieldType.KEYWORD_LIST, ["en", "de"], ["en", "de"]),
    (FieldType.KEYWORD_LIST, [], []),
    (FieldType.INTEGER, 2001, 2001),
    (FieldType.INTEGER, 2001.0, 2001),  # JSON does not tell 2001 from 2001.0
    (FieldType.FLOAT, 3, 3.0),
    (FieldType.BOOLEAN, False, False),
    (FieldType.DATETIME, "1970-01-01T00:00:01Z", 1_000_000),
    (FieldType.DATETIME, "1970-01-02", 86_400_000_000),
])
def test_values_of_each_type(kind: FieldType, value: object, stored: object) -> None:
    assert typed(kind, value) == stored


@pytest.mark.parametrize(("kind", "value"), [
    (FieldType.KEYWORD, 3), (FieldType.KEYWORD_LIST, ["a", 1]), (FieldType.INTEGER, 2.5), (FieldType.INTEGER, True),
    (FieldType.INTEGER, 2**63), (FieldType.FLOAT, "1.5"), (FieldType.FLOAT, float("nan")), (FieldType.BOOLEAN, 0),
    (FieldType.DATETIME, "soon"), (FieldType.DATETIME, 1_600_000_000),
])
def test_values_of_another_type_are_refused(kind: FieldType, value: object) -> None:
    with pytest.raises(ValueError, match="expected"):
        typed(kind, value)


def test_a_wrong_value_names_its_line_and_the_field() -> None:
    fields = [PayloadField(name="year", type=FieldType.INTEGER, declared=True),
              PayloadField(name="lang", type=FieldType.KEYWORD)]
    check_metadata({"year": 2001, "lang": None, "other": [1]}, fields, "c.jsonl:3")  # null and other keys: fine
    with pytest.raises(InputError, match=r"c\.jsonl:7: field 'year' is declared integer: expected a whole number.*"
                                         r"got '2001'"):
        check_metadata({"year": "2001"}, fields, "c.jsonl:7")
    with pytest.raises(InputError, match=r"c\.jsonl:8: field 'lang' is inferred \(at the bundle's build\) as keyword"):
        check_metadata({"lang": ["en"]}, fields, "c.jsonl:8")


def test_datetimes_are_instants() -> None:
    assert to_micros("2020-01-01T13:00:00+01:00") == to_micros("2020-01-01T12:00:00Z") == to_micros(
        "2020-01-01T12:00:00")  # naive times are UTC
    assert to_micros("2020-01-01") == to_micros("2020-01-01T00:00:00")
    assert to_micros("not a date") is None


def test_inference_gives_one_type_or_none() -> None:
    tally = Tally()
    rows = [{"n": 1, "x": 1.5, "b": True, "s": "2020-01-01", "l": ["a"], "m": 1, "o": {"k": 1}},
            {"n": 2, "x": 2, "b": None, "s": "2021-02-03", "l": "b", "m": "1", "o": None},
            {"n": None, "l": []}]
    for meta in rows:
        tally.add(meta)
    inferred = {name: infer(tally, name) for name in ("n", "x", "b", "s", "l", "m", "o", "missing")}
    assert inferred == {"n": FieldType.INTEGER, "x": FieldType.FLOAT, "b": FieldType.BOOLEAN,
                        "s": FieldType.KEYWORD,  # dates stay keywords: they filter as written, as before
                        "l": FieldType.KEYWORD_LIST, "m": None, "o": None, "missing": None}
    assert tally.dates["s"] is True
