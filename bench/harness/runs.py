"""What the bench scripts that run a command in a fresh process share: a TANDEM_HOME with this machine's teacher,
the command timed with its peak resident memory, and a bench script started again as a module.

The peak comes from GNU time (Debian's `time` package), whose own small process starts the command: a child
forked straight from a large bench process would inherit that process's RSS high-water mark.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness.record import REPO

log = logging.getLogger("bench.runs")

TIME = "/usr/bin/time"


def home_with_teacher(path: Path) -> Path:
    """A TANDEM_HOME whose teacher is this machine's provisioned one (no copy of its weights)."""
    from models.encoders import registry

    (path / "models").mkdir(parents=True, exist_ok=True)
    (path / "models/roles.json").write_text(json.dumps({"teacher": str(registry.resolve("teacher"))}))
    return path


def module_cmd(module: str, *args: str) -> list[str]:
    """`python -m MODULE ARGS`: how a bench script starts itself (or another) in a child process. Run with the
    repository root as the working directory (as `run_peak` and `start_process` do), so `bench` imports."""
    return [sys.executable, "-m", module, *args]


@dataclass(frozen=True)
class PeakRun:
    """A finished command: wall seconds, peak RSS (KiB, GNU time's %M), its output."""

    wall_s: float
    peak_kib: int
    stdout: str
    stderr: str

    @property
    def peak_gb(self) -> float:
        return self.peak_kib * 1024 / 1e9

    @property
    def peak_gib(self) -> float:
        return self.peak_kib / 1024**2


def run_peak(cmd: Sequence[str], home: Path, *, cwd: Path = REPO, env: Mapping[str, str] | None = None,
             keep_stdout: bool = True, name: str = "") -> PeakRun:
    """`cmd` in a fresh process under GNU time, TANDEM_HOME=`home` and `cwd` first on PYTHONPATH (another source
    tree's root, to time that tree's code); raises with the tail of stderr if it fails."""
    full_env = {**os.environ, "TANDEM_HOME": str(home), "PYTHONPATH": str(cwd), "TANDEM_LOG_LEVEL": "WARNING",
                **(env or {})}
    log.info("%s: %s", name or "run", shlex.join(cmd))
    began = time.perf_counter()
    proc = subprocess.run([TIME, "-f", "maxrss-kib %M", *cmd], cwd=cwd, env=full_env, text=True, check=False,
                          stdout=subprocess.PIPE if keep_stdout else subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise RuntimeError(f"{name or shlex.join(cmd)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    kib = int(proc.stderr.rsplit("maxrss-kib ", 1)[1].split()[0])
    return PeakRun(wall, kib, proc.stdout or "", proc.stderr)
