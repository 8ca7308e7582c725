# Quick start: `make run` (the service) and `make test` (the suite). `make setup` builds .venv only.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test browser run lint bench clean

setup: $(STAMP)

# torch is installed first and pinned, so nothing later can pull a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -c "from mebp_core.store.kernel_build import build_kernel; build_kernel()"
	touch $(STAMP)

# The dashboard tests drive Debian's chromium; it is installed here where missing.
test: setup browser
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -p no:cacheprovider --durations=25

lint: setup
	$(VENV)/bin/ruff check mebp_core service app worker tests benchmarks

browser:
	@command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; }

run: setup
	$(VENV)/bin/mebp serve

bench: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/engine_memory.py

clean:
	rm -rf $(VENV)
