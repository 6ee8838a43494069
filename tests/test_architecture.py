"""The architecture's import rules (pyproject's [tool.importlinter], drawn in docs/architecture.md) hold.

`service/` and `indexer/` never import training (models.distill) or evaluation (models.evaluation);
the service never imports torch, transformers or ray; the two jobs never import each other; inside the
service, the HTTP layer (service.http) imports the serving core (service.core), never the reverse; the
contract at models' top level imports neither training nor evaluation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_every_top_level_contract_module_is_checked() -> None:
    """A module added at models' top level joins the contract's forbidden-import rule (pyproject lists them)."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    for module in sorted((ROOT / "models").glob("*.py")):
        if module.stem != "__init__":
            assert f'"models.{module.stem}"' in pyproject, f"add models.{module.stem} to the contract's rule"
