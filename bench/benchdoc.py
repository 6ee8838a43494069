"""What the bench scripts share: the machine they ran on, and their marked sections of docs/BENCHMARKS.md.

Each script owns one section between `<!-- NAME:begin -->` and `<!-- NAME:end -->`; rewriting it
leaves every other section as it was, so scripts can be rerun independently.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
from pathlib import Path

from models.atomic import atomic_write

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = REPO / "docs" / "BENCHMARKS.md"

log = logging.getLogger("bench")


def markers(section: str) -> tuple[str, str]:
    return f"<!-- {section}:begin -->", f"<!-- {section}:end -->"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16")


def cpu_flag_map() -> dict[str, bool]:
    """Whether the CPU has each of the flags that decide the speed of our kernels (FAISS, int8 ONNX)."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {f: f in flags for f in KERNEL_FLAGS}


def cpu_flags() -> str:
    """The flags that decide the speed of our kernels, each marked yes or no, to print beside every figure."""
    return ", ".join(f"{f} {'yes' if has else 'no'}" for f, has in cpu_flag_map().items())


def load_average() -> tuple[float, str]:
    """1-minute load and a printable 1/5/15-minute triple."""
    try:
        loads = os.getloadavg()
    except OSError:
        return 0.0, "n/a"
    return loads[0], "/".join(f"{x:.1f}" for x in loads) + " (1/5/15 min)"


def write_section(path: Path, section: str, text: str) -> None:
    """Replace `section`'s marked block in `path` with `text` (which carries the markers), or append it."""
    begin, end = markers(section)
    old = path.read_text() if path.is_file() else "# Benchmarks\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + text + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: fh.write(new.encode()))


def publish(path: Path, section: str, text: str, write: bool = True) -> None:
    """Log a script's results and, unless `write` is false (its --no-write), put them into `path`."""
    log.info("results:\n%s", text)
    if write:
        write_section(path, section, text)
        log.info("updated %s", path)


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """--out and --no-write, which every script that publishes a section takes."""
    parser.add_argument("--out", type=Path, default=BENCHMARKS_MD, help="Markdown file to update.")
    parser.add_argument("--no-write", action="store_true", help="Only log the results.")


def start_logging() -> None:
    """INFO logs for a bench run (httpx's line per request held back); never reach for a model hub."""
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
