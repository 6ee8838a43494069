"""The nesting check reads a body's bytes in work linear in their size, whatever they hold (issue 55, row 1).

The work is counted, never timed: the Python lines the scan executes (a tracer on service.http.json_depth, so
nothing the scan reports about itself is trusted) and the bytes it scans, for each pathological input and the
same input grown 4×; its peak memory is bounded by its chunk, not by the body. Its answers are checked against a
byte-at-a-time tokenizer and against json's own parse.
"""

from __future__ import annotations

import json
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.http import json_depth
from service.http.json_depth import CHUNK_BYTES, scan

SCANNER = str(Path(json_depth.__file__).resolve())


def _unterminated_escapes(n: int) -> bytes:
    return b"{" * 41 + b'"' + b'\\"' * n  # the issue's body: 30,000 escaped quotes make 60 kB


def _many_quotes(n: int) -> bytes:
    return b"[" * 41 + b'"",' * n


def _deep_brackets(n: int) -> bytes:
    return b"[" * n + b"]" * n


def _strings_with_brackets(n: int) -> bytes:
    return b"[" * 41 + b'"' + b"[{" * n + b'\\\\"' + b"]" * 41


def _mebibyte(n: int) -> bytes:  # everything at once: n = 1 MiB / 64 makes the largest body the service accepts
    return (b'{"a":["\\"[",[{"b":"\\\\"}],"x\\u0022{"],"c":"' + b"\\" * 8 + b'"}[').ljust(64, b"[") * n


GROWN: dict[str, tuple[Callable[[int], bytes], int]] = {
    "unterminated escapes": (_unterminated_escapes, 30_000),
    "many quotes": (_many_quotes, 20_000),
    "deep brackets": (_deep_brackets, 30_000),
    "long strings with brackets": (_strings_with_brackets, 30_000),
    "a mebibyte body": (_mebibyte, (1 << 20) // 64 // 4),
}


def _traced_lines(raw: bytes) -> int:
    """Python lines executed in the scanner's module while it scans `raw`."""
    lines = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if frame.f_code.co_filename != SCANNER:
            return None
        if event == "line":
            lines += 1
        return tracer

    sys.settrace(tracer)
    try:
        scan(raw)
    finally:
        sys.settrace(None)
    return lines


@pytest.mark.parametrize("name", list(GROWN))
def test_work_grows_at_most_linearly_with_the_body(name: str) -> None:
    make, n = GROWN[name]
    small, large = make(n), make(4 * n)
    assert len(large) <= 4 * len(small) and len(large) <= 1 << 20
    for raw in (small, large):
        found = scan(raw)
        assert found.bytes_scanned == len(raw)  # each byte once
        assert found.chunks == -(-len(raw) // CHUNK_BYTES)
    # The lines run per chunk are a constant: 4× the bytes is at most 4× the chunks, plus one partial chunk.
    assert _traced_lines(large) <= 4 * _traced_lines(small) + 64, name


@pytest.mark.parametrize("name", list(GROWN))
def test_memory_is_bounded_by_the_chunk_not_the_body(name: str) -> None:
    make, n = GROWN[name]
    peaks = []
    for raw in (make(n), make(4 * n)):
        tracemalloc.start()
        try:
            scan(raw)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert max(peaks) <= 32 * CHUNK_BYTES, peaks  # a few chunk-sized arrays of at most 8 bytes per byte
    assert peaks[1] <= peaks[0] + 4 * CHUNK_BYTES, peaks  # 4× the body, the same memory


def test_the_issue_body_is_too_deep_and_its_string_never_closes() -> None:
    for raw in (_unterminated_escapes(30_000), _unterminated_escapes(524_267)):
        found = scan(raw)
        assert found.depth == 41 and found.open_string_at == 41


def _reference(raw: bytes) -> tuple[int, int, int | None]:
    """Depth, values and open string, one byte at a time: a backslash escapes the byte after it (outside strings,
    where valid JSON has none, only a quote it escapes changes anything)."""
    depth = deepest = 0
    values = 1 if raw else 0
    inside, escaped, opened = False, False, None
    for i, byte in enumerate(raw):
        char = chr(byte)
        if escaped:
            escaped = False
            if inside or char in '"\\':
                continue
        elif char == "\\":
            escaped = True
            continue
        elif char == '"':
            inside = not inside
            opened = i if inside else None
            continue
        if not inside and char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            values += 1
        elif not inside and char in "]}":
            depth -= 1
        elif not inside and char == ",":
            values += 1
    return deepest, values, opened if inside else None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=80).map(lambda b: bytes(b'[]{}"\\a,'[x % 8] for x in b)), st.integers(1, 9))
def test_the_scan_agrees_with_a_byte_at_a_time_tokenizer(raw: bytes, chunk: int) -> None:
    original = json_depth.CHUNK_BYTES
    json_depth.CHUNK_BYTES = chunk  # chunk edges anywhere: inside escapes, runs of backslashes and strings
    try:
        found = scan(raw)
    finally:
        json_depth.CHUNK_BYTES = original
    assert (found.depth, found.values, found.open_string_at) == _reference(raw)


TEXT = st.text(alphabet='[]{}"\\a\u00e9\u0022', max_size=12)
VALUES = st.recursive(st.none() | st.booleans() | st.integers() | TEXT,
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                      max_leaves=30)


def _values(value: object) -> int:
    if isinstance(value, list):
        return 1 + sum(map(_values, value))
    if isinstance(value, dict):
        return 1 + sum(map(_values, value.values()))
    return 1


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(VALUES, st.booleans(), st.integers(1, 9))
def test_the_scan_measures_valid_json_as_its_parse_nests(value: object, ascii_only: bool, chunk: int) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    original = json_depth.CHUNK_BYTES
    json_depth.CHUNK_BYTES = chunk
    try:
        found = scan(raw)
    finally:
        json_depth.CHUNK_BYTES = original
    assert (found.depth, found.open_string_at) == (_depth(value), None)
    assert _values(value) <= found.values <= 2 * _values(value)  # an empty array or object counts twice
