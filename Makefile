# poolpipe: the two set-up commands are `make demo` and `make test`; both create .venv if missing.
# `make test` runs `make lint` first (ruff, and the import-linter layer contracts in pyproject.toml).
# VENV may name an existing environment on the command line, e.g. `make lint VENV=/path/to/.venv`: lint installs
# nothing into an environment that already has its tools, but test, demo and bench reinstall this tree
# (pip install -e) into VENV whenever pyproject.toml is newer than VENV/.installed.
PYTHON ?= python3
VENV   := .venv
# ONNX Runtime's distribution (pyproject's extras): cpu (onnxruntime) or gpu (onnxruntime-gpu and the GPU engines)
ORT    ?= cpu
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench venv clean perf-analyzer native gpu-check

venv: $(STAMP) native

# The native backends (C): the emulated device (backends/native) and the sidecar's front end (backends/native_front),
# built by cc once per source version. A compile error fails make; only where no C compiler can be run does one line
# say so (emulated partitions then run the Python backend; serve --native-grpc-port is refused) and make goes on.
# NATIVE_FLAGS=--require fails there too (.ci/run).
native: $(STAMP)
	$(PY) -m backends.native $(NATIVE_FLAGS)
	$(PY) -m backends.native_front $(NATIVE_FLAGS)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,$(ORT)]'
	touch $(STAMP)

# perf_analyzer (NVIDIA's load tool) for tests/test_triton_tools.py: from the tritonclient 2.41.1 wheel, with
# libb64 built by gcc where the system has none (tests/tools/install_perf_analyzer.py says why).
PERF_ANALYZER := $(VENV)/bin/perf_analyzer

$(PERF_ANALYZER): $(STAMP) tests/tools/install_perf_analyzer.py tests/tools/libb64.c
	$(PY) tests/tools/install_perf_analyzer.py --prefix $(VENV)

perf-analyzer: $(PERF_ANALYZER)

# lint-imports imports the packages to find their files: PYTHONPATH puts this tree's first, whoever calls make.
lint: $(if $(and $(wildcard $(VENV)/bin/ruff),$(wildcard $(VENV)/bin/lint-imports)),,$(STAMP))
	$(VENV)/bin/ruff check .
	PYTHONPATH=$(CURDIR) $(VENV)/bin/lint-imports --no-logo

test: $(STAMP) lint $(PERF_ANALYZER) native
	$(PY) -m pytest -q -p no:cacheprovider --durations=15

# The GPU smoke (tests/gpu, pytest marker gpu; docs/deploying.md#the-first-gpu-run): checks that fail rather than
# print, under ten minutes on one GPU. Where no NVIDIA GPU is present, one line says so and it exits 0 (installing
# nothing). Where one is, the environment is built with ORT=gpu (onnxruntime-gpu, TensorRT, torch, NVML) and the
# smoke runs; `make test` never runs it.
gpu-check:
	@if $(PYTHON) tests/gpu/run.py --probe; then :; else $(MAKE) venv ORT=gpu && $(PY) tests/gpu/run.py; fi

demo: $(STAMP) native
	$(VENV)/bin/poolpipe demo --out demo-out

bench: $(STAMP)
	$(PY) -m benchmarks.planner_bench

# Only this tree's own .venv: an environment named on the command line (VENV=...) is never removed.
clean:
	rm -rf .venv demo-out out .pytest_cache .ruff_cache .import_linter_cache backends/native/build backends/native_front/build
