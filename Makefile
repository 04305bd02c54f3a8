# Two commands on a fresh machine with Python 3.11, Java 17 and Maven:
#   make demo   # the main job: managed Neo4j + built-in model family + inspection
#   make test   # the test suite, against a real Neo4j server it starts itself
# Each installs what it needs first (idempotent: about a second when already installed). The
# Python dependencies are the versions locked in uv.lock, installed by uv into .venv, with this
# clone's code installed editable; uv keeps their files in its per-machine cache (~/.cache/uv)
# and hardlinks them into each clone's .venv, so torch is downloaded once per machine.

PY ?= python3
VENV := .venv
RUN := $(VENV)/bin/python
SLICESCHED_CACHE ?= $(HOME)/.cache/slicesched
UV_VERSION := 0.13.9
UV_HOME := $(SLICESCHED_CACHE)/tools/uv-$(UV_VERSION)
UV := $(UV_HOME)/bin/uv
KUSTOMIZE_VERSION := v5.7.1
KUSTOMIZE_HOME := $(SLICESCHED_CACHE)/tools/kustomize-$(KUSTOMIZE_VERSION)
KUSTOMIZE := $(KUSTOMIZE_HOME)/kustomize

.PHONY: venv kustomize browser neo4j data demo test test-fast lint typecheck docs bench clean

# The environment: exactly uv.lock (--locked also fails if pyproject.toml changed without
# `uv lock`), the dev extra included, and the ray extra so that the tests run the sweeps on a
# local Ray too (tests/unit/test_sweep.py). A .venv of the old bootstrap layout is replaced.
venv: $(UV)
	@if [ -f $(VENV)/.slicesched-key ]; then rm -rf $(VENV); fi
	@$(UV) sync --locked --extra dev --extra ray --python $(PY) --no-python-downloads

# uv itself, pinned, in a small environment of its own under $(SLICESCHED_CACHE)/tools (once
# per machine; a venv, so that a Debian "externally managed" Python does not refuse it).
$(UV):
	@echo "[venv] installing uv $(UV_VERSION) into $(UV_HOME) (once per machine)"
	@mkdir -p $(dir $(UV_HOME))
	@tmp=$$(mktemp -d "$(UV_HOME).tmp.XXXXXX") || exit 1; \
	  pipi="-m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)"; \
	  { $(PY) -m venv "$$tmp" && "$$tmp/bin/python" $$pipi; } || \
	    { rm -rf "$$tmp" && mkdir "$$tmp" && $(PY) $$pipi --target "$$tmp"; }; \
	  if [ -x "$$tmp/bin/uv" ]; then mv -T "$$tmp" "$(UV_HOME)" 2>/dev/null || rm -rf "$$tmp"; \
	  else rm -rf "$$tmp"; echo "[venv] could not install uv with $(PY) (venv or pip needed)" >&2; exit 1; fi

# kustomize, pinned, built from source with Go into $(SLICESCHED_CACHE)/tools (once per machine;
# 1-3 minutes on two cores) for tests/unit/test_deploy.py, which renders deploy/. v5.7.1 builds
# with Go >= 1.22.7 (v5.8.3 wants Go 1.27). Without Go it says so and goes on (that test then
# skips); a failed build is reported and that test fails saying `make kustomize`.
kustomize: $(KUSTOMIZE)

$(KUSTOMIZE):
	@if ! command -v go >/dev/null 2>&1; then \
	  echo "[kustomize] Go is not installed: deploy/ is not rendered (tests/unit/test_deploy.py skips)"; exit 0; fi; \
	  echo "[kustomize] building kustomize $(KUSTOMIZE_VERSION) into $(KUSTOMIZE_HOME) with $$(go version) (once per machine)"; \
	  mkdir -p $(dir $(KUSTOMIZE_HOME)); \
	  tmp=$$(mktemp -d "$(KUSTOMIZE_HOME).tmp.XXXXXX") || exit 1; \
	  if GOBIN="$$tmp" GOFLAGS=-buildvcs=false go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION); then \
	    mv -T "$$tmp" "$(KUSTOMIZE_HOME)" 2>/dev/null || rm -rf "$$tmp"; \
	  else rm -rf "$$tmp"; echo "[kustomize] could not build kustomize (the Go module proxy is needed once)" >&2; fi

# Chromium and its WebDriver from Debian's packages, for the web console's browser tests
# (tests/browser): installed with apt-get when missing (once per machine; needs root). Without
# apt-get or root it says so and goes on (those tests then skip, naming this target).
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then exit 0; fi; \
	  if ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ]; then \
	    echo "[browser] chromium and chromium-driver are missing and apt-get cannot install them here (needs root):" \
	         "the browser tests skip"; exit 0; fi; \
	  echo "[browser] installing chromium and chromium-driver from Debian's packages (once per machine)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      chromium chromium-driver >/dev/null; } || { echo "[browser] apt-get install failed" >&2; exit 1; }

neo4j: venv
	@$(VENV)/bin/slicesched neo4j start

# The public traces and profiles (service/data/manifest.json): fetched and verified into
# ~/.cache/slicesched/data only where no data folder (that cache, ../shared/data) holds them.
data: venv
	@$(VENV)/bin/slicesched data fetch --missing

demo: venv data
	@$(VENV)/bin/slicesched demo

# The suite runs in TEST_WORKERS processes (pytest-xdist; 0: one process), a test file to a worker.
# Each worker starts its own Neo4j; tests isolate themselves by fresh tenant ids, not by order.
TEST_WORKERS ?= 2
test: venv kustomize browser data
	@$(RUN) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The fast tier: the unit tests that need no Neo4j, no browser and no process of their own, and take
# no more than a second or so each (markers: tests/conftest.py and pyproject.toml): under a minute.
test-fast: venv
	@TEST_TIER=fast $(RUN) -m pytest tests/unit -n $(TEST_WORKERS) -m "not neo4j and not slow and not browser and not subprocess" $(PYTEST_ARGS)

lint: venv
	@$(RUN) -m ruff check service executor learned tests benchmarks

typecheck: venv
	@$(RUN) -m mypy

# The docs site (mkdocs, Material theme) into site/, --strict: a broken link, an unknown record or
# key in a {{rec:...}} figure, or a benchmark whose --help fails stops the build. docs/hooks.py
# generates the results page and a page per benchmark from benchmarks/results/*.json.
docs: venv
	@NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

bench: venv
	@for b in benchmarks/[a-z]*.py; do echo "== $$b"; $(RUN) $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache site
