# One command each for the demo and the tests; both create .venv and install into it first.
#   make demo    the demo on torch $(TORCH)
#   make stubs   rewrite src/torchdebug/__init__.pyi, the public API for type checkers (tools/api_stub.py)
#   make test    ruff (lint and format check), mypy (pyproject.toml's [tool.mypy]), the suite on torch $(TORCH) in .venv, then on each
#                torch of $(MATRIX), each in its own .venv-torch<version> (what CI runs;
#                `make test MATRIX=` skips the matrix). pytest-xdist runs one worker per core, a
#                test file per worker, so a file's module fixtures are built once; the files
#                holding a slow test are handed out first (tests/conftest.py orders them; xdist
#                would otherwise order the files by their number of tests, which left the long
#                files of one or two tests to the end, one worker waiting on another)
VENV ?= .venv
TORCH ?= 2.13.0
MATRIX ?= 2.11.0 2.14.1
PY := $(VENV)/bin/python
STAMP := $(VENV)/.torchdebug-installed
TEST_STAMP := $(VENV)/.torchdebug-test-installed
# pip keeps no copy of what it downloads: the matrix's torches come from PyPI as CUDA builds (5-6 GB
# a venv with their nvidia libraries), and a cached copy of each would sit on CI's disk beside them
export PIP_NO_CACHE_DIR := 1

.PHONY: demo test lint stubs test-one test-matrix bench clean

# torch is pinned before torchdebug is installed, so pip never picks a torch on its own
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH)
	$(PY) -m pip install -q -e .
	touch $(STAMP)

# the test extra (pytest, ruff, the optional libraries the integrations are tested with)
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test]'
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: lint test-one test-matrix

lint: $(TEST_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

stubs: $(STAMP)
	$(PY) tools/api_stub.py

test-one: $(TEST_STAMP)
	@$(PY) -c "import torch; print('torchdebug tests on torch', torch.__version__)"
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

test-matrix:
	@for version in $(MATRIX); do \
		$(MAKE) --no-print-directory test-one VENV=.venv-torch$$version TORCH=$$version || exit 1; \
	done

bench: $(STAMP)
	$(PY) bench/overhead.py
	$(PY) bench/compare.py
	$(PY) bench/compile_debug.py --rounds 1
	$(PY) bench/graph_dump.py
	$(PY) bench/diagnose.py --skip-minifier

clean:
	rm -rf $(VENV) .venv-torch* demo_out .pytest_cache .mypy_cache
