"""Reading an import's `--ids` file (a JSON list of document ids) as a stream, a chunk at a time.

`json.loads` of the whole list holds one Python string per document at once: 0.9 GB at 10M documents, the
largest allocation of an import. Here the list is parsed an element at a time (the standard library's decoder on a
buffered window of the file), so memory holds one window and one chunk of ids whatever the corpus size; a bad
element is reported with the file and its position in the list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from models.errors import InputError

READ_CHARS = 1 << 20  # characters of the file decoded at a time
_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class IdStream:
    """The ids of a JSON list file, `take(n)` at a time; `count` ids handed out so far."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._fh = self.path.open(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{path}: not a readable JSON list of ids ({exc})") from exc
        self._buf, self._pos, self._eof = "", 0, False
        self.count = 0
        self._done = False
        self._expect("[")
        if self._peek() == "]":
            self._pos += 1
            self._finish()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> IdStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def take(self, n: int) -> list[str]:
        """The next `n` ids (fewer at the end of the list)."""
        out: list[str] = []
        while len(out) < n and not self._done:
            out.append(self._element())
            separator = self._peek()
            if separator == ",":
                self._pos += 1
            elif separator == "]":
                self._pos += 1
                self._finish()
            else:
                self._fail(f"expected ',' or ']' after id {self.count - 1}")
        return out

    def rest(self) -> int:
        """How many ids are left (read through to the end of the list, none kept)."""
        left = 0
        while batch := self.take(1 << 16):
            left += len(batch)
        return left

    def __iter__(self) -> Iterator[str]:
        while batch := self.take(1 << 16):
            yield from batch

    # --- parsing ----------------------------------------------------------------------------------------------

    def _fill(self) -> bool:
        """Read more of the file into the window (dropping what was parsed); False at its end."""
        if self._eof:
            return False
        try:
            more = self._fh.read(READ_CHARS)
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{self.path}: not a readable JSON list of ids ({exc})") from exc
        self._buf, self._pos = self._buf[self._pos:] + more, 0
        self._eof = not more
        return bool(more)

    def _peek(self) -> str:
        """The next character that is not whitespace ('' at the end of the file), not consumed."""
        while True:
            self._pos = _SPACE.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _expect(self, char: str) -> None:
        if self._peek() != char:
            self._fail(f"expected '{char}'")
        self._pos += 1

    def _element(self) -> str:
        self._peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if self._fill():  # the element may go on past the window
                    continue
                self._fail(f"id {self.count} is not valid JSON ({exc.msg})")
            if end == len(self._buf) and self._fill():  # a number may go on past the window
                continue
            break
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise InputError(f"{self.path}: expected a JSON list of document ids; id {self.count} is "
                             f"{json.dumps(value)[:40]}")
        self._pos = end
        self.count += 1
        return str(value)

    def _finish(self) -> None:
        self._done = True
        if self._peek() != "":
            self._fail("unexpected content after the list")

    def _fail(self, what: str) -> NoReturn:
        raise InputError(f"{self.path}: not a readable JSON list of ids ({what})")
