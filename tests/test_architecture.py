"""The architecture's import rules (pyproject's [tool.importlinter], drawn in docs/architecture.md) hold.

`service/` and `indexer/` never import training (models.distill) or evaluation (models.evaluation);
the service never imports torch, transformers or ray; the two jobs never import each other; inside the
service, the HTTP layer (service.http) imports the serving core (service.core), never the reverse; the
contract (models' top level, bundle, encoders, embeddings) and the search import neither training nor evaluation;
models' floors stand search over bundle over encoders; inside models.bundle the version's life stands on three
engines that never import each other (vectors, BM25, payload), and those on the storage helpers they share; only
models.bundle imports FAISS and BM25; no import circle joins the project's modules; and no folder holds more
than 15 modules.
"""

from __future__ import annotations

import os
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    # This tree's code, the client's distribution (client/) included, shadows whatever the venv installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")])}
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_every_top_level_contract_module_is_checked() -> None:
    """A module or package added at models' top level joins the contract's forbidden-import rule (pyproject lists
    them), and the top level stays a short list of what every floor uses (issue 41: at most 8 modules; issue 54
    added the ninth, `hashing`, the one home of file hashing)."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    modules = [m.stem for m in sorted((ROOT / "models").glob("*.py")) if m.stem != "__init__"]
    packages = [p.name for p in sorted((ROOT / "models").iterdir()) if (p / "__init__.py").is_file()]
    for name in modules + [p for p in packages if p not in {"distill", "evaluation", "datasets"}]:
        assert f'"models.{name}"' in pyproject, f"add models.{name} to the contract's rule"
    assert len(modules) <= 9, f"models' top level holds {len(modules)} modules: {modules}"


MAX_MODULES = 15  # docs/decisions.md, "models/ by owner": past about 15 modules a folder splits by format or job
UNCOUNTED = {".git", ".venv", "docs", "bench", "node_modules", "__pycache__"}  # bench/ has a rule of its own


def test_no_folder_holds_more_than_15_modules() -> None:
    """No folder of the project holds more than 15 modules of its own (.py files other than __init__.py), so each
    says what it holds by its sub-folders (issue 54); bench/ answers to its own rule, docs/ holds no code."""
    crowded = {}
    for folder in [ROOT, *ROOT.rglob("*/")]:
        parts = folder.relative_to(ROOT).parts
        if not folder.is_dir() or any(p in UNCOUNTED or p.startswith(".") for p in parts):
            continue
        modules = [m.name for m in folder.glob("*.py") if m.name != "__init__.py"]
        if len(modules) > MAX_MODULES:
            crowded[str(folder.relative_to(ROOT))] = len(modules)
    assert not crowded, f"folders over {MAX_MODULES} modules: {crowded}"


def test_only_the_bundle_imports_faiss() -> None:
    """No module of the project outside models/bundle/ imports FAISS or bm25s, directly (import-linter allows
    indirect imports, so this reads the graph's direct arrows)."""
    import grimp

    graph = grimp.build_graph("models", "indexer", "service", "tandem", "cluster", cache_dir=None,
                              include_external_packages=True)
    for engine in ("faiss", "bm25s"):
        importers = {m for m in graph.find_modules_that_directly_import(engine)}
        assert all(m.startswith("models.bundle.") for m in importers), sorted(importers)


def _imports() -> dict[str, set[str]]:
    """Each project module and the project modules it imports: module-level, function-level and TYPE_CHECKING."""
    import grimp

    packages = ("models", "indexer", "service", "tandem", "cluster")
    graph = grimp.build_graph(*packages, cache_dir=None)
    ours = {m for m in graph.modules if m.split(".")[0] in packages}
    return {m: {d for d in graph.find_modules_directly_imported_by(m) if d in ours} for m in ours}


def test_no_import_cycles() -> None:
    """No circle of imports among the project's modules."""
    try:
        list(TopologicalSorter(_imports()).static_order())
    except CycleError as exc:
        pytest.fail("import cycle: " + " -> ".join(exc.args[1]))

