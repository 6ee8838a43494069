"""The service never imports torch or Ray (training and indexing dependencies); the local indexer engine
never imports Ray."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import service.http.app, service.runtime.main, service.core.batcher, service.core.searcher
heavy = sorted(name for name in ("torch", "transformers", "ray") if name in sys.modules)
assert not heavy, f"service imports {heavy}"
"""


def test_service_does_not_import_torch() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


LOCAL_ENGINE = """
import sys
import indexer.build, indexer.versions.update, indexer.export, tandem.cli
assert "ray" not in sys.modules, "the local engine imports ray"
"""


def test_local_indexer_does_not_import_ray() -> None:
    result = subprocess.run([sys.executable, "-c", LOCAL_ENGINE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


DEMO_REUSE = """
import sys
import tandem.cli, tandem.demo
from tandem.demo import GPU_DEVICE_FILES, demo_precision
from pathlib import Path
demo_precision()
if not any(Path(f).exists() for f in GPU_DEVICE_FILES):
    assert "torch" not in sys.modules, "a demo that reuses its bundle and student imports torch"
"""


def test_a_demo_that_builds_nothing_does_not_import_torch() -> None:
    """A second `make demo` decides what to reuse (the precision `auto` picks included) and serves without torch on
    a machine with no GPU driver: seconds saved, and the server's memory."""
    result = subprocess.run([sys.executable, "-c", DEMO_REUSE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
