"""Server CPU per `POST /search` outside encode and search, and the load client's CPU beside it, per source tree.

Why (issue 56): with a static student a query's own work is tens of microseconds, so what a served request costs
beyond it (HTTP, parsing, validation, batching, logging, metrics, rendering) decides the rate. Per tree and student:
1. in a child process of the tree's code, CPU (time.process_time) of `encode_counted` + `search` per query, as the
   server calls them (bench/serving/bare_limit.py's loop), over the same query texts;
2. `tandem serve` from the tree (default settings), wrk closed-loop (`--connections`, one thread) posting unique
   queries (a counter appended, so the query cache never answers), the server's CPU (/proc stat, every thread)
   and wrk's (its rusage) over the timed run, divided by the requests answered;
3. outside = served − in-process; and, measured directly, the CPU of the server's main thread alone (its event
   loop: HTTP, parsing, validation, admission, logging, metrics, rendering; batch workers encode and search).
Trees and rounds take turns, so a slow minute of the shared machine falls on all.

With `--floors`, each round also serves, with the same uvicorn (httptools, uvloop, no access log), the same number of
processes (`--env TANDEM_PROCESSES=N`), the same wrk client and the same answer bytes (tandem's first answer):
`floor-asgi`, a plain ASGI app that reads the body and sends the answer (the HTTP server's floor), and
`floor-fastapi`, the smallest FastAPI route that reads the body, validates it with a pydantic model and sends the
answer (a framework's floor: no key, log, metrics or search). Beside them, tandem's CPU a request says what its own
request path costs above what no Python service on this machine can go below.

    python -m bench.serving.request_cpu --index BUNDLE --student six=DIR6 --student static=DIRS \
        --tree before=/tmp/before-tree --tree after=. --rounds 2 [--floors]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel

from bench.harness.record import LoadSpan, command_line, machine
from bench.harness.servers import CLOCK_TICKS, cpu_seconds, free_port, served, start_process, stop, wait_ready

BARE = """
import json, sys, time
from pathlib import Path
import faiss
from threadpoolctl import threadpool_limits
from models.bundle.version import Bundle
from models.bundle.versions import resolve_bundle
from models.encoders.student import StudentEncoder
from models.search import SearchOptions, search
from service.settings import ServiceSettings
index, student, texts = sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text())
settings = ServiceSettings(index=Path(index), student=Path(student))
bundle = Bundle(resolve_bundle(settings.index))
encoder = StudentEncoder(settings.student, settings.student_precision, settings.encode_threads)
faiss.omp_set_num_threads(settings.search_threads)
threadpool_limits(limits=settings.search_threads, user_api="blas")
options = SearchOptions(top_k=10)
def one(text):
    vectors, _ = encoder.encode_counted([text], batch_size=settings.batch_max_queries)
    search(bundle, vectors, [text], options, settings.binary_oversample)
for i, text in enumerate(texts[:100]):
    one(text + f" w{i}")
began = time.process_time()
for i, text in enumerate(texts):
    one(text + f" {i}")
print(json.dumps((time.process_time() - began) / len(texts)))
"""

LUA = """
local bodies = {%s}
local n = 0
request = function()
  n = n + 1
  local q = bodies[(n %% #bodies) + 1]
  return wrk.format("POST", "/search", {["Content-Type"] = "application/json"},
                    '{"query": "' .. q .. ' ' .. n .. '", "top_k": 10}')
end
"""


def loop_cpu_seconds(pid: int) -> float:
    """utime + stime of the server's main thread alone: its event loop, which does all of a request's work but the
    encode and the search when batch workers run those (TANDEM_WORKERS ≥ 1, the default)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def lua_script(texts: Sequence[str], path: Path) -> Path:
    """wrk's Lua: each request one query text (JSON-escaped, in a Lua long string) with a counter appended."""
    quoted = ",".join(f"[==[{json.dumps(t)[1:-1]}]==]" for t in texts)
    path.write_text(LUA % quoted)
    return path


def in_process(tree: Path, index: Path, student: Path, texts_file: Path) -> float:
    """CPU seconds per query of encode + search in a child of `tree`'s code."""
    env = {**os.environ, "PYTHONPATH": f"{tree}:{tree / 'client'}"}
    out = subprocess.run([sys.executable, "-c", BARE, str(index), str(student), str(texts_file)], cwd=tree,
                         env=env, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def wrk(url: str, script: Path, connections: int, seconds: int) -> tuple[int, int, float, dict[str, float], str]:
    """(requests, non-2xx or socket errors, client CPU seconds, latency percentiles ms, raw output) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
                         check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = sum(int(x) for x in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    errors += sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    lat = {p: float(v) * unit[u] for p, v, u in re.findall(r"\s(50|90|99)%\s+([\d.]+)(us|ms|s)\b", out)}
    return requests, errors, client, lat, out


ANSWER_ENV = "TANDEM_BENCH_ANSWER"  # the answer's file, which the floor apps read in each uvicorn worker


@cache
def _answer() -> bytes:
    """The answer bytes, read once per worker process."""
    return Path(os.environ[ANSWER_ENV]).read_bytes()


async def floor_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
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


class FloorQuery(BaseModel):
    """The fields of a search body the FastAPI floor validates."""

    query: str
    top_k: int = 10


floor_fastapi = FastAPI()


@floor_fastapi.post("/search")
async def floor_search(request: Request) -> Response:
    """A framework's floor: FastAPI's routing, the body read and validated by pydantic, a fixed answer."""
    FloorQuery.model_validate_json(await request.body())
    return Response(_answer(), media_type="application/json")


@floor_fastapi.get("/readyz")
async def floor_ready() -> Response:
    """For the harness's `wait_ready` (declared after /search, so /search is matched as before)."""
    return Response()


def floor_run(name: str, work: Path, processes: int, script: Path, connections: int,
              seconds: int) -> dict[str, float]:
    """One wrk run against a floor app (`floor_asgi` or `floor_fastapi`) served by uvicorn as tandem serve is."""
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", f"bench.serving.request_cpu:{name}", "--host", "127.0.0.1", "--port",
           str(port), "--workers", str(processes), "--http", "httptools", "--loop", "uvloop", "--no-access-log",
           "--log-level", "warning"]
    process = start_process(cmd, work / f"{name}.log")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
            wait_ready(client, process, timeout_s=60)  # GET /readyz: floor_asgi answers any path
        wrk(f"http://127.0.0.1:{port}", script, connections, 2)  # warm-up
        cpu0 = cpu_seconds(process.pid)
        n, errors, client_cpu, lat, _ = wrk(f"http://127.0.0.1:{port}", script, connections, seconds)
        return {"rps": n / seconds, "ok_rps": (n - errors) / seconds, "errors": errors,
                "served_ms": (cpu_seconds(process.pid) - cpu0) / max(n, 1) * 1e3, "bare_ms": float("nan"),
                "outside_ms": float("nan"), "loop_ms": float("nan"), "client_ms": client_cpu / max(n, 1) * 1e3,
                "p50": lat.get("50", float("nan")), "p99": lat.get("99", float("nan"))}
    finally:
        stop(process)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--student", action="append", required=True, help="NAME=DIR; repeat.")
    parser.add_argument("--tree", action="append", default=None, help="NAME=DIR of a source tree; repeat.")
    parser.add_argument("--queries", type=Path, default=Path("/work/shared/data/scifact/queries.jsonl"))
    parser.add_argument("--connections", type=int, default=2, help="wrk's connections (closed loop).")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--env", action="append", default=[], help="TANDEM_X=VALUE for every server; repeat.")
    parser.add_argument("--floors", action="store_true",
                        help="Also serve the plain ASGI and smallest FastAPI floors each round (same processes).")
    args = parser.parse_args(argv)
    trees = dict(t.split("=", 1) for t in (args.tree or ["this=."]))
    students = dict(s.split("=", 1) for s in args.student)
    env = dict(e.split("=", 1) for e in args.env)
    texts = [json.loads(line)["text"] for line in args.queries.open()]
    span = LoadSpan()
    work = Path(tempfile.mkdtemp(prefix="request-cpu-"))
    texts_file = work / "texts.json"
    texts_file.write_text(json.dumps(texts[:1000]))
    script = lua_script(texts, work / "bodies.lua")
    answer = work / "answer.json"
    os.environ[ANSWER_ENV] = str(answer)
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for sname, sdir in students.items():
            for tname, tdir in trees.items():
                tree = Path(tdir).resolve()
                bare = in_process(tree, args.index, Path(sdir), texts_file)
                with served(args.index, Path(sdir), work / f"{tname}-{sname}.log", env, cwd=tree) as server:
                    if not answer.exists():  # the floors send tandem's answer to a query
                        answer.write_bytes(server.client.post("/search", json={"query": texts[0]}).content)
                    wrk(server.url, script, args.connections, 2)  # warm-up
                    pid = server.process.pid
                    cpu0, loop0 = cpu_seconds(pid), loop_cpu_seconds(pid)
                    n, errors, client, lat, raw = wrk(server.url, script, args.connections, args.seconds)
                    served_cpu = (cpu_seconds(pid) - cpu0) / max(n, 1)
                    loop_cpu = (loop_cpu_seconds(pid) - loop0) / max(n, 1)
                (work / f"{tname}-{sname}.wrk.txt").open("a").write(raw)
                rows.setdefault((sname, tname), []).append({
                    "rps": n / args.seconds, "ok_rps": (n - errors) / args.seconds, "errors": errors,
                    "served_ms": served_cpu * 1e3, "bare_ms": bare * 1e3,
                    "outside_ms": (served_cpu - bare) * 1e3, "loop_ms": loop_cpu * 1e3,
                    "client_ms": client / max(n, 1) * 1e3,
                    "p50": lat.get("50", float("nan")), "p99": lat.get("99", float("nan"))})
        if args.floors:
            processes = int(env.get("TANDEM_PROCESSES", "1"))
            for name in ("floor_asgi", "floor_fastapi"):
                rows.setdefault((name, "-"), []).append(
                    floor_run(name, work, processes, script, args.connections, args.seconds))
    print(f"{command_line(argv)}\n- Machine: {machine()}\n- wrk -t1 -c{args.connections} -d{args.seconds}s, "
          f"{args.rounds} round(s), unique queries; settings: {env or 'defaults'}\n")
    print("| student | tree | rps | 2xx rps | errors | p50 ms | p99 ms | server CPU ms/req | encode+search CPU ms/q | "
          "outside ms/req | event-loop thread CPU ms/req | client CPU ms/req |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (sname, tname), runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        ms = {k: "–" if med[k] != med[k] else f"{med[k]:.3f}" for k in ("bare_ms", "outside_ms", "loop_ms")}
        print(f"| {sname} | {tname} | {med['rps']:.0f} | {med['ok_rps']:.0f} | "
              f"{sum(r['errors'] for r in runs):.0f} | {med['p50']:.2f} | "
              f"{med['p99']:.2f} | {med['served_ms']:.3f} | {ms['bare_ms']} | {ms['outside_ms']} | "
              f"{ms['loop_ms']} | {med['client_ms']:.3f} |")
    print(f"\n(medians over rounds; errors summed; wrk's output and the servers' logs in {work})\n"
          f"- Load average: {span.text()}")


if __name__ == "__main__":
    main()
