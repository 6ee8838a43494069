"""Ten million documents on one small box: build, serve, filter, update and compact at sizes given by flags.

Why: tandem had only been measured up to 1M documents; its users index MS MARCO (8.8M passages) and Wikipedia
(21M). This harness (issue 44) makes synthetic documents shaped like the teacher's vectors and runs, per size,
in one run, each stage as a new user would (`tandem index build|update|compact`, `tandem serve`), recording
wall time, peak RSS (GNU time's, of the stage's own process) and the disk each component takes, every size in GB of
10^9 bytes (stage peaks were GiB before 2026-11-27, the phases and the disk already GB):

1. Inputs (made once per size, in chunks, so generating 10M needs no more memory than 1M): unit vectors around
   SciFact's reference teacher vectors plus Gaussian noise shaped like their covariance (bench/index/index_types.py's
   model; not isotropic noise, which no ANN index sees in practice), as one float16 .npy; a corpus whose texts
   draw 16 to 48 words from a Zipfian vocabulary of 100,000 made-up words (so BM25 sees realistic posting
   lengths), with payload fields `year` (integer, 35 values), `tag` (keyword, 26 letters) and `date` (datetime).
2. Build: `tandem index build --index auto --quantization binary` importing the vectors (`--index` is a flag).
   The build samples its own RSS every 20 ms (`--profile-build`, in the process GNU time measures), to say which
   stage holds what.
3. Serve: `tandem serve` with the `--student`; after a warm-up pass of 40 other queries per case, 40 sequential
   `/search` requests unfiltered and per filter (1 in 910 to 34 in 35), p50/p99 as the client sees them, and
   recall@10 against exact float search over the same vectors (the service's own query vectors, from
   /v1/embeddings); the inputs' pages are dropped from the page cache after that exact search, so the service
   is measured on its own files. The queries are SciFact's *train* queries: no default is chosen by its test ones.
4. Update: 100 changes (50 replaced documents, 50 deletes) with `tandem index update --precision auto` into the
   root (as an operator on a CPU: bf16 where it has native bf16, and so the version's precision after it).
5. Follow: `tandem index follow` on the updated root while a change file of 1,000 new documents arrives every
   minute (`--follow-files` of them): each file's lag from its arrival to the version that holds it, and the
   follower's peak RSS. Then `tandem index compact` with its default merge policy, which merges the update's and
   the follower's small segments and keeps the build's (indexer/versions/merge_policy.py).
6. Disk: each component's size at the end of its stage, and the peak over the whole size's run of the
   filesystem's used bytes above what it used before (the inputs added), sampled every second: what the run
   needed at its worst, temporary files and compaction's two versions included.

    python -m bench.index.scale_10m --sizes 1000000 --work /work/scale --student /work/bench/student
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.filters.filter_scale import exact_top, recall
from bench.harness.record import (
    REPO,
    cpu_line,
    load_average,
    parse_with_output,
    publish,
    start_logging,
)
from bench.harness.runs import home_with_teacher, run_peak
from bench.index.index_types import DEFAULT_REFERENCE

log = logging.getLogger("bench.scale_10m")

SECTION = "scale"
CHUNK = 65_536
K = 10
VOCAB = 100_000
ZIPF_S = 1.07
LETTERS = [chr(ord("a") + i) for i in range(26)]
SCIFACT = DEFAULT_REFERENCE.parents[1]
FIELDS = ("year:integer", "tag:keyword", "date:datetime")
FOLLOW_DOCS = 1000
_CONSONANTS, _VOWELS = "bcdfghjklmnprstvz", "aeiou"


# --- inputs --------------------------------------------------------------------------------------------------

def words(n: int) -> list[str]:
    """`n` distinct made-up words of consonant-vowel syllables (rank 0 the most frequent)."""
    out = []
    for rank in range(n):
        syllables, r = [], rank + 85  # from two syllables up
        while r:
            r, s = divmod(r, len(_CONSONANTS) * len(_VOWELS))
            syllables.append(_CONSONANTS[s // len(_VOWELS)] + _VOWELS[s % len(_VOWELS)])
        out.append("".join(syllables))
    return out


def noise_shape(reference: np.ndarray) -> np.ndarray:
    """The matrix that turns standard normal rows into noise with the reference vectors' covariance (unit trace)."""
    eigvals, eigvecs = np.linalg.eigh(np.cov(reference, rowvar=False))
    return ((eigvecs * np.sqrt(np.clip(eigvals, 0, None))).T / np.sqrt(eigvals.clip(0).sum())).astype(np.float32)


def make_inputs(directory: Path, n: int, reference_path: Path) -> Path:
    """vectors.f16.npy, corpus.jsonl, ids.json and columns.npz for `n` documents in `directory`, made once, a
    chunk at a time (ids.json last: it marks the inputs complete)."""
    if (directory / "ids.json").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(n)
    ref = np.asarray(np.load(reference_path), dtype=np.float32)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    shape = noise_shape(ref)
    vocab = np.asarray(words(VOCAB))
    cdf = np.cumsum(1.0 / np.arange(1, VOCAB + 1) ** ZIPF_S)
    cdf /= cdf[-1]
    columns = {"year": rng.integers(1966, 2001, n).astype(np.int16), "tag": rng.integers(0, 26, n).astype(np.int8)}
    np.savez(directory / "columns.npz", **columns)
    vectors = np.lib.format.open_memmap(directory / "vectors.f16.npy", mode="w+", dtype=np.float16, shape=(n, 768))
    with (directory / "corpus.jsonl").open("w") as fh:
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            base = ref[rng.integers(0, len(ref), m)]
            scale = rng.uniform(0.4, 0.8, (m, 1)).astype(np.float32)
            x = base + scale * (rng.standard_normal((m, 768), dtype=np.float32) @ shape)
            vectors[start : start + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
            lengths = rng.integers(16, 49, m)
            tokens = vocab[np.searchsorted(cdf, rng.random(int(lengths.sum())))]
            ends = np.cumsum(lengths)
            months, days = rng.integers(1, 13, m), rng.integers(1, 29, m)
            lines = []
            for j in range(m):
                i = start + j
                year = int(columns["year"][i])
                lines.append(json.dumps({
                    "_id": f"doc{i}", "title": f"Synthetic {i}",
                    "text": " ".join(tokens[ends[j] - lengths[j] : ends[j]]),
                    "metadata": {"year": year, "tag": LETTERS[columns["tag"][i]],
                                 "date": f"{year}-{months[j]:02d}-{days[j]:02d}T00:00:00Z"}}))
            fh.write("\n".join(lines) + "\n")
            log.info("inputs %d: %d of %d documents", n, start + m, n)
    vectors.flush()
    del vectors
    (directory / "ids.json").write_text(json.dumps([f"doc{i}" for i in range(n)]))
    return directory


# --- timed stages --------------------------------------------------------------------------------------------

@dataclass
class Stage:
    name: str
    seconds: float
    peak_rss_gb: float
    disk_gb: float = float("nan")
    note: str = ""


def timed(name: str, args: Sequence[str], home: Path, *, python: Sequence[str] = ("-m", "tandem")) -> Stage:
    """`python ARGS` in a fresh process, its wall time and peak RSS (bench.harness.runs.run_peak)."""
    run = run_peak([sys.executable, *python, *args], home, name=name)
    stage = Stage(name, run.wall_s, run.peak_gb, note=(run.stdout.strip().splitlines() or [""])[-1])
    log.info("%s: %.1f s, peak RSS %.2f GB", name, run.wall_s, stage.peak_rss_gb)
    return stage


def disk_gb(*paths: Path) -> float:
    """Bytes allocated on disk under `paths` (hard links counted once), in GB."""
    out = subprocess.run(["du", "-scb", *map(str, paths)], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1].split()[0]) / 1e9


def build_args(inputs: Path, index: str) -> list[str]:
    return ["index", "build", "--corpus", str(inputs / "corpus.jsonl"), "--embeddings",
            str(inputs / "vectors.f16.npy"), "--ids", str(inputs / "ids.json"), "--quantization", "binary",
            "--index", index, *[a for f in FIELDS for a in ("--field", f)]]


class DiskPeak:
    """The filesystem's used bytes under `path`, sampled every second in a thread: the peak above the start."""

    def __init__(self, path: Path) -> None:
        self.path, self.base, self.peak = path, shutil.disk_usage(path).used, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(1.0):
            self.peak = max(self.peak, shutil.disk_usage(self.path).used - self.base)

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return self.peak / 1e9


# --- the build's memory by phase (a child process) ------------------------------------------------------------

PHASES = {  # module attribute → phase name
    ("indexer.build", "ingest_corpus"): "ingest",
    ("indexer.build", "import_vectors"): "import",
    ("indexer.writer", "build_lexical"): "lexical",
    ("indexer.writer", "write_payload"): "payload",
    ("indexer.build", "write_vectors"): "vectors",
    ("indexer.build", "add_samples"): "agreement sample",
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _anon_bytes() -> int:
    """The resident set less the mapped file pages: the process's own memory."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("RssAnon:"))


def profile_build(argv: list[str]) -> None:
    """Run `tandem ARGV` (a build) here, sampling RSS every 20 ms; print each phase's peak and time as JSON."""
    import importlib

    from tandem.cli import app

    current = ["outside the phases"]
    peaks: dict[str, int] = {}
    anon: dict[str, int] = {}
    seconds: dict[str, float] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peaks[current[0]] = max(peaks.get(current[0], 0), _rss_bytes())
            anon[current[0]] = max(anon.get(current[0], 0), _anon_bytes())

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            before, current[0] = current[0], name
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - began
                peaks[name] = max(peaks.get(name, 0), _rss_bytes())
                current[0] = before
        return run

    for (module, attr), name in PHASES.items():
        mod = importlib.import_module(module)
        setattr(mod, attr, wrap(name, getattr(mod, attr)))
    threading.Thread(target=sample, daemon=True).start()
    try:
        app(argv, standalone_mode=False)
    finally:
        done.set()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"phases": {k: {"peak_gb": v / 1e9, "anon_gb": anon.get(k, 0) / 1e9,
                                     "seconds": seconds.get(k, 0.0)} for k, v in peaks.items()},
                      "peak_gb": peak / 1e9}))


# --- serving ---------------------------------------------------------------------------------------------------

FILTERS: list[tuple[str, dict[str, Any] | None, Callable[[dict[str, np.ndarray]], np.ndarray] | None]] = [
    ("none", None, None),
    ("year = 2000 and tag = a (1 in 910)", {"and": [{"field": "year", "eq": 2000}, {"field": "tag", "eq": "a"}]},
     lambda c: (c["year"] == 2000) & (c["tag"] == 0)),
    ("year = 2000 (1 in 35)", {"field": "year", "eq": 2000}, lambda c: c["year"] == 2000),
    ("tag in [a, b] (1 in 13)", {"field": "tag", "in": ["a", "b"]}, lambda c: c["tag"] < 2),
    ("date >= 1991-01-01 (10 in 35)", {"field": "date", "gte": "1991-01-01T00:00:00Z"}, lambda c: c["year"] >= 1991),
    ("year >= 1967 (34 in 35)", {"field": "year", "gte": 1967}, lambda c: c["year"] >= 1967),
]
MODES = ("lexical", "hybrid")


def train_queries(n: int) -> list[str]:
    """SciFact's train queries (never its test queries: nothing here may tune on them)."""
    from models.datasets.beir import read_qrels, read_queries

    queries = read_queries(SCIFACT / "queries.jsonl")
    qrels, _ = read_qrels(SCIFACT / "qrels" / "train.tsv")
    return [queries[q] for q in qrels if q in queries][:n]


def lexical_texts(texts: list[str], seed: int = 3) -> list[str]:
    """The queries with three words of the corpus's vocabulary each (ranks 10 to 10,000 of the Zipfian draw: real
    posting lengths, from tens of thousands of rows down to tens), so BM25 has postings to score."""
    rng = np.random.default_rng(seed)
    vocab = words(10_000)
    return [f"{t} {' '.join(vocab[r] for r in rng.integers(10, 10_000, 3))}" for t in texts]


def serve_stage(args: argparse.Namespace, inputs: Path, root: Path, run: Path, home: Path) -> dict[str, Any]:
    """`tandem serve` on the root: p50/p99 of 40 sequential /search per filter and mode, recall of the unfiltered
    ones, the server's RSS; then an update of 100 changes, how long until the server serves it, its RSS after."""
    import httpx

    from bench.harness.servers import free_port, rss_mib, start_process, stop, tandem_serve_cmd, wait_ready

    port = free_port()
    env = {"TANDEM_HOME": str(home), "TANDEM_LOG_LEVEL": "WARNING", "TANDEM_LOG_FORMAT": "text"}
    process = start_process(tandem_serve_cmd(root, args.student, port), run / "serve.log", env, cwd=REPO)
    out: dict[str, Any] = {"rows": []}
    texts, warm = _split(train_queries(2 * args.requests), args.requests)
    columns = dict(np.load(inputs / "columns.npz"))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0, trust_env=False) as client:
            began = time.perf_counter()
            wait_ready(client, process, timeout_s=1800)
            out["ready_s"] = time.perf_counter() - began
            out["rss_ready_mib"] = _memory(process.pid, rss_mib)
            vectors = np.asarray([client.post("/v1/embeddings", json={"input": t, "model": "x"}).json()["data"][0][
                "embedding"] for t in texts], dtype=np.float32)
            truth = exact_top(inputs / "vectors.f16.npy", vectors,
                              {name: None if allows is None else allows(columns) for name, _, allows in FILTERS}, 768)
            evict(inputs / "vectors.f16.npy")  # the truth's 15 GB read must not push the service's files out
            for name, mode, times, responses in timed_cases(client, texts, warm):
                errors = sum(r.status_code != 200 for r in responses)
                found = [[int(h["id"][3:]) for h in (r.json()["results"] if r.status_code == 200 else [])]
                         for r in responses]
                row = {"case": name, "mode": mode, "p50_ms": 1e3 * float(np.percentile(times, 50)),
                       "p99_ms": 1e3 * float(np.percentile(times, 99)), "errors": errors,
                       "recall": recall(found, truth[name]) if mode == "dense" else float("nan")}
                log.info("serve %s", row)
                out["rows"].append(row)
            out["rss_served_mib"] = _memory(process.pid, rss_mib)
            before = client.get("/index").json()["version"]
            out["update"] = update_stage(inputs, root, run, home)
            began = time.perf_counter()
            while client.get("/index").json()["version"] == before:
                if time.perf_counter() - began > 600:
                    raise TimeoutError("the server never served the updated version")
                time.sleep(0.05)
            out["reload_s"] = time.perf_counter() - began
            client.post("/search", json={"query": texts[0], "top_k": K})
            out["rss_reloaded_mib"] = _memory(process.pid, rss_mib)
    finally:
        stop(process)
    return out


def timed_cases(client: Any, texts: list[str],
                warm: list[str]) -> Iterator[tuple[str, str, list[float], list[Any]]]:
    """The serve stage's requests, on a running server: a warm-up pass of the `warm` queries once per case (not
    measured), then per case (each FILTERS row in dense mode, then unfiltered in each of MODES) the `texts` sent one
    at a time: (filter name, mode, seconds per request, responses). Lexical and hybrid send lexical_texts."""
    cases = [(name, body, "dense") for name, body, _ in FILTERS] + [("none", None, m) for m in MODES]
    for _, body, mode in cases:
        for text in warm if mode == "dense" else lexical_texts(warm, seed=4):
            client.post("/search", json=_request(text, body, mode))
    for name, body, mode in cases:
        times, responses = [], []
        for text in texts if mode == "dense" else lexical_texts(texts):
            request = _request(text, body, mode)
            began = time.perf_counter()
            responses.append(client.post("/search", json=request))
            times.append(time.perf_counter() - began)
        yield name, mode, times, responses


def _memory(pid: int, rss_mib: Callable[[int, str], float | None]) -> dict[str, float | None]:
    """The server's resident set and its two parts: anonymous (its own memory) and file (mapped pages of the
    version's files, which are the page cache's: shared, and reclaimed under pressure)."""
    return {field: rss_mib(pid, field) for field in ("VmRSS", "RssAnon", "RssFile")}


def _mib(memory: dict[str, float | None]) -> str:
    return f"{memory['VmRSS']:.0f} MiB (anonymous {memory['RssAnon']:.0f}, file {memory['RssFile']:.0f})"


def _split(queries: list[str], n: int) -> tuple[list[str], list[str]]:
    """The first `n` queries to measure and the rest to warm up with (never the same texts: the service's query
    cache would answer a repeated one without encoding it)."""
    if len(queries) < 2 * n:
        raise ValueError(f"{n} measured and {n} warm-up queries need {2 * n} train queries; SciFact has {len(queries)}")
    return queries[:n], queries[n:]


def _request(text: str, body: dict[str, Any] | None, mode: str) -> dict[str, Any]:
    request: dict[str, Any] = {"query": text, "top_k": K, "fields": ["id"], "mode": mode}
    if body is not None:
        request["filter"] = body
    return request


def evict(path: Path) -> None:
    """Ask the kernel to drop `path`'s cached pages (a clean file's are simply let go)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def update_stage(inputs: Path, root: Path, run: Path, home: Path) -> Stage:
    """100 changes: 50 documents replaced (new texts and fields), 50 deleted."""
    n = len(json.loads((inputs / "ids.json").read_text()))
    rng = np.random.default_rng(1)
    picked = rng.choice(n, 100, replace=False)
    changes = run / "changes.jsonl"
    with changes.open("w") as fh:
        for i in picked[:50]:
            fh.write(json.dumps({"_id": f"doc{i}", "title": f"Changed {i}", "text": "bede babe sibo changed text",
                                 "metadata": {"year": 2000, "tag": "z", "date": "2000-06-01T00:00:00Z"}}) + "\n")
        for i in picked[50:]:
            fh.write(json.dumps({"_id": f"doc{i}", "delete": True}) + "\n")
    stage = timed("update (100 changes)", ["index", "update", "--root", str(root), "--changes", str(changes),
                                           "--precision", "auto"], home)
    stage.disk_gb = disk_gb(root)
    return stage


def follow_stage(inputs: Path, root: Path, run: Path, home: Path, files: int, every_s: float,
                 first: int = 0) -> dict[str, Any]:
    """`tandem index follow` on `root` while a change file of FOLLOW_DOCS new documents arrives every `every_s`:
    each file's lag from its arrival (its rename into place) to CURRENT naming a version that holds it. `first`:
    the number of the first file (on a root that followed files before, the next one after them)."""
    from bench.harness.servers import rss_mib, start_process, stop

    changes = run / "follow"
    changes.mkdir()
    env = {"TANDEM_HOME": str(home), "PYTHONPATH": str(REPO), "TANDEM_LOG_LEVEL": "INFO"}
    cmd = [sys.executable, "-m", "tandem", "index", "follow", "--root", str(root),
           "--changes-dir", str(changes), "--interval", "2", "--precision", "auto"]
    process = start_process(cmd, run / "follow.log", env, cwd=REPO)
    vocab = np.asarray(words(VOCAB))
    rng = np.random.default_rng(5)
    lags: list[float] = []
    peak_mib: float | None = None
    try:
        for i in range(first, first + files):
            slot = time.perf_counter() + every_s
            name = f"{i:04d}-changes.jsonl"
            lines = [json.dumps({"_id": f"follow{i}-{j}", "title": f"Followed {i}-{j}", "text": " ".join(
                vocab[rng.integers(0, 10_000, int(rng.integers(16, 49)))]), "metadata": {
                "year": 2000, "tag": "f", "date": "2000-01-01T00:00:00Z"}}) for j in range(FOLLOW_DOCS)]
            (changes / f".{name}").write_text("\n".join(lines) + "\n")
            (changes / f".{name}").rename(changes / name)
            arrived = time.perf_counter()
            while _followed(root) < name:
                if process.poll() is not None:
                    raise RuntimeError(f"the follower exited ({process.returncode}); see {run / 'follow.log'}")
                if time.perf_counter() - arrived > 1800:
                    raise TimeoutError(f"the follower never applied {name}")
                time.sleep(0.2)
            lags.append(time.perf_counter() - arrived)
            log.info("follow: %s applied %.1f s after it arrived", name, lags[-1])
            time.sleep(max(0.0, slot - time.perf_counter()))
        peak_mib = rss_mib(process.pid, "VmHWM")  # the follower's high-water mark, read before it stops
    finally:
        stop(process)
    return {"files": files, "every_s": every_s, "docs": FOLLOW_DOCS, "lags_s": lags,
            "peak_rss_gb": (peak_mib or 0.0) * 2**20 / 1e9}


def _segments(root: Path) -> list[str]:
    """The segment names of the version CURRENT names (its own for a manifest that lists none)."""
    manifest = json.loads((root / (root / "CURRENT").read_text().strip() / "manifest.json").read_text())
    return [s["name"] for s in manifest.get("segments") or [{"name": manifest.get("version")}]]


def _followed(root: Path) -> str:
    """The last change file the version CURRENT names has applied ('' if none)."""
    manifest = json.loads((root / (root / "CURRENT").read_text().strip() / "manifest.json").read_text())
    return (manifest.get("follow") or {}).get("last", "")


# --- the run -------------------------------------------------------------------------------------------------

@dataclass
class SizeResult:
    n: int
    stages: list[Stage] = field(default_factory=list)
    phases: dict[str, Any] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)
    inputs_gb: float = 0.0
    service: dict[str, Any] = field(default_factory=dict)
    follow: dict[str, Any] = field(default_factory=dict)
    disk_peak_gb: float = 0.0  # the filesystem's peak use above its start, inputs added


def run_size(args: argparse.Namespace, n: int) -> SizeResult:
    result = SizeResult(n)
    inputs = make_inputs(args.work / f"inputs-{n}", n, args.reference)
    result.inputs_gb = disk_gb(inputs)
    run = args.work / f"run-{n}"
    if run.exists():
        shutil.rmtree(run)
    disk = DiskPeak(args.work)
    home = home_with_teacher(run / "home")
    root = run / "root"
    build = timed("build", ["-m", "bench.index.scale_10m", "--profile-build", "--", *build_args(inputs, args.index),
                            "--root", str(root)], home, python=())
    result.phases, build.note = dict(json.loads(build.note)), "RSS by phase below"
    build.disk_gb = disk_gb(root)
    result.stages.append(build)
    version = root / (root / "CURRENT").read_text().strip()
    result.index = json.loads((version / "manifest.json").read_text())["index"]
    log.info("index: %s", result.index)
    store = home / "embeddings"
    result.stages.append(Stage("embedding store (imported vectors)", 0.0, 0.0, disk_gb(store)))
    if args.student is not None:
        result.service = serve_stage(args, inputs, root, run, home)
        result.stages.append(result.service.pop("update"))
    else:
        result.stages.append(update_stage(inputs, root, run, home))
    if args.follow_files:
        result.follow = follow_stage(inputs, root, run, home, args.follow_files, args.follow_every)
    # after the update and the follower: their small segments are what the default merge policy merges
    before = _segments(root)
    compact = timed("compact", ["index", "compact", "--root", str(root)], home)
    compact.disk_gb = disk_gb(root)
    kept = len(set(before) & set(_segments(root)))
    compact.note = f"{len(before)} segments: {kept} kept, {len(before) - kept} merged; {compact.note}"
    result.stages.append(compact)
    result.stages.append(Stage("embedding store (after compaction)", 0.0, 0.0, disk_gb(store)))
    result.disk_peak_gb = disk.stop() + result.inputs_gb
    if not args.keep:
        logs = args.work / f"logs-{n}"  # the service's and follower's logs outlive the run directory
        logs.mkdir(exist_ok=True)
        for path in run.glob("*.log"):
            shutil.copy2(path, logs / path.name)
        shutil.rmtree(run)
    if args.drop_inputs:  # room on a small disk for the next size's run
        shutil.rmtree(inputs)
    return result


def render(args: argparse.Namespace, results: list[SizeResult], load: str) -> str:
    lines = ["# Scale: build, serve, filter, update and compact at growing sizes", "",
             f"`python -m bench.index.scale_10m {shlex.join(args.argv)}` on {cpu_line()}, {os.cpu_count()} cores, "
             f"{datetime.now(UTC):%Y-%m-%d}, load before the run {load}.", ""]
    for r in results:
        run_disk = r.inputs_gb + sum(s.disk_gb for s in r.stages if s.name in ("build", "embedding store "
                                                                              "(imported vectors)"))
        lines += [f"## {r.n:,} documents", "", f"Index (`--index {args.index}`): `{json.dumps(r.index)}`. Inputs "
                  f"(vectors + corpus): {r.inputs_gb:.2f} GB; inputs, root as built and embedding store together: "
                  f"{run_disk:.2f} GB.", "",
                  "| stage | wall | peak RSS | disk | note |", "|---|---:|---:|---:|---|"]
        lines += [f"| {s.name} | {s.seconds:.1f} s | {s.peak_rss_gb:.2f} GB | {s.disk_gb:.2f} GB | "
                  f"{s.note.replace('|', '/')[:160]} |" for s in r.stages]
        if r.service:
            sv = r.service
            lines += ["", f"Service (`tandem serve --index ROOT --student {args.student}`, default settings): ready in "
                      f"{sv['ready_s']:.1f} s, RSS {_mib(sv['rss_ready_mib'])} ready, {_mib(sv['rss_served_mib'])} "
                      f"after the searches; the update served {sv['reload_s']:.2f} s after `index update` returned, "
                      f"RSS then {_mib(sv['rss_reloaded_mib'])}. {args.requests} sequential requests per row "
                      "(SciFact train queries, after a warm-up pass of as many others per row; lexical and "
                      "hybrid: each with three words of the corpus's vocabulary), recall@10 against exact float "
                      "search over the same vectors (the service's own "
                      "query vectors) among the rows the filter allows:", "",
                      "| filter | mode | p50 | p99 | recall@10 | errors |", "|---|---|---:|---:|---:|---:|"]
            lines += [f"| {row['case']} | {row['mode']} | {row['p50_ms']:.1f} ms | {row['p99_ms']:.1f} ms | "
                      f"{row['recall']:.3f} | {row['errors']} |" for row in sv["rows"]]
        lines += ["", f"Disk: the run's peak, inputs included: **{r.disk_peak_gb:.2f} GB** (the filesystem's used "
                  "bytes, sampled every second, above their level before the run; plus the inputs)."]
        if r.follow:
            fw = r.follow
            lags = fw["lags_s"]
            lines += ["", "Follow: `tandem index follow --interval 2 --precision auto` on the updated root, a change "
                      f"file of {fw['docs']:,} new documents every {fw['every_s']:.0f} s, {fw['files']} files: lag "
                      f"from a file's arrival to CURRENT holding it {', '.join(f'{x:.1f}' for x in lags)} s (max "
                      f"{max(lags):.1f} s); the follower's peak RSS {fw['peak_rss_gb']:.2f} GB."]
        if r.phases:
            lines += ["", "Build phases (RSS sampled every 20 ms in the build's own process; a phase's peak includes "
                      "what earlier phases left allocated):", "", "| phase | peak RSS | of it anonymous | time |",
                      "|---|---:|---:|---:|"]
            lines += [f"| {k} | {v['peak_gb']:.2f} GB | {v.get('anon_gb', float('nan')):.2f} GB | "
                      f"{v['seconds']:.1f} s |" for k, v in r.phases["phases"].items()]
        lines.append("")
    lines += ["```json", json.dumps([asdict(r) for r in results], indent=1, default=str)[:20000], "```"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Build, serve, filter, update, compact at growing sizes.")
    parser.add_argument("--sizes", default="1000000", help="Comma-separated document counts.")
    parser.add_argument("--work", type=Path, required=True, help="Where inputs and runs go (inputs are kept).")
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--student", type=Path, help="A student for the service stage (omitted: no service stage).")
    parser.add_argument("--index", default="auto", help="--index of the build.")
    parser.add_argument("--requests", type=int, default=40, help="Sequential /search requests per row.")
    parser.add_argument("--keep", action="store_true", help="Keep each size's run directory.")
    parser.add_argument("--drop-inputs", action="store_true", help="Delete each size's inputs after its run.")
    parser.add_argument("--follow-files", type=int, default=3, help="Change files the follow stage sends (0: none).")
    parser.add_argument("--follow-every", type=float, default=60.0, help="Seconds between the follow stage's files.")
    return parse_with_output(parser, argv)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(argv if argv is not None else sys.argv[1:])
    if argv[:1] == ["--profile-build"]:
        logging.basicConfig(level="WARNING")
        profile_build(argv[2:] if argv[1:2] == ["--"] else argv[1:])
        return
    start_logging()
    args = parse_args(argv)
    _, load = load_average()
    args.work.mkdir(parents=True, exist_ok=True)
    results: list[SizeResult] = []
    for size in (int(s) for s in args.sizes.split(",") if s):
        results.append(run_size(args, size))
        # written after each size, so a run stopped later keeps what it measured
        publish(args.lab, SECTION, render(args, results, load), write=not args.no_write)


if __name__ == "__main__":
    main()
