"""Every bench script imports and parses `--help`, so a move or a rename elsewhere (models/, service/, the harness)
cannot leave a figure's script broken until someone reruns it. Why `--help` in this process and not the runs:
the runs need students, SciFact and minutes of a quiet machine (their records say which); the imports and the
argument parsers are what a refactor breaks."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import bench
from bench.harness.record import LoadSpan, command_line, parse_with_output
from bench.harness.runs import module_cmd, run_peak
from bench.harness.servers import process_tree, served
from tests.fixtures.server import LiveServer

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


def test_served_answers_once_ready_and_is_stopped_after(mini_bundle: Path, mini_student: Path,
                                                        mini_server: LiveServer, tmp_path: Path) -> None:
    """The harness's server: `tandem serve` on a free port, ready before the body runs, gone after it. It serves the
    bundle and student it was given: its answer is the in-process service's over the same two (mini_server)."""
    query = {"query": "hormone that controls blood sugar", "top_k": 3}
    expected = [hit["id"] for hit in mini_server.client.post("/search", json=query).json()["results"]]
    with served(mini_bundle, mini_student, tmp_path / "serve.log") as server:
        answer = server.client.post("/search", json=query)
        assert answer.status_code == 200, answer.text
        assert [hit["id"] for hit in answer.json()["results"]] == expected
        process = server.process
    assert process.poll() is not None


def test_run_peak_reports_the_childs_own_peak(tmp_path: Path) -> None:
    """GNU time's peak is the child's: a child that touches 64 MiB reports at least that, and its output comes back."""
    run = run_peak(["python", "-c", "b = bytearray(64 << 20); print(len(b))"], tmp_path / "home")
    assert run.peak_kib >= 64 << 10
    assert run.stdout.strip() == str(64 << 20)


def test_a_record_names_the_module_and_its_arguments() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1)
    args = parse_with_output(parser, ["--n", "3", "--no-write"])
    assert (args.n, args.no_write, args.argv) == (3, True, ["--n", "3", "--no-write"])
    assert command_line(["--n", "3"]).endswith(" --n 3")
    assert module_cmd("bench.index.index_types", "--help")[1:] == ["-m", "bench.index.index_types", "--help"]
    assert " before, " in LoadSpan().text() and LoadSpan().text().endswith(" after")


def test_process_tree_holds_grandchildren() -> None:
    """A served process's CPU counts its workers, which `tandem serve --processes N` forks from a forkserver of its
    own: grandchildren of the process the bench started."""
    grandchild = "import subprocess, sys; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); p.wait()"
    with subprocess.Popen([sys.executable, "-c", grandchild], stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            sleeper = int(child.stdout.readline())
            assert process_tree(child.pid) == [child.pid, sleeper]
            assert process_tree(sleeper) == [sleeper]
        finally:
            subprocess.run(["pkill", "-P", str(child.pid)], check=False)
            child.kill()
