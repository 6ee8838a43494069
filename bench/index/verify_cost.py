"""What verifying a bundle costs: the sha256 of every file at startup, and a reload that trusts identities.

Why: the service verifies the bundle it starts on before it reports ready, and a hot reload hashes every file it
does not hold as the very file it verified (device, inode, size, mtime_ns); rehashing shared files on every reload
instead would close the one gap identities leave (a write in place that restores size and mtime). This measures,
on a bundle (`--bundle`, or a synthetic flat binary one of `--docs` documents built with `tandem index build`):
- sha256 over an in-memory buffer (the CPU's bound, no I/O);
- every file hashed, page cache warm, and cold (each file's pages dropped first with posix_fadvise, this bundle's
  only: the machine is shared);
- the files a reload to the next version (every file a hard link, as `index update` makes it) hashes when it
  trusts identities: the space files and tombstones only;
- loading the bundle without verifying (models.bundle.version.Bundle), to set the verification beside it.

    python -m bench.index.verify_cost --docs 1000000
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness.record import cpu_line, load_average, parse_with_output, publish, start_logging
from bench.harness.runs import home_with_teacher
from bench.index.index_scale import synthetic_import
from indexer.versions.segments import link_version
from models.bundle.storage.integrity import Verification
from models.bundle.version import Bundle, read_bundle_manifest, verify_version

log = logging.getLogger("bench.verify_cost")

SECTION = "verify-cost"


def build_bundle(work: Path, docs: int) -> Path:
    corpus, vectors, ids = synthetic_import(work, docs)
    out = work / "bundle"
    subprocess.run([sys.executable, "-m", "tandem", "index", "build", "--corpus", str(corpus), "--embeddings",
                    str(vectors), "--ids", str(ids), "--quantization", "binary", "--dim", "768", "--index", "flat",
                    "--out", str(out)], check=True, env={**os.environ, "TANDEM_HOME": str(home_with_teacher(
                        work / "home"))})
    vectors.unlink()
    return out


def drop_cache(directory: Path) -> None:
    """Evict this bundle's clean pages from the page cache (no other file's)."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(rounds: int, run: Callable[[], object], before: Callable[[], None] | None = None) -> list[float]:
    seconds = []
    for _ in range(rounds):
        if before is not None:
            before()
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return seconds


def has_sha_ni() -> bool:
    """Whether the CPU has the SHA extensions OpenSSL's sha256 uses (without them it runs several times slower)."""
    try:
        return any(line.startswith("flags") and " sha_ni" in line for line in Path("/proc/cpuinfo").open())
    except OSError:
        return False


def sha256_rate(megabytes: int, rounds: int) -> float:
    """GB/s of hashlib's sha256 over a buffer in memory."""
    data = os.urandom(megabytes << 20)
    return (megabytes << 20) / 1e9 / statistics.median(timed(rounds, lambda: hashlib.sha256(data).digest()))


@dataclass
class Measured:
    files: int
    total: int  # bytes
    largest: list[tuple[str, int]]
    runs: dict[str, list[float]]  # what → seconds of each run
    reload_hashed: list[str]
    reload_bytes: int

    def median(self, what: str) -> float:
        return statistics.median(self.runs[what])


def measure(bundle: Path, work: Path, rounds: int) -> Measured:
    manifest = read_bundle_manifest(bundle)
    sizes = {name: (bundle / name).stat().st_size for name in manifest.files}
    full: list[Verification] = []
    runs = {"warm": timed(rounds, lambda: full.append(verify_version(bundle, manifest))),
            "cold": timed(rounds, lambda: verify_version(bundle, manifest), before=lambda: drop_cache(bundle))}
    following = work / "next"
    link_version(bundle, manifest, following)  # the next version: every file a hard link, as `index update` makes
    trusted: list[Verification] = []
    runs["reload"] = timed(rounds, lambda: trusted.append(verify_version(following, manifest, trusted=full[0].files)))
    runs["rehash"] = timed(rounds, lambda: verify_version(following, manifest))
    runs["load"] = timed(rounds, lambda: Bundle(bundle, manifest=manifest).close())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:4]
    return Measured(len(sizes), sum(sizes.values()), largest, runs, trusted[0].hashed, trusted[0].hashed_bytes)


def render(args: argparse.Namespace, bundle: Path, rate: float, m: Measured, load: str) -> str:
    gb = m.total / 1e9
    largest = ", ".join(f"{name} {size / 1e6:.0f} MB" for name, size in m.largest)
    what = (f"synthetic flat binary, 768-d, {args.docs:,} documents of 12 words" if args.bundle is None
            else str(bundle))
    runs = "; ".join(f"{k} " + "/".join(f"{s:.3f}" for s in v) for k, v in m.runs.items())
    warm, cold, rehash = m.median("warm"), m.median("cold"), m.median("rehash")
    reload = f"hashes {', '.join(m.reload_hashed) or 'nothing'} ({m.reload_bytes / 1e6:.1f} MB)"
    return f"""# Verify cost

`python -m bench.index.verify_cost {' '.join(args.argv)}` on {cpu_line()}, sha_ni {'yes' if has_sha_ni() else 'no'},
{os.cpu_count()} cores shared with other work,
{time.strftime('%Y-%m-%d', time.gmtime())}, load before the run {load}. Bundle: {what}; {m.files} files,
{gb:.2f} GB (largest: {largest}). Medians of {args.rounds} runs, one thread, hashlib's sha256 (OpenSSL).

| what | seconds | GB/s |
|---|---|---|
| sha256 of a {args.buffer_mb} MB buffer in memory (the CPU's bound) | | {rate:.2f} |
| every file hashed, page cache warm (what startup does) | {warm:.2f} | {gb / warm:.2f} |
| every file hashed, this bundle's pages dropped first (posix_fadvise) | {cold:.2f} | {gb / cold:.2f} |
| a reload to the next version (all hard links), trusting identities: {reload} | {m.median('reload'):.3f} | |
| the same reload rehashing every shared file | {rehash:.2f} | {gb / rehash:.2f} |
| loading the bundle without verifying (`Bundle`, lexical included) | {m.median('load'):.2f} | |

Each run, seconds: {runs}.
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="What verifying a bundle costs, at startup and on reload.")
    parser.add_argument("--bundle", type=Path, help="A bundle to measure (default: build a synthetic one).")
    parser.add_argument("--docs", type=int, default=1_000_000, help="Documents of the synthetic bundle.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--buffer-mb", type=int, default=256)
    return parse_with_output(parser, argv)


def main(argv: Sequence[str] | None = None) -> None:
    start_logging()
    args = parse_args(argv)
    _, load = load_average()
    with tempfile.TemporaryDirectory(prefix="verify-cost-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        bundle = args.bundle if args.bundle is not None else build_bundle(work, args.docs)
        rate = sha256_rate(args.buffer_mb, args.rounds)
        measured = measure(bundle, work, args.rounds)
    publish(args.lab, SECTION, render(args, bundle, rate, measured, load), write=not args.no_write)


if __name__ == "__main__":
    main()
