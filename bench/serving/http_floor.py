"""The CPU a served `POST /search` cannot go below on this machine, beside what `tandem serve` spends, in one run.

Why (issue 56): ≥ 1,000 rps on 2 cores leaves at most 2 ms of CPU a request to everything, the load client's share
included. This bench measures, with the same uvicorn (httptools, uvloop, no access log), the same number of
processes, the same wrk client and the same answer bytes:
1. `bare`: a plain ASGI app that reads the body and sends a fixed answer (the HTTP server's own floor);
2. `fastapi`: the smallest FastAPI route that still reads the body and validates it with a pydantic model
   (`model_validate_json`) and sends the answer (a framework's floor, no key, log, metrics or search);
3. `tandem`: `tandem serve` of this tree over `--index` with `--student` (when given), whose first answer to the
   first query becomes the answer bytes of 1 and 2.
Then `tandem`'s CPU a request, less the in-process encode + search (bench/serving/request_cpu.py's child), is what
its own request path costs above the server's floor. Rows take turns over `--rounds`.

    python -m bench.serving.http_floor --index BUNDLE --student DIR --processes 2 --connections 16 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel

from bench.harness.record import REPO, LoadSpan, command_line, machine
from bench.harness.servers import cpu_seconds, free_port, served, start_process, stop
from bench.serving.request_cpu import in_process, lua_script, wrk

ANSWER_ENV = "TANDEM_BENCH_ANSWER"  # the answer's file, read by the floor apps in each uvicorn worker


@cache
def _answer() -> bytes:
    """The answer bytes, read once per worker process."""
    return Path(os.environ[ANSWER_ENV]).read_bytes()


async def bare(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The HTTP server's floor: the body read to its end, a fixed answer sent."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    body = _answer()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Query(BaseModel):
    """The fields of a search body the floor validates (the rest pass through unread)."""

    query: str
    top_k: int = 10


fastapi_floor = FastAPI()


@fastapi_floor.post("/search")
async def search(request: Request) -> Response:
    """A framework's floor: FastAPI's routing, the body read and validated by pydantic, a fixed answer."""
    Query.model_validate_json(await request.body())
    return Response(_answer(), media_type="application/json")


def _uvicorn(app: str, port: int, processes: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--workers",
            str(processes), "--http", "httptools", "--loop", "uvloop", "--no-access-log", "--log-level", "warning"]


def _measure(url: str, pid: int, script: Path, connections: int, seconds: int) -> dict[str, float]:
    wrk(url, script, connections, 2)  # warm-up
    cpu0 = cpu_seconds(pid)
    n, errors, client, lat, _ = wrk(url, script, connections, seconds)
    return {"rps": n / seconds, "errors": errors, "server_ms": (cpu_seconds(pid) - cpu0) / max(n, 1) * 1e3,
            "client_ms": client / max(n, 1) * 1e3, "p50": lat.get("50", float("nan")),
            "p99": lat.get("99", float("nan"))}


def _floor(app: str, work: Path, processes: int, script: Path, connections: int, seconds: int) -> dict[str, float]:
    port = free_port()
    process = start_process(_uvicorn(app, port, processes), work / f"{app.rsplit(':', 1)[1]}.log")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
            _wait_post(client, process)
            return _measure(f"http://127.0.0.1:{port}", process.pid, script, connections, seconds)
    finally:
        stop(process)


def _wait_post(client: httpx.Client, process: subprocess.Popen[bytes]) -> None:
    """Until POST /search answers 200 (the floor apps have no readiness route)."""
    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"the floor server exited with {process.returncode}")
        try:
            if client.post("/search", json={"query": "ready", "top_k": 10}).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError("the floor server did not answer within 60 s")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--queries", type=Path, default=Path("/work/shared/data/scifact/queries.jsonl"))
    parser.add_argument("--processes", type=int, default=2, help="Server processes, for every row.")
    parser.add_argument("--connections", type=int, default=16, help="wrk's connections (closed loop).")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--env", action="append", default=[], help="TANDEM_X=VALUE for tandem serve; repeat.")
    args = parser.parse_args(argv)
    texts = [json.loads(line)["text"] for line in args.queries.open()]
    env = {"TANDEM_PROCESSES": str(args.processes), **dict(e.split("=", 1) for e in args.env)}
    span = LoadSpan()
    work = Path(tempfile.mkdtemp(prefix="http-floor-"))
    script = lua_script(texts, work / "bodies.lua")
    texts_file = work / "texts.json"
    texts_file.write_text(json.dumps(texts[:1000]))
    answer = work / "answer.json"
    os.environ[ANSWER_ENV] = str(answer)
    rows: dict[str, list[dict[str, float]]] = {}
    bare_ms: list[float] = []
    for _ in range(args.rounds):
        bare_ms.append(in_process(REPO, args.index, args.student, texts_file) * 1e3)
        with served(args.index, args.student, work / "tandem.log", env) as server:
            reply = server.client.post("/search", json={"query": texts[0], "top_k": 10})
            reply.raise_for_status()
            answer.write_bytes(reply.content)
            rows.setdefault("tandem", []).append(
                _measure(server.url, server.process.pid, script, args.connections, args.seconds))
        for name, app in (("bare", "bench.serving.http_floor:bare"),
                          ("fastapi", "bench.serving.http_floor:fastapi_floor")):
            rows.setdefault(name, []).append(
                _floor(app, work, args.processes, script, args.connections, args.seconds))
    print(f"{command_line(argv)}\n- Machine: {machine()}\n- {args.processes} server process(es); wrk -t1 "
          f"-c{args.connections} -d{args.seconds}s, {args.rounds} round(s), unique queries; answer "
          f"{answer.stat().st_size} bytes (tandem's to the first query); tandem settings: {env}\n")
    print("| server | rps | errors | p50 ms | p99 ms | server CPU ms/req | client CPU ms/req |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for name in ("bare", "fastapi", "tandem"):
        runs = rows[name]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {name} | {med['rps']:.0f} | {sum(r['errors'] for r in runs):.0f} | {med['p50']:.2f} | "
              f"{med['p99']:.2f} | {med['server_ms']:.3f} | {med['client_ms']:.3f} |")
    print(f"\ntandem's encode + search in process (bench/serving/request_cpu.py's child): "
          f"{' / '.join(f'{b:.3f}' for b in bare_ms)} ms of CPU a query\n"
          f"(medians over rounds; errors summed; logs in {work})\n- Load average: {span.text()}")


if __name__ == "__main__":
    main()
