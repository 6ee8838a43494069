"""Every bench script imports and parses `--help`, so a move or a rename elsewhere (models/, service/, the harness)
cannot leave a figure's script broken until someone reruns it. Why `--help` in this process and not the runs:
the runs need students, SciFact and minutes of a quiet machine (their records say which); the imports and the
argument parsers are what a refactor breaks."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import bench

BENCH = Path(bench.__file__).parent
MODULES = sorted(info.name for info in pkgutil.walk_packages([str(BENCH)], "bench.") if not info.ispkg)
HARNESS = {"bench.harness.record", "bench.harness.runs", "bench.harness.servers"}
SCRIPTS = [name for name in MODULES if name not in HARNESS]


def test_bench_is_split_by_area() -> None:
    """No folder of bench/ holds more than 15 modules of its own (the project's rule for every folder)."""
    folders = {path.parent for path in BENCH.rglob("*.py")}
    crowded = {str(f.relative_to(BENCH)): n for f in folders if (n := len(list(f.glob("[!_]*.py")))) > 15}
    assert not crowded, crowded
    assert not list(BENCH.glob("[!_]*.py")), "bench scripts live in an area's folder; the shared code in harness/"


@pytest.mark.parametrize("name", SCRIPTS)
def test_bench_script_imports_and_helps(name: str, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(name)
    main = getattr(module, "main", None)
    if main is None:  # a peer's server or helpers that a script of the same area starts
        assert module.__doc__
        return
    monkeypatch.setattr("sys.argv", [name, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out
