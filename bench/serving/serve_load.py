"""End-to-end POST /search under open-loop load: index types at 100k and 1M documents, and overload.

Why: an operator sizing a deployment needs the whole request (HTTP, the real int8 student encoding
a real query, FAISS, rescoring, the document store) under concurrency, not the parts alone. Each
configuration is a bundle built by `tandem index build` from synthetic teacher-like vectors
(SciFact's teacher embeddings plus covariance-shaped noise, as in bench/index/index_types.py; index size
is what matters here), served by a real `tandem serve` on 127.0.0.1 and driven by `tandem.loadtest`
(open loop: no coordinated omission) with SciFact's test queries.

0. Bare limit, per size × index type, before the server starts (bench/serving/bare_limit.py): one process per
   available core, each looping the student's encode plus the bundle's search with the server's settings,
   no HTTP; their queries/s summed. The server's figures below are read against it on the same cores.
1. Ladder, per size × index type: open-loop steps from `--start-rps`, doubling until a step fails
   (an error, under 95% of the rate answered, or p99 over `--p99-ms`), then bisected. The first
   step's latency is the unloaded latency; the highest passing step is the sustained throughput, and
   sustained / bare limit is the share of the machine's limit that the server delivers.
   Before the ladder (whose last steps overload the server), one step at half the bare limit
   (`--half-duration`): its p50/p99 and errors.
2. Acceptance, on `--accept` (default 100k binary, int8 rescoring): `--accept-rps` for
   `--accept-duration` s; then twice the sustained rate (overload): the share shed with 429/503 and
   how fast, the accepted requests' p99, the server's memory; then a recovery run at half the
   sustained rate.

    python -m bench.serving.serve_load --student .tandem/students/scifact-full
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np

from bench.encoding.encode_latency import DEFAULT_SCIFACT, load_queries
from bench.harness.record import (
    REPO,
    LoadSpan,
    add_output_args,
    command_line,
    cpu_flag_map,
    cpu_flags,
    cpu_model,
    publish,
    start_logging,
)
from bench.harness.servers import (
    Step,
    free_port,
    judge,
    process_tree,
    rss_mib,
    start_process,
    stop,
    tandem_serve_cmd,
    wait_ready,
)
from bench.index.index_types import DEFAULT_REFERENCE, bundle_for, synthetic_inputs
from bench.serving.bare_limit import BareLimit, describe
from bench.serving.bare_limit import measure as measure_bare
from service.settings import available_cores
from tandem.loadtest import Answer, format_report, run_loadtest

log = logging.getLogger("bench.serve_load")


@dataclass
class Config:
    size: int
    index: str
    quantization: str
    steps: list[Step] = field(default_factory=list)
    rss_mb: float = 0.0
    bare: BareLimit | None = None  # before the server started
    bare_after: BareLimit | None = None  # after it stopped: the machine's limit drifts within the hour
    half: Step | None = None  # open loop at half the bare limit

    @property
    def label(self) -> str:
        return f"{self.index}-{self.quantization}"

    @property
    def sustained(self) -> Step | None:
        passing = [s for s in self.steps if s.passed]
        return max(passing, key=lambda s: s.rps) if passing else None

    @property
    def bare_qps(self) -> float | None:
        """The bare limit the server is read against: the mean of the loops before and after it, which bracket
        the ladder, so a machine that drifts during the run moves both sides of the ratio alike."""
        measured = [b.qps for b in (self.bare, self.bare_after) if b is not None]
        return sum(measured) / len(measured) if measured else None

    @property
    def ratio(self) -> float | None:
        """Sustained rps over the bare limit's queries/s (`bare_qps`); None without either."""
        top, bare = self.sustained, self.bare_qps
        return top.rps / bare if top and bare else None


# --- data and bundles ----------------------------------------------------------------------------------------

# --- the server ----------------------------------------------------------------------------------------------

class Server:
    """`tandem serve` in a child process, with its resident memory readable while it runs."""

    def __init__(self, bundle: Path, student: Path, env: dict[str, str], log_path: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = start_process(tandem_serve_cmd(bundle, student, port), log_path,
                                     {"TANDEM_LOG_FORMAT": "text", **env})
        with httpx.Client(base_url=self.url, timeout=10.0, trust_env=False) as client:
            wait_ready(client, self.process)

    def rss_mb(self, field_name: str = "VmRSS") -> float:
        """The server's memory field, summed with its worker processes' (`--processes N`); memory-mapped bundle
        pages the processes share count once per process, so the sum is an upper bound."""
        values = [rss_mib(p, field_name) for p in process_tree(self.process.pid)]
        return sum(v for v in values if v is not None) if values[0] is not None else float("nan")

    def alive(self) -> bool:
        return self.process.poll() is None


# --- load ----------------------------------------------------------------------------------------------------

@dataclass
class Shed:
    """Answers other than 2xx, and how long the refused requests took from their scheduled send."""

    refused_ms: list[float] = field(default_factory=list)

    def record(self, due: float, done: float, response: Answer) -> None:
        if response.status in (429, 503):
            self.refused_ms.append((done - due) * 1e3)


def run_step(url: str, rps: float, duration: float, queries: list[str], p99_ms: float,
             shed: Shed | None = None) -> Step:
    report = run_loadtest(url, rps, duration, queries, {}, top_k=10, on_response=shed.record if shed else None)
    step = judge(report, p99_ms)
    log.info("%s → %s", format_report(report).replace("\n", " | "), step.why)
    return step


def ladder(url: str, queries: list[str], args: argparse.Namespace) -> list[Step]:
    """Double the rate until a step fails, then bisect between the last pass and the first failure."""
    steps: list[Step] = []

    def probe(rps: float) -> Step:
        step = run_step(url, rps, args.step_duration, queries, args.p99_ms)
        steps.append(step)
        time.sleep(args.rest)
        return step

    rps, good, bad = args.start_rps, 0.0, 0.0
    while rps <= args.max_rps:
        if not probe(rps).passed:
            bad = rps
            break
        good, rps = rps, rps * 2
    for _ in range(args.bisect if bad and good else 0):
        mid = float(round((good + bad) / 20) * 10) if good >= 20 else (good + bad) / 2  # round rates to 10s
        if mid in (good, bad):
            break
        if probe(mid).passed:
            good = mid
        else:
            bad = mid
    return sorted(steps, key=lambda s: s.rps)


@dataclass
class Acceptance:
    steady: Step
    overload: Step
    refused_p50_ms: float
    refused_p99_ms: float
    recovery: Step
    rss_mb: dict[str, float]
    alive: bool


def acceptance(server: Server, queries: list[str], sustained: float, args: argparse.Namespace) -> Acceptance:
    rss = {"before": server.rss_mb()}
    steady = run_step(server.url, args.accept_rps, args.accept_duration, queries, args.accept_p99_ms)
    rss["after steady"] = server.rss_mb()
    time.sleep(args.rest)
    peak = [server.rss_mb()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            if server.alive():
                peak.append(server.rss_mb())

    sampler = threading.Thread(target=sample, name="rss")
    sampler.start()
    shed = Shed()
    overload = run_step(server.url, 2 * sustained, args.overload_duration, queries, args.overload_p99_ms, shed)
    done.set()
    sampler.join()
    rss["peak during overload"] = max(peak)
    rss["after overload"] = server.rss_mb()
    time.sleep(args.rest)
    recovery = run_step(server.url, sustained / 2, args.step_duration, queries, args.p99_ms)
    rss["after recovery"] = server.rss_mb()
    refused = np.asarray(shed.refused_ms) if shed.refused_ms else np.asarray([float("nan")])
    return Acceptance(steady=steady, overload=overload, refused_p50_ms=float(np.percentile(refused, 50)),
                      refused_p99_ms=float(np.percentile(refused, 99)), recovery=recovery, rss_mb=rss,
                      alive=server.alive())


# --- report --------------------------------------------------------------------------------------------------

def acceptance_lines(accept: Acceptance, args: argparse.Namespace) -> list[str]:
    steady, overload, recovery = accept.steady, accept.overload, accept.recovery
    status = overload.report.status
    total = sum(status.values()) + sum(overload.report.errors.values())
    shed = sum(n for code, n in status.items() if code in ("429", "503"))
    return [
        f"- **{steady.rps:g} rps for {args.accept_duration:g} s**: p99 {steady.ms('p99'):.1f} ms "
        f"(bound {args.accept_p99_ms:g} ms), {steady.report.failures} errors → "
        f"**{'met' if steady.passed else 'MISSED'}**",
        f"- **Overload at {overload.rps:g} rps** (twice the sustained rate) for {args.overload_duration:g} s: "
        f"{shed} of {total} requests ({shed / max(total, 1):.0%}) shed with 429/503, answered in p50 "
        f"{accept.refused_p50_ms:.1f} ms / p99 {accept.refused_p99_ms:.1f} ms from their scheduled send; accepted "
        f"requests p99 **{overload.ms('p99'):.1f} ms** (bound {args.overload_p99_ms:g} ms); other failures "
        f"{overload.report.failures - shed}; server alive afterwards: **{'yes' if accept.alive else 'NO'}**",
        "- Server resident memory (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in accept.rss_mb.items()),
        f"- **Recovery** at {recovery.rps:g} rps right after: p99 {recovery.ms('p99'):.1f} ms, "
        f"{recovery.report.failures} errors → **{'recovered' if recovery.passed else 'NOT recovered'}**",
    ]


def machine_line() -> str:
    """The CPU, its flags and the cores this run used: figures from different machines read side by side."""
    return (f"{cpu_model()} ({cpu_flags()}), {available_cores()} of {os.cpu_count()} cores available "
            "(server, load generator and bare-limit workers share them)")


def limit_lines(configs: list[Config], args: argparse.Namespace) -> list[str]:
    """The table of the bare limit beside the server's sustained rate and the half-limit step."""
    measured = [c for c in configs if c.bare is not None]
    if not measured:
        return []
    lines = ["", "## The limit beside the server", "",
             "| docs | index | bare limit q/s (workers) | bare after q/s | bare per-query p50 / p99 ms | sustained rps "
             f"(p99 ≤ {args.p99_ms:g} ms) | sustained / bare | half the limit: rps | p50 ms | p99 ms | errors |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in measured:
        assert c.bare is not None
        top, half = c.sustained, c.half
        sustained = f"{top.rps:g}" if top else "—"
        ratio = f"{c.ratio:.3f}" if c.ratio is not None else "—"
        at_half = (f"{half.rps:.0f} | {half.ms('p50'):.1f} | {half.ms('p99'):.1f}"
                   f"{'' if half.passed else ' ✗'} | {half.report.failures}") if half else "— | — | — | —"
        after = f"{c.bare_after.qps:.1f}" if c.bare_after else "—"
        lines.append(f"| {c.size:,} | {c.label} | {c.bare.qps:.1f} ({c.bare.workers}) | {after} | "
                     f"{c.bare.query_p50_ms:.2f} / {c.bare.query_p99_ms:.2f} | {sustained} | {ratio} | {at_half} |")
    bare = measured[0].bare
    assert bare is not None
    lines += ["", f"Bare limit: one spawned process per available core, each opening the bundle and the "
              f"{bare.precision} student as `tandem serve` does and looping the student's `encode_counted` then "
              f"`models.search.search` (dense, top_k {bare.top_k}, oversample {bare.oversample}, "
              f"{bare.encode_threads} encode / {bare.search_threads} search threads) over the queries for "
              f"{args.bare_duration:g} s after {args.bare_warmup:g} s of warm-up, no HTTP; queries/s summed over "
              f"the workers, measured before the server started and again after it stopped (bare after; "
              f"`--no-bare-after` skips it). The ratio reads the sustained rate against the mean of the two, "
              f"which bracket the ladder: the machine's limit drifts within the hour. The sustained rate is the "
              f"highest passing ladder step, so the ratio is only as fine as the ladder (`--bisect`). "
              f"Half the limit: open loop for "
              f"{args.half_duration:g} s, before the ladder; ✗: an error, under 95% answered, or p99 over "
              f"{args.half_p99_ms:g} ms."]
    return lines


def render(configs: list[Config], accept: Acceptance | None, accept_label: str, command: str, setup: str,
           load: str, args: argparse.Namespace) -> str:
    import faiss
    import onnxruntime

    sizes = " and ".join(f"{size:,}" for size in dict.fromkeys(c.size for c in configs))
    lines = [
        f"# End-to-end POST /search under open-loop load: {sizes} documents", "", f"Command: `{command}`", "",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {machine_line()}; "
        f"python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, faiss {faiss.__version__}; "
        f"load average {load}",
        f"- Setup: {setup}", "",
        f"| docs | index | unloaded p50 ms | unloaded p99 ms | sustained rps (p99 ≤ {args.p99_ms:g} ms) "
        "| p99 ms there | server RSS MB | ladder (rps: p99 ms) |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in configs:
        first, top = c.steps[0], c.sustained
        trail = ", ".join(f"{s.rps:g}: {s.ms('p99'):.1f}{'' if s.passed else ' ✗'}" for s in c.steps)
        sustained = f"{top.rps:g} | {top.ms('p99'):.1f}" if top else "— | —"
        lines.append(f"| {c.size:,} | {c.label} | {first.ms('p50'):.1f} | {first.ms('p99'):.1f} | {sustained} "
                     f"| {c.rss_mb:.0f} | {trail} |")
    lines += ["", "✗: the step failed (an error, under 95% of the rate answered, or p99 over the bound). "
              "`binary` serves Hamming top 4·k rescored against memory-mapped int8 codes.", *limit_lines(configs, args)]
    if accept is not None:
        lines += ["", f"## Acceptance: {accept_label}", "", *acceptance_lines(accept, args), "", "```",
                  *(format_report(s.report) for s in (accept.steady, accept.overload, accept.recovery)), "```"]
    return "\n".join(lines)


def step_json(step: Step) -> dict[str, object]:
    return {"rps": step.rps, "passed": step.passed, "why": step.why, "report": step.report.model_dump()}


def results_json(configs: list[Config], accept: Acceptance | None, command: str, setup: str,
                 args: argparse.Namespace) -> dict[str, object]:
    """Every measured figure of the run, with the machine it ran on, for `--json`."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "command": command, "setup": setup,
        "cpu": {"model": cpu_model(), "flags": cpu_flag_map(), "cores_available": available_cores(),
                "cores_visible": os.cpu_count()},
        "p99_ms": args.p99_ms,
        "configs": [{
            "docs": c.size, "index": c.label, "server_rss_mb": c.rss_mb,
            "bare_limit": c.bare.as_dict() if c.bare else None,
            "bare_limit_after": c.bare_after.as_dict() if c.bare_after else None, "bare_qps": c.bare_qps,
            "sustained_rps": c.sustained.rps if c.sustained else None, "sustained_over_bare": c.ratio,
            "half_limit": step_json(c.half) if c.half else None,
            "ladder": [step_json(s) for s in c.steps],
        } for c in configs],
        "acceptance": None if accept is None else {
            "steady": step_json(accept.steady), "overload": step_json(accept.overload),
            "refused_p50_ms": accept.refused_p50_ms, "refused_p99_ms": accept.refused_p99_ms,
            "recovery": step_json(accept.recovery), "rss_mb": accept.rss_mb, "alive": accept.alive,
        },
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="End-to-end /search latency and throughput under open-loop load.")
    parser.add_argument("--student", type=Path, required=True, help="Exported student directory (int8 served).")
    parser.add_argument("--sizes", default="100000,1000000", help="Comma-separated corpus sizes.")
    parser.add_argument("--types", default="flat-float,flat-int8,flat-binary,hnsw-float",
                        help="Comma-separated INDEX-QUANTIZATION pairs.")
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--queries", type=Path, default=Path(os.environ.get("TANDEM_SCIFACT_DIR", DEFAULT_SCIFACT)))
    parser.add_argument("--start-rps", type=float, default=5.0)
    parser.add_argument("--max-rps", type=float, default=1280.0)
    parser.add_argument("--bisect", type=int, default=2, help="Bisection steps after the doubling.")
    parser.add_argument("--step-duration", type=float, default=15.0)
    parser.add_argument("--p99-ms", type=float, default=50.0, help="p99 bound of a passing ladder step.")
    parser.add_argument("--rest", type=float, default=2.0, help="Seconds between steps.")
    parser.add_argument("--bare-duration", type=float, default=15.0,
                        help="Seconds of the bare-limit loop (encode + search, no HTTP); 0 skips it and the "
                        "half-limit step.")
    parser.add_argument("--bare-after", action=argparse.BooleanOptionalAction, default=True,
                        help="Measure the bare limit again once the server has stopped, and read the server "
                        "against the mean of both.")
    parser.add_argument("--bare-warmup", type=float, default=3.0, help="Seconds each bare-limit worker warms up.")
    parser.add_argument("--bare-workers", type=int, default=None,
                        help="Bare-limit processes (default: the cores available to this run).")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="Seconds of warm-up at a quarter of the bare limit (50 rps without one), after 2 s at "
                        "10 rps, before the half-limit step and the ladder.")
    parser.add_argument("--half-duration", type=float, default=15.0, help="Seconds of the step at half the limit.")
    parser.add_argument("--half-p99-ms", type=float, default=25.0, help="p99 bound of the half-limit step.")
    parser.add_argument("--accept", default="100000:flat-binary", help="SIZE:INDEX-QUANTIZATION, or 'none'.")
    parser.add_argument("--accept-rps", type=float, default=200.0)
    parser.add_argument("--accept-duration", type=float, default=60.0)
    parser.add_argument("--accept-p99-ms", type=float, default=25.0)
    parser.add_argument("--overload-duration", type=float, default=30.0)
    parser.add_argument("--overload-p99-ms", type=float, default=100.0)
    parser.add_argument("--env", action="append", default=[], metavar="TANDEM_X=VALUE",
                        help="Server settings (repeatable), e.g. TANDEM_BATCH_MAX_QUERIES=8.")
    parser.add_argument("--work", type=Path, default=REPO / ".tandem" / "bench" / "serve")
    add_output_args(parser)
    parser.add_argument("--section", default="serve-load", help="Name of the record: docs/lab/<date>-<section>.md.")
    parser.add_argument("--json", type=Path, help="Also write every figure of the run here.")
    return parser.parse_args(argv)


def bare_limit(bundle: Path, student: Path, queries: list[str], env: dict[str, str],
               args: argparse.Namespace) -> BareLimit:
    """The bare loop with this run's settings: the same before the server starts and after it stops."""
    return measure_bare(bundle, student, queries, workers=args.bare_workers, warmup_s=args.bare_warmup,
                        duration_s=args.bare_duration, env=env)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging()
    env = dict(item.split("=", 1) for item in args.env)
    queries, described = load_queries(args.queries, 10_000)
    accept_size, accept_label = (None, "") if args.accept == "none" else args.accept.split(":", 1)
    span = LoadSpan()
    configs: list[Config] = []
    accept: Acceptance | None = None
    for size in (int(s) for s in args.sizes.split(",")):
        inputs = synthetic_inputs(args.work / f"n{size}", size, args.reference)
        for label in args.types.split(","):
            index, quantization = label.split("-", 1)
            bundle = bundle_for(inputs, index, quantization)
            config = Config(size, index, quantization)
            if args.bare_duration > 0:  # before the server starts: nothing else on the cores
                config.bare = bare_limit(bundle, args.student, queries, env, args)
                log.info("bare limit %d %s: %s", size, label, describe(config.bare))
            server = Server(bundle, args.student, env, args.work / f"server-{size}-{label}.log")
            try:
                run_step(server.url, 10, 2, queries, float("inf"))  # warm-up: the first queries, then
                # connections, caches and the admission's pace estimate, at a quarter of the limit
                run_step(server.url, config.bare.qps / 4 if config.bare else 50, args.warmup, queries, float("inf"))
                if config.bare is not None:  # before the ladder, whose last steps overload the server
                    config.half = run_step(server.url, config.bare.qps / 2, args.half_duration, queries,
                                           args.half_p99_ms)
                    time.sleep(args.rest)
                config.steps = ladder(server.url, queries, args)
                config.rss_mb = server.rss_mb("VmHWM")
                top = config.sustained
                if accept_size is not None and int(accept_size) == size and label == accept_label and top:
                    accept = acceptance(server, queries, top.rps, args)
            finally:
                stop(server.process)
            if args.bare_duration > 0 and args.bare_after:
                config.bare_after = bare_limit(bundle, args.student, queries, env, args)
                log.info("bare limit after %d %s: %s", size, label, describe(config.bare_after))
            configs.append(config)
    command = command_line()
    setup = (
        f"synthetic corpora of SciFact-like teacher vectors (768-d, bench/index/index_types.py), bundles built by "
        f"`tandem index build --embeddings`; `tandem serve` with the int8 student `{args.student.name}` "
        f"({'defaults' if not env else ', '.join(f'{k}={v}' for k, v in env.items())}); queries: {described}; "
        f"top_k 10; warm-up 2 s at 10 rps then {args.warmup:g} s at a quarter of the bare limit; "
        f"ladder steps of {args.step_duration:g} s from {args.start_rps:g} rps, doubling then "
        f"{args.bisect} bisections; latencies from the scheduled send (open loop)."
    )
    section = render(configs, accept, f"{accept_size} documents, {accept_label}" if accept_size else "",
                     command, setup, span.text(), args)
    publish(args.lab, args.section, section, write=not args.no_write)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results_json(configs, accept, command, setup, args), indent=2) + "\n")
        log.info("wrote %s", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
