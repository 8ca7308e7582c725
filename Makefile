# Quick start: `make run` (the service) and `make test` (the suite). `make setup` builds .venv only.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test browser jemalloc llama-cpp run lint bench clean

setup: $(STAMP)

# torch is installed first and pinned, so nothing later can pull a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -c "from mebp_core.store.kernel_build import build_kernel; build_kernel()"
	touch $(STAMP)

# The dashboard tests drive Debian's chromium; it is installed here where missing. The suite
# runs in TEST_WORKERS processes, a test file each at a time (most tests wait on services and
# jobs of their own, so two overlap well on two cores), in collection order: the service's
# few long files first, the many short ones filling in at the end (xdist's default order,
# most tests first, left the long files for last).
TEST_WORKERS ?= 2
test: setup browser jemalloc llama-cpp
	HF_HUB_OFFLINE=1 MEBP_TESTS_REQUIRE_ALL=1 $(PY) -m pytest -q -p no:cacheprovider --durations=25 \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: setup
	$(VENV)/bin/ruff check mebp_core service app worker tests benchmarks

browser:
	@command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; }

# Every engine process runs under jemalloc where the host has it (mebp_core/allocator.py);
# installed here where missing and possible (engines fall back to glibc's malloc, which
# `make test` counts as a failure).
jemalloc: setup
	@$(PY) -c "from mebp_core.allocator import jemalloc_library as j; exit(j() is None)" || \
	  { apt-get update -q && apt-get install -y -q libjemalloc2; } || \
	  echo "mebp: libjemalloc2 could not be installed: engines run on glibc's malloc" >&2

# llama.cpp itself, for the GGUF deployment tests: llama-cpp-python built from its PyPI sdist
# (which vendors llama.cpp) once per machine and kept as a wheel, portable (no -march=native)
# and at -O1, since the tests run tiny models; later runs install the kept wheel.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CPP := llama-cpp-python==$(LLAMA_CPP_VERSION)
WHEELS := $(HOME)/.cache/mebp/wheels
LLAMA_CPP_CMAKE := -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
	-DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS_RELEASE=-O1

llama-cpp: setup
	@$(PY) -c "import llama_cpp" 2>/dev/null || { \
	  ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || { \
	    echo "building $(LLAMA_CPP) from its sdist (once per machine, ~15 min on 2 cores)"; \
	    command -v g++ >/dev/null || { apt-get update -q && apt-get install -y -q g++; }; \
	    CMAKE_ARGS="$(LLAMA_CPP_CMAKE)" $(PY) -m pip wheel --quiet --no-deps \
	      --no-binary llama-cpp-python -w $(WHEELS) "$(LLAMA_CPP)"; }; \
	  $(PY) -m pip install --quiet --find-links $(WHEELS) "$(LLAMA_CPP)"; }

run: setup jemalloc
	$(VENV)/bin/mebp serve

bench: setup jemalloc
	HF_HUB_OFFLINE=1 $(PY) benchmarks/engine_memory.py

clean:
	rm -rf $(VENV)
