"""How deep a request body's JSON nests, and how many values it holds, measured on its bytes before any parser runs.

Python's json module, and pydantic after it, descend one stack frame per level: a body of 100,000 nested
objects (800 kB, under the body cap) ends in a RecursionError before any validation can refuse it. Counting the
brackets outside strings is recursion-free (and service.http.body skips even that for a body with few brackets and
commas, nearly every one).

The rest is one pass over the bytes, in chunks of CHUNK_BYTES, whatever they hold: the work is a fixed number of
numpy operations per byte, and the memory a fixed number of chunk-sized arrays, so a body costs time linear in its
size and memory bounded by the chunk. (A regular expression for JSON strings backtracks: on a quote followed by
escaped quotes that never close it, each start retries the rest of the body, quadratic in its size.) Where a
string ends is decided as a JSON parser decides it, on every prefix a parser would accept: a quote closes the
string it is in unless an odd run of backslashes precedes it. The scan carries from chunk to chunk whether it is
inside a string, the length of the backslash run at the chunk's end, the running depth and the values so far.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHUNK_BYTES = 1 << 16  # large enough that numpy's per-call cost vanishes, small enough to stay in cache
_QUOTE, _BACKSLASH, _COMMA = ord('"'), ord("\\"), ord(",")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


@dataclass
class Nesting:
    """What a scan found: the deepest nesting outside strings; a bound on the values the JSON holds, containers
    included (commas and opening brackets outside strings, plus the outermost value: exact but for each empty
    array or object, which counts twice); where a string opens that never closes (a byte offset, None when every
    string closes); and the work done, in bytes scanned and chunks."""

    depth: int = 0
    values: int = 0
    open_string_at: int | None = None
    bytes_scanned: int = 0
    chunks: int = 0


def scan(raw: bytes) -> Nesting:
    """Scan all of `raw` in one pass: brackets inside strings do not count, and a string left open runs to the end
    (it holds the rest of the body, brackets included)."""
    out = Nesting()
    data = np.frombuffer(raw, dtype=np.uint8)
    state = _Carried()
    for start in range(0, data.size, CHUNK_BYTES):
        chunk = data[start:start + CHUNK_BYTES]
        out.chunks += 1
        out.bytes_scanned += chunk.size
        opened = _scan_chunk(chunk, state)  # its arrays are freed on return: memory stays one chunk's
        if opened is not None:
            out.open_string_at = start + opened
    out.depth = state.deepest
    out.values = state.values + (data.size > 0)  # the outermost value
    if not state.in_string:
        out.open_string_at = None
    return out


@dataclass
class _Carried:
    """What one chunk leaves the next: the running and deepest depth, the values past the outermost one so far
    (commas and opening brackets), whether a string is open, and the length of the run of backslashes that ends
    it."""

    depth: int = 0
    deepest: int = 0
    values: int = 0
    in_string: int = 0
    run: int = 0


def _scan_chunk(chunk: np.ndarray, state: _Carried) -> int | None:
    """Scan one chunk, updating `state`; the offset in it of the last quote that opens a string, if any."""
    real, last_plain = _real_quotes(chunk, state.run)
    steps = _STEP[chunk]
    commas = chunk == _COMMA
    opened = None
    if real.size:
        toggles = np.zeros(chunk.size, dtype=np.uint8)
        toggles[real] = 1
        inside = np.bitwise_xor.accumulate(toggles) ^ np.uint8(state.in_string)  # from an opening quote to its close
        steps[inside.view(bool)] = 0
        commas[inside.view(bool)] = False
        if inside[real[-1]]:
            opened = int(real[-1])
        state.in_string = int(inside[-1])
    elif state.in_string:
        steps[:] = 0  # all of the chunk is inside the string an earlier chunk opened
        commas[:] = False
    depths = np.cumsum(steps, dtype=np.int32)  # at most CHUNK_BYTES either way
    state.deepest = max(state.deepest, state.depth + int(depths.max()))
    state.depth += int(depths[-1])
    state.values += int(np.count_nonzero(commas)) + int(np.count_nonzero(steps == 1))
    state.run = 0 if last_plain is None else int(chunk.size - 1 - last_plain[-1])
    return opened


def _real_quotes(chunk: np.ndarray, run: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The offsets of `chunk`'s quotes that open or close a string, and for each byte the offset of the last one at
    or before it that is not a backslash (None when the chunk has no backslash), given the `run` of backslashes
    that ended the previous chunk. A quote is escaped when an odd run of backslashes precedes it."""
    quotes = np.flatnonzero(chunk == _QUOTE)
    backslash = chunk == _BACKSLASH
    if not backslash.any():
        return (quotes if run % 2 == 0 or not quotes.size or quotes[0] else quotes[1:]), None
    index = np.arange(chunk.size, dtype=np.int32)
    # A seed below every offset for the run carried in, which the running maximum keeps until a plain byte.
    last_plain = np.maximum.accumulate(np.where(backslash, np.int32(-1 - run), index))
    before = np.where(quotes > 0, quotes - 1 - last_plain[np.maximum(quotes - 1, 0)], run)
    return quotes[(before & 1) == 0], last_plain
