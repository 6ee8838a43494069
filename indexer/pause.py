"""A test-only pause between a writer reading its base and publishing, to race writers deterministically.

Unset (always, outside tests), `pause` does nothing. With TANDEM_TEST_PAUSE_FIFO naming a fifo, a writer's first
`pause` opens it for reading, which blocks until the test opens it for writing (so the test knows the writer got
there), then reads until the test closes it (so the test decides when the writer goes on). Only the first pause of
a process waits. tests/indexer/test_writer_races.py uses it; nothing else may.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

PAUSE_ENV = "TANDEM_TEST_PAUSE_FIFO"
_paused: list[str] = []


def pause(point: str) -> None:
    """Wait at `point` for the test holding TANDEM_TEST_PAUSE_FIFO, once per process; no-op when it is unset."""
    fifo = os.environ.get(PAUSE_ENV)
    if not fifo or _paused:
        return
    _paused.append(point)
    log.warning("test pause at %s (%s=%s)", point, PAUSE_ENV, fifo)
    with open(fifo, encoding="utf-8") as fh:
        fh.read()
