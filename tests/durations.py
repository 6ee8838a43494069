"""The suite's modules, longest first, so the two xdist workers finish together; the Ray modules on one worker.

Why: `--dist loadscope` hands a worker a whole module at a time, in the order it is given (the Makefile turns off
xdist's own reorder, which sorts by the number of tests, not their cost). A module of six tests that takes two
minutes, handed out last, leaves the other worker idle for most of those two minutes; handed out first, the short
modules fill in around it (longest-processing-time-first). The seconds come from a recorded run
(`durations.json`, beside this file); a module not in it counts as the median, so a new module is neither first
nor last. A stale record only orders less well: it never changes what runs.

Modules that share a costly per-process fixture go to one worker as one unit (`SHARED_UNITS`): the Ray modules
share `ray_cluster` (tests/fixtures/ray_cluster.py), one local cluster per process, whose start is seconds of
CPU; spread over both workers, each would start one. `OneUnitScheduling` is loadscope with those modules' scope
renamed to the unit's, and the unit goes out at the place of its longest-first total.

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
from xdist.scheduler import LoadScopeScheduling

# unit name -> the per-process fixture its modules share, and the module paths (or folders, ending in "/") whose
# tests run on one worker together
SHARED_UNITS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ray": ("ray_cluster", ("tests/cluster/", "tests/indexer/test_ray_engine.py")),
}

RECORD = Path(__file__).with_name("durations.json")
_PHASE = re.compile(r"^([0-9.]+)s (?:setup|call|teardown)\s+(\S+?)::", re.M)


def module_seconds(log: str) -> dict[str, float]:
    """Seconds of setup, call and teardown per test module, summed, from pytest's `--durations=0` lines."""
    seconds: defaultdict[str, float] = defaultdict(float)
    for spent, module in _PHASE.findall(log):
        seconds[module] += float(spent)
    return {module: round(spent, 1) for module, spent in sorted(seconds.items(), key=lambda kv: -kv[1])}


def unit_of(module: str) -> str:
    """The work unit a module's tests go out in: its shared unit's name, else the module itself."""
    for unit, (_, paths) in SHARED_UNITS.items():
        if any(module == path or (path.endswith("/") and module.startswith(path)) for path in paths):
            return unit
    return module


def longest_first(items: list[pytest.Item], record: dict[str, float]) -> None:
    """Order `items` in place by their unit's recorded seconds (a module's, or a shared unit's modules' summed),
    longest first; stable within a unit, so its modules keep their collection order."""
    guess = statistics.median(record.values()) if record else 0.0
    modules = {item.nodeid.split("::", 1)[0] for item in items}
    units: defaultdict[str, float] = defaultdict(float)
    for module in modules:
        units[unit_of(module)] += record.get(module, guess)
    items.sort(key=lambda item: -units[unit_of(item.nodeid.split("::", 1)[0])])


def check_units(items: list[pytest.Item]) -> None:
    """A test that asks for a unit's fixture from a module outside that unit would start a second copy of it on
    the other worker: refuse the collection, naming the module to add."""
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        for unit, (fixture, _) in SHARED_UNITS.items():
            if fixture in getattr(item, "fixturenames", ()) and unit_of(module) != unit:
                raise pytest.UsageError(f"{module} uses {fixture}: add it to SHARED_UNITS[{unit!r}] in {__file__}")


def scope_of(nodeid: str) -> str:
    """The scope a test goes out in: its shared unit's name, else loadscope's (its module, or its class)."""
    module = nodeid.split("::", 1)[0]
    unit = unit_of(module)
    return unit if unit != module else nodeid.rsplit("::", 1)[0]  # loadscope's own rule


class OneUnitScheduling(LoadScopeScheduling):
    """xdist's loadscope (a module or a class at a time to a worker), the modules of a shared unit as one scope."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


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
