"""`tandem demo serve`: the default corpus end to end, reusing whatever a previous run built.

A second run finds the corpus unchanged, the bundle built from it and the student aligned
to its teacher, so it goes straight to serving.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import httpx
import typer

from indexer.build import BuildRequest, build
from models.bundle.version import read_bundle_manifest
from models.distill.pipeline import DistillRequest, run_distill
from models.encoders.precision import AUTO
from models.encoders.registry import load_card, resolve
from models.encoders.student import read_student_manifest
from models.errors import ContractMismatch
from models.hashing import sha256_file
from models.paths import tandem_home
from tandem.demo_corpus import write_demo_corpus

log = logging.getLogger(__name__)

EXAMPLE_QUERY = "parse a JSON string into a Python object"


def demo_dir() -> Path:
    return tandem_home() / "demo"


def _bundle_is_current(bundle: Path, corpus: Path, teacher_fp: str) -> bool:
    try:
        manifest = read_bundle_manifest(bundle)
    except ContractMismatch:
        return False
    return manifest.corpus.sha256 == sha256_file(corpus) and manifest.teacher.fingerprint == teacher_fp


def _student_is_current(student: Path, teacher_fp: str) -> bool:
    try:
        return read_student_manifest(student).teacher.fingerprint == teacher_fp
    except ContractMismatch:
        return False


def prepare(max_docs: int) -> tuple[Path, Path]:
    """Corpus → bundle → student under TANDEM_HOME/demo, building only what is missing or stale."""
    root = demo_dir()
    corpus, bundle, student = root / "corpus.jsonl", root / "bundle", root / "student"
    count = write_demo_corpus(corpus, max_docs=max_docs)
    log.info("demo corpus: %d stdlib docstrings in %s", count, corpus)
    teacher_fp = load_card(resolve("teacher")).fingerprint
    if _bundle_is_current(bundle, corpus, teacher_fp):
        log.info("demo bundle is current: %s", bundle)
    else:
        # the teacher in the precision this machine runs fastest (bf16 where the CPU has it); the student is
        # distilled from the very vectors the build stored, so the corpus is encoded once
        build(BuildRequest(corpus=corpus, out=bundle, force=True, precision=AUTO))
    if _student_is_current(student, teacher_fp):
        log.info("demo student is current: %s", student)
    else:
        run_distill(DistillRequest(corpus=corpus, index=bundle, out=student, preset="quick"))
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
