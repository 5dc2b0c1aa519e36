# carbonrouter — the two commands of the README:
#   make reproduce   create .venv, install pinned deps, fetch + verify data, execute every notebook
#   make test        create/update .venv, ruff, pytest (unit + property), nbval on small parameters
#   make serve       emulated engines + the CarbonRouter proxy on 127.0.0.1 (Ctrl-C stops)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NBVAL_DIR := build/nbval
PYTEST_WORKERS ?= 2

.PHONY: reproduce test env data lint unit nbval benchmarks clean strip serve

reproduce: env data
	$(BIN)/python -m carbonrouter_lib.notebooks run

test: env lint unit nbval

env: $(STAMP)

# Rebuilt whenever the pins change. requirements.lock pins every transitive package.
$(STAMP): pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] in ((3, 11), (3, 12)), \
	  f"Python 3.11 or 3.12 needed (PYTHON=$(PYTHON) is {sys.version.split()[0]}); set PYTHON=..."'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

data: env
	$(BIN)/python -m carbonrouter_lib.datasets fetch

lint: env
	$(BIN)/ruff check .

unit: env
	$(BIN)/python -m pytest tests -n $(PYTEST_WORKERS) -q

nbval: env
	$(BIN)/python -m carbonrouter_lib.notebooks prepare-tests $(NBVAL_DIR)
	$(BIN)/python -m pytest --nbval-lax $(NBVAL_DIR) -n $(PYTEST_WORKERS) --dist loadfile -q -p no:cacheprovider

# The routing proxy on the embedded default (serve/default.yaml): nine emulated engines in three
# regions, replayed carbon, the proxy on 127.0.0.1:$(SERVE_PORT). SERVE_CONFIG=my.yaml for another file.
SERVE_PORT ?= 8000
SERVE_CONFIG ?=
serve: env data
	$(BIN)/python -m carbonrouter_lib.serve demo --port $(SERVE_PORT) $(if $(SERVE_CONFIG),--config $(SERVE_CONFIG))

# CPU benchmarks; benchmarks/gpu_profile.py needs an NVIDIA GPU (or --tiny for a CPU dry run).
benchmarks: env
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b; done

clean:
	rm -rf build results/notebooks

# Notebooks are stored without outputs.
strip: env
	$(BIN)/nbstripout notebooks/*.ipynb
