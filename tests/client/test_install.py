"""The client is a distribution of its own: its wheel holds one package, `tandem_client`; installed alone into a
fresh venv it brings none of the server's packages nor its heavy dependencies, and talks to a real server; beside
the server's distribution it still imports none of it."""

from __future__ import annotations

import json
import subprocess
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.fixtures.corpus import PROBES
from tests.fixtures.install import (  # noqa: F401  (fixtures: built once per run)
    CLIENT,
    REPO,
    clean_env,
    client_wheel,
    new_venv,
    pip_install,
    server_wheel,
    venv_dir,
    wheelhouse,
)
from tests.fixtures.server import LiveServer

SERVER_PACKAGES = ["indexer", "models", "service", "tandem"]
HEAVY = ["numpy", "faiss-cpu", "faiss", "onnxruntime", "torch", "tokenizers", "fastapi", "uvicorn"]

# Run by the venv's python, outside the repository: what `import tandem_client` loads, what the venv holds, and
# (given a server's URL and a query) the first hit's id.
PROBE = """
import importlib.metadata as md, importlib.util, json, sys
import tandem_client
SERVER = {"models", "indexer", "service", "tandem"}
loaded = sorted({name.split(".")[0] for name in sys.modules} & SERVER)
heavy = sorted(m for m in ("numpy", "faiss", "onnxruntime", "torch") if m in sys.modules)
findable = sorted(m for m in SERVER if importlib.util.find_spec(m) is not None)
installed = sorted(d.metadata["Name"].lower() for d in md.distributions())
ours = sorted({f.parts[0] for f in md.distribution("tandem-client").files or []
               if not f.parts[0].endswith(".dist-info")})
first = None
if len(sys.argv) > 1:
    with tandem_client.Client(sys.argv[1]) as client:
        first = client.search(sys.argv[2], top_k=1).results[0].id
print(json.dumps({"loaded": loaded, "heavy": heavy, "findable": findable, "installed": installed,
                  "ours": ours, "first": first}))
"""


def test_client_metadata_follows_the_server() -> None:
    """Released together: the same version, license and Python, and the server's own ranges of httpx and pydantic
    (the ones locks/dev.txt pins), so the client installs beside the server without a conflict."""
    server = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert client["name"] == "tandem-client"
    for key in ("version", "license", "requires-python"):
        assert client[key] == server[key], key
    ranges = {Requirement(r).name: str(Requirement(r).specifier) for r in server["dependencies"]}
    assert {Requirement(r).name: str(Requirement(r).specifier) for r in client["dependencies"]} == {
        name: ranges[name] for name in ("httpx", "pydantic")}


def _top_level(wheel: Path) -> set[str]:
    """The top-level names a wheel installs into site-packages, its .dist-info left out."""
    names = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    return {name for name in names if not name.endswith(".dist-info")}


def _probe(bin_dir: Path, cwd: Path, *args: str) -> dict[str, Any]:
    result = subprocess.run([str(bin_dir / "python"), "-c", PROBE, *args], capture_output=True, text=True,
                            timeout=120, cwd=cwd, env=clean_env())
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


@pytest.mark.slow
def test_client_installs_alone_imports_nothing_of_the_server_and_answers(live_server: LiveServer,
                                                                         client_wheel: Path,  # noqa: F811
                                                                         server_wheel: Path,  # noqa: F811
                                                                         wheelhouse: Path,  # noqa: F811
                                                                         venv_dir: Path,  # noqa: F811
                                                                         tmp_path: Path) -> None:
    """The wheelhouse holds the server's service dependencies too: pip, resolving from what the client declares,
    installs none of them (a client that declared one would get it, and fail the checks below)."""
    assert _top_level(client_wheel) == {"tandem_client"}
    assert "tandem_client/py.typed" in zipfile.ZipFile(client_wheel).namelist()  # its type hints reach mypy
    bin_dir = new_venv(venv_dir / "venv")
    pip_install(bin_dir, wheelhouse, str(client_wheel))  # with its dependencies, httpx and pydantic
    work = tmp_path / "work"  # the probes' directory: nothing importable in it
    work.mkdir()

    query = sorted(PROBES)[0]
    alone = _probe(bin_dir, work, live_server.url, query)
    assert alone["ours"] == ["tandem_client"]
    assert alone["findable"] == [] and alone["loaded"] == [] and alone["heavy"] == []
    installed = set(alone["installed"])
    assert "tandem-client" in installed and "tandem" not in installed
    assert not installed & set(HEAVY), sorted(installed)
    assert alone["first"] == PROBES[query]

    # The server's distribution, beside it (its base install, without the service extra): it ships the design
    # card's four packages and the search page, not the client; importing the client still loads none of them.
    names = zipfile.ZipFile(server_wheel).namelist()
    assert _top_level(server_wheel) == set(SERVER_PACKAGES)
    assert "service/static/index.html" in names  # package data: the search page ships
    pip_install(bin_dir, wheelhouse, "--no-deps", str(server_wheel))
    beside = _probe(bin_dir, work)
    assert beside["findable"] == SERVER_PACKAGES
    assert beside["loaded"] == [] and beside["heavy"] == []
    cli = subprocess.run([str(bin_dir / "tandem"), "--help"], capture_output=True, text=True, timeout=60,
                         cwd=work, env=clean_env())
    assert cli.returncode != 0 and "tandem[service]" in cli.stderr and "tandem-client" in cli.stderr, cli.stderr
