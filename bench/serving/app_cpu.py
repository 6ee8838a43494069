"""The event loop's CPU per `POST /search` inside the app: the real FastAPI app called as ASGI, no socket.

Why (issue 56): on a shared machine a served rate moves by more than most changes of the request path, but the
CPU the event-loop thread spends per request does not: the batch workers encode and search, and everything else a
request costs in the app (middleware, routing, body checks, parsing and validation, admission, the hand-off,
logging, metrics, rendering) runs on this thread, measured with `time.thread_time`. Uvicorn's HTTP parsing and
socket writes are not included (bench/serving/request_cpu.py measures the served whole). Requests go one at a
time, each query unique (a counter appended, so the query cache never answers), after 200 untimed ones.

    python -m bench.serving.app_cpu --index BUNDLE --student DIR --requests 300 --blocks 5 [--log off]

The access log is formatted as `tandem serve` formats it (JSON, INFO) and written to /dev/null, so its line is part
of the figure (`--log off`: no line, as this bench measured before the option).

To compare source trees, run this file with another tree first on PYTHONPATH (the app is imported from there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WARM_UP = 200


async def _one(app: Any, text: str) -> None:
    body = json.dumps({"query": text, "top_k": 10}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/search", "raw_path": b"/search", "root_path": "", "query_string": b"", "state": {},
             "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent, status = False, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # no disconnect while the answer is written
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    if status != [200]:
        raise RuntimeError(f"POST /search answered {status}")


def log_as_served(fmt: str) -> None:
    """The access log as `tandem serve` writes it (one formatted line a request, at INFO), to /dev/null; "off" leaves
    logging unconfigured (no line is formatted: how this bench measured before it had the option)."""
    if fmt == "off":
        return
    import logging

    from service.runtime.logs import make_handler

    root = logging.getLogger()
    root.addHandler(make_handler("text" if fmt == "text" else "json", open(os.devnull, "w")))  # noqa: SIM115 (held for the process's life)
    root.setLevel(logging.INFO)


async def measure(index: Path, student: Path, texts: Sequence[str], requests: int, blocks: int) -> list[float]:
    """ms of the event-loop thread's CPU per request, one figure per block of `requests`."""
    from service.http.app import create_app
    from service.settings import ServiceSettings

    app = create_app(ServiceSettings(index=index, student=student))
    async with app.router.lifespan_context(app):
        while app.state.loader is None or app.state.loader.state[0] != "ready":
            await asyncio.sleep(0.1)
        for i in range(WARM_UP):
            await _one(app, f"{texts[i % len(texts)]} {i}")
        out = []
        for b in range(blocks):
            began = time.thread_time()
            for i in range(requests):
                n = WARM_UP + b * requests + i
                await _one(app, f"{texts[n % len(texts)]} {n}")
            out.append((time.thread_time() - began) / requests * 1e3)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--queries", type=Path, default=Path("/work/shared/data/scifact/queries.jsonl"))
    parser.add_argument("--requests", type=int, default=300, help="Requests per block.")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--log", choices=("json", "text", "off"), default="json",
                        help="Access log format, written to /dev/null (serve's default: json); off: none formatted.")
    args = parser.parse_args(argv)
    log_as_served(args.log)
    texts = [json.loads(line)["text"] for line in args.queries.open()]
    blocks = asyncio.run(measure(args.index, args.student, texts, args.requests, args.blocks))
    print(f"event-loop CPU ms/request: median {statistics.median(blocks):.3f} "
          f"(blocks {' '.join(f'{b:.3f}' for b in blocks)})")


if __name__ == "__main__":
    main()
