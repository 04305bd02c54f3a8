# Two commands on a fresh machine with Python 3.11, Java 17 and Maven:
#   make demo   # the main job: managed Neo4j + built-in model family + inspection
#   make test   # the test suite, against a real Neo4j server it starts itself
# Each installs what it needs first (idempotent: seconds when already installed; the large
# dependencies live in a shared environment under ~/.cache/slicesched keyed by their spec).

PY ?= python3
VENV := .venv
RUN := $(VENV)/bin/python

.PHONY: venv neo4j demo test lint typecheck bench clean

venv:
	@$(PY) tools/bootstrap.py

neo4j: venv
	@$(VENV)/bin/slicesched neo4j start

demo: venv
	@$(VENV)/bin/slicesched demo

test: venv
	@$(RUN) -m pytest $(PYTEST_ARGS)

lint: venv
	@$(RUN) -m ruff check service executor learned tests benchmarks tools

typecheck: venv
	@$(RUN) -m mypy

bench: venv
	@for b in benchmarks/[a-z]*.py; do echo "== $$b"; $(RUN) $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
