"""The suite's modules, longest first, so the two xdist workers finish together.

Why: `--dist loadscope` hands a worker a whole module at a time, in the order it is given (the Makefile turns off
xdist's own reorder, which sorts by the number of tests, not their cost). A module of six tests that takes two
minutes, handed out last, leaves the other worker idle for most of those two minutes; handed out first, the short
modules fill in around it (longest-processing-time-first). The seconds come from a recorded run
(`durations.json`, beside this file); a module not in it counts as the median, so a new module is neither first
nor last. A stale record only orders less well: it never changes what runs.

Refresh the record from a run's `--durations=0` output (docs/testing.md#parallel-runs):

    python -m pytest -n 2 --dist loadscope --no-loadscope-reorder --durations=0 > run.log
    python tests/durations.py run.log
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).with_name("durations.json")
_PHASE = re.compile(r"^([0-9.]+)s (?:setup|call|teardown)\s+(\S+?)::", re.M)


def module_seconds(log: str) -> dict[str, float]:
    """Seconds of setup, call and teardown per test module, summed, from pytest's `--durations=0` lines."""
    seconds: defaultdict[str, float] = defaultdict(float)
    for spent, module in _PHASE.findall(log):
        seconds[module] += float(spent)
    return {module: round(spent, 1) for module, spent in sorted(seconds.items(), key=lambda kv: -kv[1])}


def longest_first(items: list[pytest.Item], record: dict[str, float]) -> None:
    """Order `items` in place by their module's recorded seconds, longest first; stable within a module."""
    guess = statistics.median(record.values()) if record else 0.0
    items.sort(key=lambda item: -record.get(item.nodeid.split("::", 1)[0], guess))


def load_record() -> dict[str, float]:
    """The recorded seconds per module, or none (then the collection order stands)."""
    try:
        record = json.loads(RECORD.read_text())
    except FileNotFoundError:
        return {}
    return {str(module): float(spent) for module, spent in record.items()}


if __name__ == "__main__":
    measured = module_seconds(Path(sys.argv[1]).read_text())
    if not measured:
        sys.exit(f"{sys.argv[1]}: no `--durations=0` lines (run pytest with --durations=0)")
    RECORD.write_text(json.dumps(measured, indent=1) + "\n")
    print(f"{RECORD}: {len(measured)} modules, {sum(measured.values()):.0f} s")
