"""Issue 46's acceptance run: one `tandem serve` process serving two real collections, each with its own student,
and the changes an operator makes to it under open-loop load.

1. A one-collection service (`--index/--student`, the SciFact bundle) answers POST /search as before collections;
   its resident memory once ready.
2. `tandem serve --config` with the SciFact collection only, then, under open-loop load (tandem.openloop: requests at a
   fixed rate on their own schedule, to both collections, to POST /search, and with three keys):
   - the demo corpus added by rewriting the config and SIGHUP (its own student);
   - the demo collection reloaded to another version and rolled back (/admin/collections/demo/reload, /rollback);
   - the key file rotated (key 'gone' replaced by 'new', seen by the file's watch).
   Each request's answer is checked against its send and answer instants (tandem.openloop.violations): before a
   change only the old answer, after it is seen complete only the new one. The record gives the counts, the
   failures (0 expected), both collections' top hits, and the resident memory before and after the demo collection
   was added, with /admin/status's memory of each collection.

    python -m bench.serving.collections_accept            # writes docs/lab/<date>-collections.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.harness.record import cpu_line, load_average, parse_with_output, publish, start_logging
from bench.harness.servers import free_port, rss_mib, served, start_process, stop, wait_ready
from models.bundle.versions import set_current
from models.paths import tandem_home
from tandem.demo import EXAMPLE_QUERY
from tandem.loadclient import Request
from tandem.openloop import OpenLoop, Record, Target, violations

TOKEN = "bench-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
KEYS = {"stay": "stay-key-0123456789", "gone": "gone-key-0123456789", "new": "new-key-0123456789"}
SCIFACT_QUERY = "vitamin D supplements and the risk of bone fractures"  # written here, not one of SciFact's queries
SETTLE_S = 8.0  # load kept on before, between and after the changes


def _keys(*ids: str) -> str:
    return "".join(f'[[key]]\nid = "{i}"\nkey = "{KEYS[i]}"\ncollections = ["*"]\n\n' for i in ids)


def _config(collections: dict[str, tuple[Path, Path]]) -> str:
    return "".join(f'[[collection]]\nname = "{name}"\nindex = "{index}"\nstudent = "{student}"\n\n'
                   for name, (index, student) in collections.items())


def _rewrite(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _target(name: str, path: str, key: str, query: str) -> Target:
    body = json.dumps({"query": query, "top_k": 3}).encode()
    return Target(name, Request("POST", path, body, headers=(("Authorization", f"Bearer {KEYS[key]}"),)))


def _until(condition: Callable[[], bool], what: str, limit_s: float = 600.0) -> float:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"never happened: {what}")
        time.sleep(0.05)
    return time.monotonic()


def _titles(answer: dict[str, Any]) -> list[str]:
    return [str(hit.get("title") or hit.get("id"))[:70] for hit in answer["results"]]


def one_collection(scifact: Path, student: Path, work: Path) -> dict[str, Any]:
    """`tandem serve --index --student`: POST /search answers; its resident memory once ready."""
    with served(scifact, student, work / "one.log") as server:
        response = server.client.post("/search", json={"query": SCIFACT_QUERY, "top_k": 3})
        response.raise_for_status()
        return {"status": response.status_code, "titles": _titles(response.json()),
                "rss_mib": rss_mib(server.process.pid, "VmRSS")}


def _version(record: Record) -> str | None:
    return record.answer.json()["index"]["version"] if record.answer is not None and record.status == 200 else None


def under_load(scifact: Path, student: Path, demo: Path, demo_student: Path, work: Path, rps: float) -> dict[str, Any]:
    root = work / "demo-root"  # two versions of the demo bundle (the same files), CURRENT v1, for the rollback
    for version in ("v1", "v2"):
        shutil.copytree(demo, root / version)
    set_current(root, "v1")
    config, keys = work / "collections.toml", work / "keys.toml"
    config.write_text(_config({"scifact": (scifact, student)}))
    keys.write_text(_keys("stay", "gone"))
    port = free_port()
    cmd = [sys.executable, "-m", "tandem", "serve", "--config", str(config), "--keys-file", str(keys),
           "--host", "127.0.0.1", "--port", str(port)]
    server = start_process(cmd, work / "two.log", env={"TANDEM_ADMIN_TOKEN": TOKEN, "TANDEM_WATCH_INTERVAL_S": "0.5"})
    out: dict[str, Any] = {}
    targets = [_target("scifact", "/collections/scifact/search", "stay", SCIFACT_QUERY),
               _target("search", "/search", "stay", SCIFACT_QUERY),
               _target("demo", "/collections/demo/search", "stay", EXAMPLE_QUERY),
               _target("gone", "/collections/scifact/search", "gone", SCIFACT_QUERY),
               _target("new", "/collections/scifact/search", "new", SCIFACT_QUERY)]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120.0, trust_env=False) as client:
            wait_ready(client, server)
            time.sleep(1.0)
            out["rss_one_mib"] = rss_mib(server.pid, "VmRSS")

            def collections() -> dict[str, Any]:
                answer: dict[str, Any] = client.get("/admin/collections", headers=ADMIN).json()["collections"]
                return answer

            marks: dict[str, float] = {}
            with OpenLoop(f"http://127.0.0.1:{port}", targets, rps) as load:
                time.sleep(SETTLE_S)
                _rewrite(config, _config({"scifact": (scifact, student), "demo": (root, demo_student)}))
                marks["add"] = time.monotonic()
                os.kill(server.pid, signal.SIGHUP)
                marks["added"] = _until(lambda: collections().get("demo", {}).get("state") == "ready", "demo ready")
                time.sleep(SETTLE_S)
                out["rss_two_mib"] = rss_mib(server.pid, "VmRSS")
                for action, body in (("reload", {"path": str(root / "v2")}), ("rollback", None)):
                    marks[action] = time.monotonic()
                    response = client.post(f"/admin/collections/demo/{action}", json=body, headers=ADMIN)
                    if response.status_code != 200:
                        raise RuntimeError(f"{action}: {response.status_code} {response.text}")
                    marks[f"{action} done"] = time.monotonic()
                    time.sleep(SETTLE_S)
                marks["rotate"] = time.monotonic()
                _rewrite(keys, _keys("stay", "new"))
                marks["rotated"] = _until(lambda: client.post(
                    "/collections/scifact/search", json={"query": "x"},
                    headers={"Authorization": f"Bearer {KEYS['new']}"}).status_code == 200, "the new key")
                time.sleep(SETTLE_S)
            out["status"] = client.get("/admin/status", headers=ADMIN).json()
            out["hits"] = {name: _titles(client.post(f"/collections/{name}/search", json={"query": q, "top_k": 3},
                                                     headers={"Authorization": f"Bearer {KEYS['stay']}"}).json())
                           for name, q in (("scifact", SCIFACT_QUERY), ("demo", EXAMPLE_QUERY))}
    finally:
        stop(server)
    out["records"], out["marks"] = load.records, marks
    return out


def _runs(values: list[str | None]) -> list[tuple[str | None, int]]:
    """[v1, v1, v2] → [(v1, 2), (v2, 1)]."""
    return [(value, len(list(run))) for value, run in itertools.groupby(values)]


def judge(records: Sequence[Record], marks: dict[str, float]) -> dict[str, list[Record]]:
    """Each target's requests its changes do not allow (tandem.openloop.violations)."""
    by: dict[str, list[Record]] = {}
    for record in records:
        by.setdefault(record.target, []).append(record)
    bad = {name: violations(by[name], marks["add"], marks["add"], {200}, {200}) for name in ("scifact", "search")}
    demo = by["demo"]
    bad["demo"] = violations(demo, marks["add"], marks["added"], {404}, {200}, {503})
    bad["demo"] += [r for r in demo if (r.answered < marks["reload"] and r.status == 200 and _version(r) != "v1")
                    or (marks["reload done"] < r.sent and r.answered < marks["rollback"] and _version(r) != "v2")
                    or (r.sent > marks["rollback done"] and _version(r) != "v1")]
    bad["gone"] = violations(by["gone"], marks["rotate"], marks["rotated"], {200}, {403})
    bad["new"] = violations(by["new"], marks["rotate"], marks["rotated"], {403}, {200})
    return bad


def render(command: str, one: dict[str, Any], run: dict[str, Any], rps: float, inputs: dict[str, Path]) -> str:
    records: list[Record] = run["records"]
    bad = judge(records, run["marks"])
    t0 = min(r.sent for r in records)
    lines = [
        "# Collections: two real collections in one process, changed under open-loop load (issue 46)", "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- command: `{command}`",
        f"- CPU: {cpu_line()}; load average at the end {load_average()[1]}",
        *(f"- {name}: `{path}`" for name, path in inputs.items()),
        f"- load: open loop (tandem.openloop), {rps:g} requests/s in all, cycling over the targets below; the "
        "service's default settings (one process)", "",
        "## One collection: POST /search as before collections", "",
        f"`tandem serve --index scifact --student`: POST /search {one['status']}, top 3 for '{SCIFACT_QUERY}': "
        + "; ".join(one["titles"]), "",
        f"Resident memory once ready: {one['rss_mib']:.0f} MiB.", "",
        "## Changes under load", "",
        "| change | began (s) | seen complete (s) |", "|---|---|---|",
    ]
    marks = run["marks"]
    for begin, end, what in (("add", "added", "demo added: config rewritten, SIGHUP"),
                             ("reload", "reload done", "demo reloaded to v2 (POST /admin/collections/demo/reload)"),
                             ("rollback", "rollback done", "demo rolled back to v1"),
                             ("rotate", "rotated", "key file rotated ('gone' → 'new', file watch)")):
        lines.append(f"| {what} | {marks[begin] - t0:.2f} | {marks[end] - t0:.2f} |")
    lines += ["", "| target | requests | statuses | failed |", "|---|---|---|---|"]
    allowed = {"scifact": "200", "search": "200 (POST /search: the default, SciFact)",
               "demo": "404 before the add, 200 once ready (v1, v2, v1)", "gone": "200 then 403",
               "new": "403 then 200"}
    total = 0
    for name in allowed:
        mine = [r for r in records if r.target == name]
        counts = Counter(r.status if r.error is None else r.error for r in mine)
        total += len(bad[name])
        lines.append(f"| {name}: {allowed[name]} | {len(mine)} | "
                     + ", ".join(f"{k}×{v}" for k, v in sorted(counts.items(), key=str)) + f" | {len(bad[name])} |")
    versions = Counter(_version(r) for r in records if r.target == "demo" and r.status == 200)
    lines += ["", "The demo collection's 200s by the version that answered, in the order sent: "
              + " → ".join(f"{v}×{n}" for v, n in _runs([_version(r) for r in sorted(records, key=lambda r: r.sent)
                                                        if r.target == "demo" and r.status == 200]))
              + f" ({dict(versions)})."]
    lines += ["", f"**{len(records)} requests, {total} failed** (a failure: an answer its send and answer instants "
              "do not allow, or no answer).", "", "## Both collections answer", ""]
    for name, query in (("scifact", SCIFACT_QUERY), ("demo", EXAMPLE_QUERY)):
        lines.append(f"- `POST /collections/{name}/search` '{query}': " + "; ".join(run["hits"][name]))
    status = run["status"]
    lines += ["", "## Memory per collection", "",
              f"Resident memory of the --config process: {run['rss_one_mib']:.0f} MiB with SciFact alone, "
              f"{run['rss_two_mib']:.0f} MiB once the demo collection (its own student) was added: "
              f"+{run['rss_two_mib'] - run['rss_one_mib']:.0f} MiB for the second collection.", "",
              "/admin/status's `memory` of each (VmRSS growth while it loaded, and bytes it maps from its files):", "",
              "| collection | load RSS growth (MiB) | mapped (MiB) |", "|---|---|---|"]
    for name, entry in status.get("collections", {}).items():
        memory = entry.get("memory") or {}
        growth, mapped = memory.get("load_rss_growth_bytes"), memory.get("mapped_bytes")
        lines.append(f"| {name} | {growth / 2**20 if growth is not None else float('nan'):.1f} | "
                     f"{mapped / 2**20 if mapped is not None else float('nan'):.1f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    demo = tandem_home() / "demo"
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=Path("/work/bench/scifact-flat"))
    parser.add_argument("--scifact-student", type=Path, default=Path("/work/bench/student"))
    parser.add_argument("--demo", type=Path, default=demo / "bundle", help="The demo bundle (`tandem demo serve`).")
    parser.add_argument("--demo-student", type=Path, default=demo / "student")
    parser.add_argument("--rps", type=float, default=50.0)
    return parse_with_output(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging()
    inputs = {"SciFact bundle": args.scifact, "SciFact student": args.scifact_student, "demo bundle": args.demo,
              "demo student": args.demo_student}
    with tempfile.TemporaryDirectory(prefix="tandem-collections-") as tmp:
        work = Path(tmp)
        one = one_collection(args.scifact, args.scifact_student, work)
        run = under_load(args.scifact, args.scifact_student, args.demo, args.demo_student, work, args.rps)
    command = "python -m bench.serving.collections_accept " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(command.strip(), one, run, args.rps, inputs)
    publish(args.lab, "collections", text, write=not args.no_write)
    return 0 if sum(len(v) for v in judge(run["records"], run["marks"]).values()) == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
