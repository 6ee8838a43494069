"""`tandem demo serve`: the default corpus end to end, reusing whatever a previous run built.

A second run finds the corpus, the bundle and the student built from the inputs it would use (tandem.demo_reuse), so
it goes straight to serving; a changed input (another teacher or Python, a CPU that picks another precision, a new
bundle or student format) rebuilds what depends on it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import httpx
import typer

from models.distill.presets import resolve_preset
from models.encoders.precision import AUTO, PrecisionChoice, local_precision
from models.encoders.registry import load_card, resolve
from models.encoders.teacher_cache import release_teacher
from models.hashing import sha256_file
from models.paths import tandem_home
from tandem import demo_corpus
from tandem.demo_reuse import (
    bundle_key,
    corpus_key,
    read_bundle_key,
    read_student_key,
    record_corpus,
    recorded_corpus,
    reusable,
    student_key,
)

log = logging.getLogger(__name__)

EXAMPLE_QUERY = "parse a JSON string into a Python object"
PRESET = "quick"


def demo_dir() -> Path:
    return tandem_home() / "demo"


# Device files of the GPU drivers torch can use (NVIDIA's CUDA, AMD's ROCm): without them torch sees no GPU.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")


def demo_device() -> str:
    """Where the local teacher runs: the CPU where no GPU driver is present, known without importing torch (seconds
    of a second run that builds nothing, and the server's memory); else torch's own answer."""
    if not any(Path(f).exists() for f in GPU_DEVICE_FILES):
        return "cpu"
    from indexer.encoding.encode import local_device  # torch: whether CUDA is usable

    return local_device()


def demo_precision() -> str:
    """The teacher's precision for the demo's index, targets and agreement sample: `--precision auto` on the device
    the local teacher runs on (bf16 on a CPU that computes it natively, fp32 on one that emulates it)."""
    return local_precision(AUTO, demo_device()).value


def ensure_corpus(corpus: Path, max_docs: int) -> int:
    """The stdlib corpus: reused when written before under the same key (demo_reuse.corpus_key), else walked."""
    key = corpus_key(max_docs, Path(demo_corpus.__file__))
    count = recorded_corpus(corpus, key)
    if count is not None:
        log.info("demo corpus reused: %s (%d documents; same Python, stdlib and walker)", corpus, count)
        return count
    count = demo_corpus.write_demo_corpus(corpus, max_docs=max_docs)
    record_corpus(corpus, key, count)
    return count


def prepare(max_docs: int) -> tuple[Path, Path]:
    """Corpus → bundle → student under TANDEM_HOME/demo, building only what is missing or whose inputs changed.

    One teacher serves the whole run: the build keeps it loaded for its agreement sample and the distillation's
    targets (models.encoders.teacher_cache), all in the precision `auto` picks, and it is let go before serving."""
    root = demo_dir()
    corpus, bundle, student = root / "corpus.jsonl", root / "bundle", root / "student"
    count = ensure_corpus(corpus, max_docs)
    log.info("demo corpus: %d stdlib docstrings in %s", count, corpus)
    corpus_sha256 = sha256_file(corpus)
    teacher_fp = load_card(resolve("teacher")).fingerprint
    precision = demo_precision()
    preset = resolve_preset(PRESET)
    try:
        if not reusable("bundle", bundle, read_bundle_key(bundle), bundle_key(corpus_sha256, teacher_fp, precision)):
            from indexer.build import BuildRequest, build

            # the student is distilled from the very vectors the build stored, so the corpus is encoded once
            build(BuildRequest(corpus=corpus, out=bundle, force=True, precision=precision, keep_teacher=True))
        wanted = student_key(corpus_sha256, teacher_fp, precision, preset)
        if not reusable("student", student, read_student_key(student), wanted):
            from models.distill.pipeline import DistillRequest, run_distill

            run_distill(DistillRequest(corpus=corpus, index=bundle, out=student, preset=preset,
                                       precision=PrecisionChoice(precision), force=True))
    finally:
        release_teacher()  # the server never needs it
    return bundle, student


def curl_line(host: str, port: int) -> str:
    body = json.dumps({"query": EXAMPLE_QUERY, "top_k": 3})
    return f"curl -s -X POST http://{host}:{port}/search -H 'Content-Type: application/json' -d '{body}'"


def page_url(host: str, port: int) -> str:
    """The search page; a wildcard bind address is shown as the loopback a browser on this machine can open."""
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    return f"http://{shown}:{port}/"


def ready_message(bundle: Path, student: Path, host: str, port: int) -> str:
    """What the demo prints once serving: the curl line, then, last, the search page's URL."""
    return (f"\nReady: serving {bundle} with {student}. Try:\n\n  {curl_line(host, port)}\n\n"
            f"Search page: {page_url(host, port)}")


def announce_when_ready(host: str, port: int, message: str, timeout_s: float = 600.0) -> threading.Thread:
    """Print `message` once /readyz answers 200, so it is the last thing the demo shows."""

    def poll() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://{host}:{port}/readyz", timeout=2.0).status_code == 200:
                    typer.echo(message)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        log.warning("the server did not become ready within %.0fs", timeout_s)

    thread = threading.Thread(target=poll, name="demo-announce", daemon=True)
    thread.start()
    return thread
