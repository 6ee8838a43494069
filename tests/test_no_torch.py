"""The service never imports torch or Ray (training and indexing dependencies); the local indexer engine
never imports Ray.

One fresh interpreter answers all three (each a start and the project's imports, so three were three times the
cost): it imports the service and checks, then imports what a reused demo imports and checks, then the local
indexer and checks. Imports only add to sys.modules, so each check sees its own imports and the earlier steps'
ones: a module that a step's imports pull in shows in that step's check as it would in an interpreter of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
found = {}

import service.http.app, service.runtime.main, service.core.batcher, service.core.searcher
found["service"] = sorted(name for name in ("torch", "transformers", "ray") if name in sys.modules)

import tandem.cli, tandem.demo
from tandem.demo import GPU_DEVICE_FILES, demo_precision
from pathlib import Path
demo_precision()
found["gpu"] = any(Path(f).exists() for f in GPU_DEVICE_FILES)
found["demo"] = "torch" in sys.modules

import indexer.build, indexer.versions.update, indexer.export, tandem.cli
found["local"] = "ray" in sys.modules
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def imported() -> dict[str, object]:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def test_service_does_not_import_torch(imported: dict[str, object]) -> None:
    assert imported["service"] == [], f"service imports {imported['service']}"


def test_local_indexer_does_not_import_ray(imported: dict[str, object]) -> None:
    assert imported["local"] is False, "the local engine imports ray"


def test_a_demo_that_builds_nothing_does_not_import_torch(imported: dict[str, object]) -> None:
    """A second `make demo` decides what to reuse (the precision `auto` picks included) and serves without torch on
    a machine with no GPU driver: seconds saved, and the server's memory."""
    if not imported["gpu"]:  # with a GPU driver the demo may import torch to use it
        assert imported["demo"] is False, "a demo that reuses its bundle and student imports torch"
