"""What the bench scripts share: the machine they ran on, its load while they ran, and the dated record each run
writes.

A run writes its results as a record of its own in the lab notebook, docs/lab/<UTC date>-<section>.md,
and touches no other file: docs/BENCHMARKS.md holds only today's figures, one row per figure linking its
record, updated by a person from the records. Why not rewrite a marked section of BENCHMARKS.md, as the
scripts once did: every new variant of a run added a section, and the file grew to 176,671 characters
with 12 sections titled the same, while which run is today's figure is a person's call anyway. A rerun on
the same day under the same section replaces its record, as it replaced its section before.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from models.atomic import atomic_write

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "docs" / "lab"

log = logging.getLogger("bench")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


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


def cpu_line() -> str:
    """The CPU as a record names it: the model, then its kernel flags."""
    return f"{cpu_model()} ({cpu_flags()})"


def load_average() -> tuple[float, str]:
    """1-minute load and a printable 1/5/15-minute triple."""
    try:
        loads = os.getloadavg()
    except OSError:
        return 0.0, "n/a"
    return loads[0], "/".join(f"{x:.1f}" for x in loads) + " (1/5/15 min)"


def machine() -> str:
    """The CPU and the cores this process sees, as a record's machine line names them."""
    return f"{cpu_line()}, {os.cpu_count()} cores visible"


class LoadSpan:
    """The load average when a run began, to print beside the load when it ended: on a shared machine the
    two together say whether other work ran meanwhile."""

    def __init__(self) -> None:
        self.busy, self.before = load_average()

    def text(self) -> str:
        return f"{self.before} before, {load_average()[1]} after"


def command_line(argv: Sequence[str] | None = None) -> str:
    """How this run was started, as a record gives it to rerun: `python -m bench.AREA.SCRIPT ARGS` (the script's
    arguments `argv`, by default this process's)."""
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    script = ["-m", spec.name] if spec is not None else [os.path.relpath(sys.argv[0], REPO)]
    return shlex.join(["python", *script, *(sys.argv[1:] if argv is None else argv)])


def record_path(lab: Path, section: str, when: datetime | None = None) -> Path:
    """Where a run of `section` on `when`'s UTC date (today by default) keeps its record."""
    return lab / f"{(when or datetime.now(UTC)):%Y-%m-%d}-{section}.md"


def publish(lab: Path, section: str, text: str, write: bool = True) -> Path | None:
    """Log a script's results and, unless `write` is false (its --no-write), write them as a record in `lab`."""
    log.info("results:\n%s", text)
    if not write:
        return None
    path = record_path(lab, section)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = text.strip("\n") + "\n"
    atomic_write(path, lambda fh: fh.write(body.encode()))
    log.info("wrote %s; update its row in docs/BENCHMARKS.md and list it in docs/lab/README.md", path)
    return path


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """--lab and --no-write, which every script that publishes a record takes."""
    parser.add_argument("--lab", type=Path, default=LAB, help="Folder of the dated records (the lab notebook).")
    parser.add_argument("--no-write", action="store_true", help="Only log the results.")


def parse_with_output(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """`parser` with --lab and --no-write added, applied to `argv` (this process's arguments by default); the
    arguments are kept as `args.argv`, for the command line a record prints."""
    add_output_args(parser)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def start_logging() -> None:
    """INFO logs for a bench run (httpx's line per request held back); never reach for a model hub."""
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
