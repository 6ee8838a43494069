"""How deep a request body's JSON nests, measured on its bytes before any parser recurses into it.

Python's json module, and pydantic after it, descend one stack frame per level: a body of 100,000 nested
objects (800 kB, under the body cap) ends in a RecursionError before any validation can refuse it. Counting the
brackets outside strings is linear, recursion-free and cheap: strings are blanked by one regular expression, then
numpy sums the opening and closing brackets that remain. A body with fewer brackets than the limit, nearly every
one, is passed on after two `bytes.count` calls.
"""

from __future__ import annotations

import re

import numpy as np

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string, escapes included
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def json_depth(raw: bytes, limit: int) -> int:
    """The deepest nesting of `raw`'s arrays and objects, exactly when it may exceed `limit` (else a bound at most
    `limit`); brackets inside strings do not count."""
    opening = raw.count(b"[") + raw.count(b"{")
    if opening <= limit:
        return opening
    outside = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
    return int(np.cumsum(_STEP[outside], dtype=np.int64).max(initial=0))
