"""The service runtime must not pull in torch (it is a training-only dependency)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import service.app, service.main, service.engine
heavy = sorted(name for name in ("torch", "transformers") if name in sys.modules)
assert not heavy, f"service imports {heavy}"
"""


def test_service_does_not_import_torch() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
