"""`tandem loadtest`: an open-loop load generator for POST /search, with latency budgets.

Open loop: request i is sent at start + i / rps whatever happened to earlier ones, and its
latency is measured from that scheduled instant. A slow server therefore shows up as
latency instead of slowing the generator down (no coordinated omission). With a client
concurrency limit, a request due while the limit is reached is counted as `client_limit`,
never delayed.

The client is tandem.loadclient, keep-alive connections parsed by httptools on uvloop: a generator sharing
the cores with the server must stay cheap, or it measures itself (httpx spent 1.4 ms of CPU per request at
200 rps, aiohttp 0.34-0.45 ms; docs/decisions.md#the-load-generator).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from models.errors import InputError
from tandem.loadclient import Answer, ConnectionPool, Request

__all__ = ["Answer", "LoadReport", "Request", "Send", "format_report", "post_search", "run_loadtest"]

log = logging.getLogger(__name__)

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p99.9": 99.9}
DEFAULT_QUERIES = [
    "how do tides work", "parse a JSON string", "effects of vitamin D on bone density",
    "open a TCP connection", "what causes inflation", "sort a list in place", "symptoms of insulin resistance",
    "read a CSV file", "why is the sky blue", "compress files into a zip archive",
]


# on_response(scheduled send, answered, answer), both time.perf_counter(): e.g. to record the index version.
OnResponse = Callable[[float, float, Answer], None]
# send(query, top_k) → the request to make; POST /search by default, other APIs for benchmarks of peers.
Send = Callable[[str, int], Request]
_BUDGET_ITEM = re.compile(r"^(p50|p90|p99|p99\.9|max)=(\d+(?:\.\d+)?)(ms|s)$")


class LoadReport(BaseModel):
    url: str
    target_rps: float
    duration_s: float
    sent: int
    completed: int
    achieved_rps: float  # 2xx answers per second of the schedule
    latency_ms: dict[str, float]  # of 2xx answers, from the scheduled send time
    status: dict[str, int]  # HTTP status code → count
    errors: dict[str, int]  # client-side failures by kind (timeout, connect, client_limit, ...)
    budget: dict[str, float] = {}
    budget_missed: list[str] = []

    @property
    def failures(self) -> int:
        """Answers other than 2xx plus client-side failures."""
        return sum(self.errors.values()) + sum(n for code, n in self.status.items() if not code.startswith("2"))


def parse_budget(text: str) -> dict[str, float]:
    """`p50=5ms,p99=25ms,errors=0` → {"p50": 5.0, "p99": 25.0, "errors": 0.0} (latencies in milliseconds;
    `errors` bounds the answers that were not 2xx plus the client-side failures)."""
    budget = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if (errors := re.fullmatch(r"errors=(\d+)", item)) is not None:
            budget["errors"] = float(errors.group(1))
            continue
        match = _BUDGET_ITEM.match(item)
        if match is None:
            raise InputError(f"--budget: cannot read {item!r}; expected items like p50=5ms,p99=25ms,max=1s,errors=0")
        name, value, unit = match.groups()
        budget[name] = float(value) * (1000.0 if unit == "s" else 1.0)
    return budget


def read_queries(path: Path | None) -> list[str]:
    """BEIR queries JSONL (its `text`), or plain text with one query per line; blank lines are skipped."""
    if path is None:
        return DEFAULT_QUERIES
    queries = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read queries ({exc})") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                text = json.loads(line).get("text")
            except (json.JSONDecodeError, AttributeError) as exc:
                raise InputError(f"{path}:{number}: not a JSON object with a 'text' field ({exc})") from exc
            if not isinstance(text, str) or not text.strip():
                raise InputError(f"{path}:{number}: 'text' must be a non-empty string")
            queries.append(text)
        else:
            queries.append(line.strip())
    if not queries:
        raise InputError(f"{path}: no queries")
    return queries


class _Recorder:
    def __init__(self, on_response: OnResponse | None = None) -> None:
        self.on_response = on_response
        self.latencies: list[float] = []
        self.status: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.in_flight = 0


def post_search(query: str, top_k: int) -> Request:
    return Request("POST", "/search", json.dumps({"query": query, "top_k": top_k}).encode())


async def _one(pool: ConnectionPool, send: Send, query: str, top_k: int, due: float, rec: _Recorder) -> None:
    rec.in_flight += 1
    try:
        answer = await pool.request(send(query, top_k))
    except TimeoutError:
        rec.errors["timeout"] += 1
    except OSError as exc:  # refused, reset, or closed before the answer (loadclient.ServerDisconnected)
        rec.errors[type(exc).__name__] += 1
    else:
        done = time.perf_counter()
        rec.status[str(answer.status)] += 1
        if answer.ok:
            rec.latencies.append((done - due) * 1e3)
        if rec.on_response is not None:
            rec.on_response(due, done, answer)
    finally:
        rec.in_flight -= 1


async def _drive(url: str, rps: float, duration_s: float, queries: list[str], top_k: int,
                 concurrency_limit: int | None, timeout_s: float,
                 on_response: OnResponse | None, send: Send) -> tuple[_Recorder, int]:
    rec = _Recorder(on_response)
    total = int(rps * duration_s)
    async with ConnectionPool(url, timeout_s, concurrency_limit or 1000) as pool:
        tasks = []
        start = time.perf_counter() + 0.1
        for i in range(total):
            due = start + i / rps
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if concurrency_limit is not None and rec.in_flight >= concurrency_limit:
                rec.errors["client_limit"] += 1
                continue
            tasks.append(asyncio.create_task(_one(pool, send, queries[i % len(queries)], top_k, due, rec)))
        await asyncio.gather(*tasks)
    return rec, total


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run_loadtest(url: str, rps: float, duration_s: float, queries: list[str], budget: dict[str, float],
                 top_k: int = 10, concurrency_limit: int | None = None, timeout_s: float = 10.0,
                 on_response: OnResponse | None = None, send: Send = post_search) -> LoadReport:
    if rps <= 0 or duration_s <= 0:
        raise InputError("--rps and --duration must be positive")
    # uvloop, when installed (uvicorn[standard] brings it): 10-20% less of the generator's CPU per request, which
    # the server it measures shares (docs/decisions.md#the-load-generator)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        rec, sent = runner.run(
            _drive(url, rps, duration_s, queries, top_k, concurrency_limit, timeout_s, on_response, send)
        )
    latencies = np.asarray(rec.latencies)
    summary = {name: float(np.percentile(latencies, q)) for name, q in PERCENTILES.items()} if len(latencies) else {}
    if len(latencies):
        summary["max"] = float(latencies.max())
    missed = [f"{name}: {summary.get(name, float('inf')):.1f} ms > {limit:g} ms"
              for name, limit in budget.items() if name != "errors" and summary.get(name, float("inf")) > limit]
    report = LoadReport(
        url=url, target_rps=rps, duration_s=duration_s, sent=sent, completed=len(latencies),
        achieved_rps=len(latencies) / duration_s, latency_ms={k: round(v, 2) for k, v in summary.items()},
        status=dict(rec.status), errors=dict(rec.errors), budget=budget, budget_missed=missed,
    )
    if report.failures > budget.get("errors", float("inf")):
        report.budget_missed.append(f"errors: {report.failures} > {budget['errors']:g}")
    return report


def format_report(report: LoadReport) -> str:
    lines = [
        f"{report.url}: {report.sent} requests scheduled at {report.target_rps:g} rps for {report.duration_s:g} s",
        f"achieved {report.achieved_rps:.1f} rps of 2xx answers ({report.completed} completed)",
        "latency (ms, from the scheduled send): "
        + (", ".join(f"{k} {v:.1f}" for k, v in report.latency_ms.items()) or "no successful answers"),
        "status: " + (", ".join(f"{k}×{v}" for k, v in sorted(report.status.items())) or "none"),
        "errors: " + (", ".join(f"{k}×{v}" for k, v in sorted(report.errors.items())) or "none"),
    ]
    if report.budget:
        lines.append("budget: " + ("MISSED " + "; ".join(report.budget_missed) if report.budget_missed else "met"))
    return "\n".join(lines)
