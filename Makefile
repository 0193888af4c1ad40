# poolpipe: the two set-up commands are `make demo` and `make test`; both create .venv if missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

demo: $(STAMP)
	$(VENV)/bin/poolpipe demo --out demo-out

bench: $(STAMP)
	$(PY) benchmarks/planner.py

clean:
	rm -rf $(VENV) demo-out out .pytest_cache
