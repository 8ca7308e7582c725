# Quick start: `make run` (the service) and `make test` (the suite). `make setup` builds .venv only.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test run lint bench clean

setup: $(STAMP)

# torch is installed first and pinned, so nothing later can pull a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -p no:cacheprovider

lint: setup
	$(VENV)/bin/ruff check mebp_core app worker tests benchmarks

run: setup
	$(VENV)/bin/mebp serve

bench: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/engine_memory.py

clean:
	rm -rf $(VENV)
