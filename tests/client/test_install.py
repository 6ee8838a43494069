"""The base install is the client: in a clean venv it pulls in none of the service's heavy dependencies,
and the client it installs talks to a real server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.corpus import PROBES
from tests.fixtures.install import clean_env, install_clean
from tests.fixtures.server import LiveServer

HEAVY = ["numpy", "faiss-cpu", "faiss", "onnxruntime", "torch", "tokenizers", "fastapi", "uvicorn"]

pytestmark = pytest.mark.slow

PROBE = """
import importlib.metadata as md, json, sys
from tandem.client import Client
installed = sorted(d.metadata["Name"].lower() for d in md.distributions())
with Client(sys.argv[1]) as client:
    first = client.search(sys.argv[2], top_k=1).results[0].id
import importlib.util, pathlib
(package,) = importlib.util.find_spec("service").submodule_search_locations
page = (pathlib.Path(package) / "static" / "index.html").is_file()  # package data: the search page ships
imported = sorted(m for m in ("numpy", "faiss", "onnxruntime", "torch") if m in sys.modules)
print(json.dumps({"installed": installed, "first": first, "imported": imported, "page": page}))
"""


def test_client_installs_without_the_service_and_answers(live_server: LiveServer, tmp_path: Path) -> None:
    bin_dir = install_clean(tmp_path)
    python = str(bin_dir / "python")
    query = sorted(PROBES)[0]
    result = subprocess.run([python, "-c", PROBE, live_server.url, query], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=clean_env())
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert not set(report["installed"]) & set(HEAVY), report["installed"]
    assert report["imported"] == []
    assert report["first"] == PROBES[query]
    assert report["page"]
    cli = subprocess.run([str(bin_dir / "tandem"), "--help"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env=clean_env())
    assert cli.returncode != 0 and "tandem[service]" in cli.stderr, cli.stderr
