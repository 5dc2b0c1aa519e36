# carbonrouter — the two commands of the README:
#   make reproduce   create .venv, install pinned deps, fetch + verify data, execute every notebook
#   make test        create/update .venv, ruff, pytest (unit + property), nbval on small parameters
#   make lab         create/update .venv, fetch data, register the kernel, start JupyterLab
#   make serve       emulated engines + the CarbonRouter proxy on 127.0.0.1 (Ctrl-C stops)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NBVAL_DIR := build/nbval
PYTEST_WORKERS ?= 2
LAB_PORT ?= 8888
# Debian's Chromium, driven by Playwright in tests/test_explorer_browser.py (it downloads no browser).
CHROMIUM ?= /usr/bin/chromium

.PHONY: reproduce test env data lint unit nbval benchmarks clean strip lab kernel browser serve

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

unit: env browser
	CARBONROUTER_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest tests -n $(PYTEST_WORKERS) -q

# The notebooks name the kernel `carbonrouter` (for JupyterLab); nbval runs them on this venv's
# Python whether or not that kernel is registered.
nbval: env
	$(BIN)/python -m carbonrouter_lib.notebooks prepare-tests $(NBVAL_DIR)
	$(BIN)/python -m pytest --nbval-lax --nbval-current-env $(NBVAL_DIR) -n $(PYTEST_WORKERS) --dist loadfile -q -p no:cacheprovider

# The Jupyter kernel `carbonrouter` (this venv's Python), registered inside the venv
# (.venv/share/jupyter/kernels/carbonrouter), where the venv's JupyterLab looks; not in ~/.local.
kernel: env
	$(BIN)/python -m carbonrouter_lib.notebooks kernel

# JupyterLab on http://127.0.0.1:$(LAB_PORT) (LAB_PORT=... to change) serving notebooks/, every
# notebook on the `carbonrouter` kernel; notebooks/explore.ipynb is the interactive explorer.
lab: env data
	$(BIN)/python -m carbonrouter_lib.notebooks lab --port $(LAB_PORT)

# Debian's chromium for the explorer's browser test: installed with apt-get when missing and we are
# root (as in CI). Otherwise the test is skipped and says why (fails instead where
# CARBONROUTER_REQUIRE_BROWSER=1, as .ci/run sets).
browser:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's chromium for tests/test_explorer_browser.py"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
	    || echo "WARNING: apt-get could not install chromium; the browser test will not run"; \
	else \
	  echo "NOTE: no $(CHROMIUM), and apt-get is not available to this user: the browser test" \
	       "will be skipped (as root: apt-get install chromium)"; \
	fi

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
