"""The payload index on its own (a docstore and its columns, no model): the schema it writes, the masks it
evaluates against the filter's Python semantics, both ways a mask is written, and the checks that catch a
damaged column. The property test (test_filter_property.py) covers random corpora and filters end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.bundle.payload.fields import FieldType, PayloadField, declared_fields, schema_lines
from models.bundle.payload.index import PayloadIndex, _joined
from models.bundle.payload.writer import part_name, write_payload
from models.bundle.storage.docstore import DocStore, write_docstore
from models.corpus import Document
from models.errors import InputError
from models.search import parse_filter
from models.search.filters import sql_of

TAGS = ["a", "b", "c", "d"]


def _meta(i: int) -> dict[str, object]:
    meta: dict[str, object] = {"year": 1990 + i % 35, "tag": TAGS[i % 4], "score": (i % 17) / 4,
                               "open": i % 3 == 0, "tags": [TAGS[i % 4], TAGS[(i + 1) % 4]] if i % 5 else [],
                               "when": f"2020-01-{1 + i % 28:02d}T{i % 24:02d}:00:00+01:00",
                               "mixed": i if i % 2 else str(i), "big": 2**62 + i}
    if i % 7 == 0:
        del meta["year"]
    if i % 11 == 0:
        meta["tag"] = None
    return meta


META = [_meta(i) for i in range(400)]


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> tuple[PayloadIndex, DocStore]:
    directory = tmp_path_factory.mktemp("payload")
    docs = [Document(id=f"d{i}", title="", text="x", metadata=json.dumps(m, sort_keys=True))
            for i, m in enumerate(META)]
    write_docstore(directory / "docs.sqlite", docs)
    store = DocStore(directory / "docs.sqlite")
    info, names = write_payload(directory, store, len(docs), declared_fields(["when:datetime"]))
    assert all((directory / name).is_file() for name in names)
    return PayloadIndex(directory, info, len(docs)), store


def test_the_schema_declares_infers_and_leaves_out(indexed: tuple[PayloadIndex, DocStore]) -> None:
    info = indexed[0].info
    assert info.types() == {"when": FieldType.DATETIME, "big": FieldType.INTEGER, "open": FieldType.BOOLEAN,
                            "score": FieldType.FLOAT, "tag": FieldType.KEYWORD, "tags": FieldType.KEYWORD_LIST,
                            "year": FieldType.INTEGER}
    assert info.declared() == {"when": FieldType.DATETIME} and info.unindexed == ["mixed"]
    by_name = {f.name: f for f in info.fields}
    assert by_name["year"].documents == 400 - 58 and by_name["year"].values == 30  # i % 7 == 0 has none
    assert by_name["tags"].documents == 400  # [] is a value (it exists), with no element
    assert by_name["tag"].documents == 400 - 37 and by_name["tag"].values == 4
    lines = schema_lines(info)
    assert "field when: datetime (declared), 400 documents, 168 distinct values" in lines
    assert lines[-1].endswith("mixed")


FILTERS = [
    {"field": "year", "eq": 2000}, {"field": "year", "eq": 2000.0}, {"field": "year", "eq": "2000"},
    {"field": "year", "gte": 1991}, {"field": "year", "gt": 1999.5, "lte": 2003.2}, {"field": "year", "lt": -1e30},
    {"field": "year", "gt": 1e30}, {"field": "year", "in": [1990, 1995, 1995.0, "1996", True]},
    {"field": "big", "gte": 2**62 + 10, "lt": 2**62 + 20}, {"field": "big", "eq": 2**62 + 3},
    {"field": "tag", "eq": "a"}, {"field": "tag", "in": ["a", "b", "z", 1]}, {"field": "tag", "exists": False},
    {"field": "tag", "gte": "2000-01-01"},  # a keyword range compares as written: every letter sorts after digits
    {"field": "score", "lt": 2.25}, {"field": "score", "eq": 1}, {"field": "open", "eq": True},
    {"field": "open", "eq": 1}, {"field": "open", "gt": 0},
    {"field": "tags", "eq": "b"}, {"field": "tags", "in": ["a", "c"]}, {"field": "tags", "exists": True},
    {"not": {"field": "tags", "eq": "a"}},
    {"field": "when", "gte": "2020-01-05T00:00:00Z", "lt": "2020-01-09"},
    {"field": "when", "eq": "2020-01-02T00:00:00Z"},
    {"field": "when", "eq": "2020-01-02T01:00:00+01:00"}, {"field": "when", "gt": 3},
    {"field": "mixed", "eq": 3}, {"field": "mixed", "eq": "4"}, {"field": "nothing", "exists": False},
    {"and": [{"field": "year", "gte": 2000},
             {"or": [{"field": "tag", "eq": "a"}, {"not": {"field": "mixed", "gt": 100}}]}]},
]


@pytest.mark.parametrize("flt", FILTERS, ids=[json.dumps(f) for f in FILTERS])
def test_masks_equal_the_filter_semantics(indexed: tuple[PayloadIndex, DocStore], flt: dict) -> None:
    payload, store = indexed
    parsed = parse_filter(flt, frozenset([*META[1], "nothing"]))

    def from_docstore(leaf: tuple) -> np.ndarray:
        mask = np.zeros(len(META), dtype=bool)
        mask[store.rows_where(*sql_of(leaf))] = True
        return mask

    mask = payload.evaluate(parsed.tree, from_docstore)
    expected = [parsed.matches(m, payload.info.types()) for m in META]
    assert mask.tolist() == expected


def test_a_wide_match_is_written_as_its_complement_with_the_same_rows(indexed: tuple[PayloadIndex, DocStore]) -> None:
    column = indexed[0].column("year")
    assert column is not None
    leaf = parse_filter({"field": "year", "gte": 1991}, {"year"}).tree
    spans = column.spans(leaf)
    assert 2 * sum(b - a for a, b in spans) > len(column.rows)  # the complement path
    direct = np.zeros(len(META), dtype=bool)
    for a, b in spans:
        direct[column.rows[a:b]] = True
    assert column.mask(leaf).tolist() == direct.tolist()


def _leaves(tree: tuple) -> list[tuple]:
    if tree[0] in ("and", "or"):
        return [leaf for part in tree[1] for leaf in _leaves(part)]
    return _leaves(tree[1]) if tree[0] == "not" else [tree]


def test_ranks_compared_give_the_scattered_rows(indexed: tuple[PayloadIndex, DocStore]) -> None:
    """A wide condition's mask is a comparison of the rows' ranks (Column._compared): for every condition on a
    ranked field it equals the mask its slices scatter, and a keyword list, whose rows repeat, has no ranks."""
    payload = indexed[0]
    assert {f.name for f in payload.info.fields if f.ranks} == {"when", "big", "open", "score", "tag", "year"}
    compared = 0
    for flt in FILTERS:
        for leaf in _leaves(parse_filter(flt, frozenset([*META[1], "nothing"])).tree):
            column = payload.column(leaf[1])
            if column is None or column.ranks is None or leaf[0] == "exists":
                continue
            spans = column.spans(leaf)
            direct = np.zeros(len(META), dtype=bool)
            for a, b in spans:
                direct[column.rows[a:b]] = True
            assert column._compared(_joined(spans)).tolist() == direct.tolist(), leaf
            compared += 1
    assert compared > 20


def test_a_bundle_without_ranks_scatters_the_same_masks(tmp_path: Path, indexed: tuple[PayloadIndex, DocStore]) -> None:
    """A bundle written before ranks (its fields say none, its files hold none) loads and gives the same masks."""
    payload, store = indexed
    info, names = write_payload(tmp_path, store, len(META), declared_fields(["when:datetime"]))
    for name in names:
        if name.endswith(".ranks.npy"):
            (tmp_path / name).unlink()
    old = info.model_copy(update={"fields": [f.model_copy(update={"ranks": False}) for f in info.fields]})
    before = PayloadIndex(tmp_path, old, len(META))
    before.check()
    for flt in FILTERS:
        parsed = parse_filter(flt, frozenset([*META[1], "nothing"]))
        if "mixed" in json.dumps(flt):
            continue  # the docstore's fallback: not the columns
        assert before.evaluate(parsed.tree, _no_scan).tolist() == payload.evaluate(parsed.tree, _no_scan).tolist()


def test_check_finds_a_damaged_column(tmp_path: Path, indexed: tuple[PayloadIndex, DocStore]) -> None:
    store = indexed[1]
    info, _ = write_payload(tmp_path, store, len(META), [PayloadField(name="year", type=FieldType.INTEGER)])
    PayloadIndex(tmp_path, info, len(META)).check()
    position = [f.name for f in info.fields].index("year")
    values = np.load(tmp_path / part_name(position, "values"))
    np.save(tmp_path / part_name(position, "values"), values[::-1])
    with pytest.raises(ValueError, match="payload field 'year': its arrays are inconsistent"):
        PayloadIndex(tmp_path, info, len(META)).check()
    rows = np.load(tmp_path / part_name(position, "rows"))
    np.save(tmp_path / part_name(position, "rows"), rows[:-1])
    with pytest.raises(ValueError, match="payload field 'year': its arrays do not match each other"):
        PayloadIndex(tmp_path, info, len(META))  # at opening, from the parts' headers: the segment refuses to load
    np.save(tmp_path / part_name(position, "rows"), rows)
    ranks = np.load(tmp_path / part_name(position, "ranks"))
    np.save(tmp_path / part_name(position, "ranks"), np.roll(ranks, 1))
    with pytest.raises(ValueError, match="payload field 'year': its arrays are inconsistent"):
        PayloadIndex(tmp_path, info, len(META)).check()


def test_a_value_of_another_type_is_refused(tmp_path: Path, indexed: tuple[PayloadIndex, DocStore]) -> None:
    with pytest.raises(InputError, match=r"document 'd1' \(row 1\): field 'tag' is declared integer: expected a whole"):
        write_payload(tmp_path, indexed[1], len(META), declared_fields(["tag:integer"]))


def _no_scan(leaf: tuple[object, ...]) -> np.ndarray:
    raise AssertionError(f"the docstore was scanned for {leaf}")


@pytest.mark.parametrize(("flt", "matching"), [
    ({"field": "later", "exists": True}, 0), ({"field": "later", "exists": False}, 400),
    ({"field": "later", "eq": "x"}, 0), ({"field": "later", "in": ["x", 1]}, 0), ({"field": "later", "gte": 1}, 0),
    ({"not": {"field": "later", "eq": "x"}}, 400),
    ({"or": [{"field": "later", "eq": 1}, {"field": "open", "eq": True}]}, sum(1 for m in META if m["open"])),
])
def test_a_key_the_schema_lacks_is_absent_from_every_row_without_a_scan(indexed: tuple[PayloadIndex, DocStore],
                                                                        flt: dict[str, object], matching: int) -> None:
    index, _ = indexed  # "later": a field a later segment added, which this one never held
    assert int(index.evaluate(parse_filter(flt, {"later", "open"}).tree, _no_scan).sum()) == matching


def test_an_unindexed_key_still_reads_the_docstore_off_the_fetch_lock(indexed: tuple[PayloadIndex, DocStore]) -> None:
    index, store = indexed
    before = store.scans
    leaf = parse_filter({"field": "mixed", "eq": 3}, {"mixed"}).tree
    with store._lock:  # a document fetch in progress does not hold the scan up
        mask = index.evaluate(leaf, lambda leaf: _mask(store, leaf))
    assert mask.nonzero()[0].tolist() == [3] and store.scans == before + 1


def _mask(store: DocStore, leaf: tuple[object, ...]) -> np.ndarray:
    mask = np.zeros(len(META), dtype=bool)
    mask[store.rows_where(*sql_of(leaf))] = True
    return mask


def test_in_values_are_looked_up_once_each(indexed: tuple[PayloadIndex, DocStore]) -> None:
    index, _ = indexed
    before = index.values_looked_up
    many = index.evaluate(parse_filter({"field": "tag", "in": ["a"] * 1000 + ["b"]}, {"tag"}).tree, _no_scan)
    assert index.values_looked_up == before + 2
    two = index.evaluate(parse_filter({"field": "tag", "in": ["a", "b"]}, {"tag"}).tree, _no_scan)
    assert np.array_equal(many, two)


def test_columns_laid_out_in_small_steps_equal_a_stable_sort(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past SPILL_AFTER pairs the columns are sorted on disk a step at a time (models.bundle.payload.columns): with
    steps of 7 pairs the arrays are, byte for byte, those of the stable in-memory sort of small corpora."""
    from models.bundle.payload import columns as payload_columns
    from models.bundle.storage import spill

    write_docstore(tmp_path / "docs.sqlite", [Document(id=str(i), title="", text="x", metadata=json.dumps(m))
                                              for i, m in enumerate(META)])
    results = {}
    for step in (7, 1 << 21):
        monkeypatch.setattr(spill, "SPILL_AFTER", min(step, 1 << 22))
        monkeypatch.setattr(spill, "STEP_RECORDS", step)
        monkeypatch.setattr(payload_columns, "STEP_RECORDS", step)
        out = tmp_path / f"step-{step}"
        out.mkdir()
        store = DocStore(tmp_path / "docs.sqlite")
        try:
            info, names = write_payload(out, store, len(META), declared_fields(("tags:keyword-list",)))
        finally:
            store.close()
        assert sorted(str(p.relative_to(out)) for p in (out / "payload").iterdir()) == sorted(names)  # no scratch
        results[step] = {n: (out / n).read_bytes() for n in names}
        year = next(i for i, f in enumerate(info.fields) if f.name == "year")
        pairs = sorted((m["year"], row) for row, m in enumerate(META) if m.get("year") is not None)
        assert np.load(out / part_name(year, "values")).tolist() == [v for v, _ in pairs]
        assert np.load(out / part_name(year, "rows")).tolist() == [r for _, r in pairs]
    assert results[7] == results[1 << 21]
