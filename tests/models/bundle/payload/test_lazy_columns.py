"""A payload index opens its fields' files and maps a column only when a filter first names its field: opening
reads no column, a column is read from the files opened with the index (a pruned directory loses nothing), many
threads naming a field at once load it once and get one thread's answer, and the descriptors of fields never
loaded are closed with the index. Real files throughout (models.bundle.payload.writer's)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from models.bundle.payload.fields import PayloadInfo, declared_fields
from models.bundle.payload.index import PayloadIndex
from models.bundle.payload.writer import field_parts, part_name, write_payload
from models.bundle.storage.docstore import DocStore, write_docstore
from models.corpus import Document
from models.search import parse_filter

TAGS = ["a", "b", "c"]
META = [{"year": 1990 + i % 30, "tag": TAGS[i % 3], "tags": [TAGS[i % 3], TAGS[(i + i // 3) % 3]],
         "score": (i % 13) / 4, **({"open": i % 2 == 0} if i % 5 else {})} for i in range(300)]
FIELDS = frozenset(META[1])
WIDE = {"and": [{"field": "tag", "in": ["a", "c"]}, {"field": "score", "gte": 1.0},
                {"not": {"field": "tags", "eq": "b"}}, {"field": "open", "exists": True}]}
THREADS, ROUNDS = 16, 8


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PayloadInfo]:
    directory = tmp_path_factory.mktemp("lazy")
    write_docstore(directory / "docs.sqlite", [Document(id=f"d{i}", title="", text="x", metadata=json.dumps(m))
                                                for i, m in enumerate(META)])
    store = DocStore(directory / "docs.sqlite")
    try:
        info, _ = write_payload(directory, store, len(META), declared_fields(["tags:keyword-list"]))
    finally:
        store.close()
    assert {f.name for f in info.fields} == FIELDS and not info.unindexed
    return directory, info


@pytest.fixture
def payload_dir(written: tuple[Path, PayloadInfo], tmp_path: Path) -> tuple[Path, PayloadInfo]:
    """A copy of the written index this test may damage or delete."""
    shutil.copytree(written[0], tmp_path / "p")
    return tmp_path / "p", written[1]


@pytest.fixture
def switching() -> Iterator[None]:
    """Threads switched every microsecond rather than every 5 ms: a load two threads could both start, they do."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _no_scan(leaf: tuple[object, ...]) -> np.ndarray:
    raise AssertionError(f"the docstore was scanned for {leaf}")


def _expected(flt: dict, info: PayloadInfo) -> list[bool]:
    parsed = parse_filter(flt, FIELDS)
    return [parsed.matches(m, info.types()) for m in META]


def _evaluate(payload: PayloadIndex, flt: dict) -> list[bool]:
    return payload.evaluate(parse_filter(flt, FIELDS).tree, _no_scan).tolist()


def _parts(directory: Path, info: PayloadInfo, name: str) -> list[Path]:
    position = [f.name for f in info.fields].index(name)
    field = info.fields[position]
    return [directory / part_name(position, part) for part in field_parts(field.type, field.ranks)]


def _descriptors_under(directory: Path) -> int:
    """This process's descriptors open on files that were under `directory` (a map's own included)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir itself held, closed since
            continue
        count += target.startswith(f"{directory}/")
    return count


def test_opening_reads_no_column_and_a_filter_reads_only_the_fields_it_names(
        payload_dir: tuple[Path, PayloadInfo]) -> None:
    directory, info = payload_dir
    payload = PayloadIndex(directory, info, len(META))
    assert payload.loaded == frozenset()
    for part in _parts(directory, info, "tag"):  # after opening, every part of `tag` stops being an array, in place
        with part.open("r+b") as fh:
            fh.write(b"\0" * part.stat().st_size)
    year = {"field": "year", "gte": 2005}
    assert _evaluate(payload, year) == _expected(year, info)
    assert payload.loaded == {"year"}  # `tag`'s parts were never read: opening did not map them
    with pytest.raises(ValueError, match="the magic string is not correct"):
        _evaluate(payload, {"field": "tag", "eq": "a"})  # read now, at its first use
    assert payload.loaded == {"year"}
    score = {"or": [{"field": "score", "lt": 1}, {"field": "open", "eq": True}]}
    assert _evaluate(payload, score) == _expected(score, info)
    assert payload.loaded == {"year", "score", "open"}


def test_a_column_is_read_from_the_files_the_index_opened_even_once_they_are_deleted(
        payload_dir: tuple[Path, PayloadInfo]) -> None:
    """What a reloaded version's shared segment meets when the indexer prunes the version it came from."""
    directory, info = payload_dir
    payload = PayloadIndex(directory, info, len(META))
    shutil.rmtree(directory)
    assert _evaluate(payload, WIDE) == _expected(WIDE, info)
    assert payload.loaded == {"tag", "score", "tags", "open"}


@pytest.mark.usefixtures("switching")
def test_threads_filtering_at_once_on_a_field_not_loaded_get_one_threads_answer(
        payload_dir: tuple[Path, PayloadInfo]) -> None:
    directory, info = payload_dir
    alone = _evaluate(PayloadIndex(directory, info, len(META)), WIDE)
    assert alone == _expected(WIDE, info) and 0 < sum(alone) < len(META)
    with ThreadPoolExecutor(THREADS) as pool:
        for _ in range(ROUNDS):
            payload = PayloadIndex(directory, info, len(META))
            start = threading.Barrier(THREADS)

            def one(payload: PayloadIndex = payload, start: threading.Barrier = start) -> list[bool]:
                start.wait()
                return _evaluate(payload, WIDE)

            answers = [f.result() for f in [pool.submit(one) for _ in range(THREADS)]]
            assert all(answer == alone for answer in answers)
            assert payload.loaded == {"tag", "score", "tags", "open"}


@pytest.mark.usefixtures("switching")
def test_threads_that_need_a_column_at_once_load_it_once(payload_dir: tuple[Path, PayloadInfo]) -> None:
    directory, info = payload_dir
    with ThreadPoolExecutor(THREADS) as pool:
        for _ in range(ROUNDS):
            payload = PayloadIndex(directory, info, len(META))
            start = threading.Barrier(THREADS)

            def one(payload: PayloadIndex = payload, start: threading.Barrier = start) -> object:
                start.wait()
                return payload.column("tags")

            columns = [f.result() for f in [pool.submit(one) for _ in range(THREADS)]]
            assert columns[0] is not None and all(c is columns[0] for c in columns)  # one load, every thread its column
            assert payload.column("tags") is columns[0] and payload.loaded == {"tags"}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc/self/fd")
def test_a_field_holds_one_descriptor_a_part_loaded_or_not_and_closing_lets_go_of_them(
        payload_dir: tuple[Path, PayloadInfo]) -> None:
    """As when every part was mapped at opening (docs/operations.md#file-descriptors): one descriptor a part, the
    part's until its column is loaded, then its map's; `close` (a segment's last user gone) closes the parts never
    mapped, and the maps close with the index."""
    directory, info = payload_dir
    parts = sum(len(_parts(directory, info, f.name)) for f in info.fields)
    payload = PayloadIndex(directory, info, len(META))
    assert _descriptors_under(directory) == parts
    assert _evaluate(payload, WIDE) == _expected(WIDE, info)
    assert _descriptors_under(directory) == parts
    payload.close()
    loaded = sum(len(_parts(directory, info, name)) for name in payload.loaded)
    assert _descriptors_under(directory) == loaded
    del payload
    assert _descriptors_under(directory) == 0


def _rewritten(path: Path, change: object) -> None:
    np.save(path, change(np.load(path)))  # type: ignore[operator]


def _last_past_the_rows(offsets: np.ndarray) -> np.ndarray:
    return np.append(offsets[:-1], offsets[-1] + 1)


@pytest.mark.parametrize(("name", "part", "change"), [
    ("tag", "offsets", lambda a: a[:-1]),  # one offset fewer than the dictionary's values and one
    ("tag", "dict_offsets", lambda a: a[:-1]),  # the dictionary one value shorter than the offsets
    ("tags", "offsets", _last_past_the_rows),  # the last posting list ends past the rows
    ("year", "values", lambda a: a[1:]),
    ("year", "rows", lambda a: a[1:]),
    ("year", "ranks", lambda a: a[1:]),  # a rank fewer than the rows of the bundle
    ("score", "absent", lambda a: a.reshape(1, -1)),
])
def test_a_field_whose_parts_disagree_refuses_to_open(payload_dir: tuple[Path, PayloadInfo], name: str, part: str,
                                                     change: object) -> None:
    """Sizes are checked at opening from the parts' headers (and the last offset): a writer's bug the checksums
    cannot see refuses the segment's load, as when the parts were mapped at opening, never a filter."""
    directory, info = payload_dir
    path = next(p for p in _parts(directory, info, name) if p.name.endswith(f".{part}.npy"))
    _rewritten(path, change)
    with pytest.raises(ValueError, match=f"payload field '{name}': its arrays do not match each other"):
        PayloadIndex(directory, info, len(META))


def test_offsets_in_another_byte_order_open_and_filter_alike(payload_dir: tuple[Path, PayloadInfo]) -> None:
    """The last offset is read in its header's dtype: a big-endian part is as valid as np.load finds it."""
    directory, info = payload_dir
    for name in ("tag", "tags"):
        path = next(p for p in _parts(directory, info, name) if p.name.endswith(".offsets.npy"))
        _rewritten(path, lambda a: a.astype(a.dtype.newbyteorder(">")))
    flt = {"or": [{"field": "tag", "in": ["a", "c"]}, {"field": "tags", "eq": "b"}]}
    assert _evaluate(PayloadIndex(directory, info, len(META)), flt) == _expected(flt, info)


def test_a_part_truncated_after_opening_fails_its_first_use_and_spares_the_other_fields(
        payload_dir: tuple[Path, PayloadInfo]) -> None:
    directory, info = payload_dir
    payload = PayloadIndex(directory, info, len(META))
    rows = next(p for p in _parts(directory, info, "year") if p.name.endswith(".rows.npy"))
    os.truncate(rows, rows.stat().st_size - 1)
    year = {"field": "year", "gte": 2005}
    for _ in range(2):  # a column that failed is not kept half-loaded: the next use fails as the first did
        with pytest.raises(ValueError, match="is shorter than its header"):
            _evaluate(payload, year)
    assert payload.loaded == frozenset()
    assert _evaluate(payload, WIDE) == _expected(WIDE, info)
