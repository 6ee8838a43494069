"""The event loop's CPU per search that the batcher's hand-off costs, with worker threads and without.

Why (issue 56): "bypass the batcher when it cannot batch" (TANDEM_BATCH_MAX_QUERIES 1, the default) would save the
hand-off to a worker and back, if that hand-off were a large part of a request's CPU on the event loop. The real
`MicroBatcher` is driven here with an encode and a search that do nothing (as tests/service/search/test_batcher.py
drives it), one request at a time, and the loop thread's `time.thread_time` per `await search(...)` is reported for
`workers` 2 (the default: submit, a worker thread runs the job, `call_soon_threadsafe` wakes the loop) and 0 (the
loop runs each job itself between its I/O rounds).

    python -m bench.serving.handoff_cpu --requests 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Hashable, Sequence

import numpy as np

from models.search import Retrieved, SearchOptions
from service.core.batcher import MicroBatcher


def _encode(texts: Sequence[str], scopes: Sequence[Hashable]) -> tuple[np.ndarray, list[int]]:
    return np.zeros((len(texts), 8), dtype=np.float32), [1] * len(texts)


def _search(vectors: np.ndarray | None, queries: list[str], options: SearchOptions) -> Retrieved:
    return Retrieved([[] for _ in queries])


async def loop_cpu_us(workers: int, requests: int) -> float:
    """µs of the loop thread's CPU per search, after 300 untimed ones."""
    batcher = MicroBatcher(_encode, _search, max_batch=1, max_wait_s=0.002, max_pending=64, max_queue_s=1.0,
                           workers=workers)
    try:
        for _ in range(300):
            await batcher.search(["q"], 10, 5.0)
        began = time.thread_time()
        for _ in range(requests):
            await batcher.search(["q"], 10, 5.0)
        return (time.thread_time() - began) / requests * 1e6
    finally:
        batcher.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for _ in range(args.rounds):
        spent = {workers: asyncio.run(loop_cpu_us(workers, args.requests)) for workers in (2, 0)}
        print(f"loop thread µs/search: workers 2 {spent[2]:.1f}, workers 0 {spent[0]:.1f}")


if __name__ == "__main__":
    main()
