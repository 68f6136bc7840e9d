# One command each for the demo and the tests; both create .venv and install into it first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.torchdebug-installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/overhead.py
	$(PY) bench/compare.py
	$(PY) bench/compile_debug.py --rounds 1
	$(PY) bench/graph_dump.py
	$(PY) bench/diagnose.py --skip-minifier

clean:
	rm -rf $(VENV) demo_out .pytest_cache
