# Two commands do all the set-up: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: test run install lint typecheck bench bench-peers spark-run clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

install: $(PY)
	$(PY) -m pip install -e '.[dev]'

lint: install
	$(VENV)/bin/ruff check sessionstore spark_adapter tests benchmarks

typecheck: install
	$(VENV)/bin/mypy sessionstore

test: install lint typecheck
	$(VENV)/bin/pytest

run: install
	$(PY) -m sessionstore.demo

bench: install
	$(PY) -m benchmarks.store_bench
	$(PY) -m benchmarks.engine_bench
	$(PY) -m benchmarks.spark_bench
	$(PY) -m benchmarks.report

# PyFlink cannot share the dev environment (see pyproject.toml), so it gets its own.
.venv-bench/bin/python:
	$(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install -e '.[bench]'

bench-peers: install .venv-bench/bin/python
	$(PY) -m benchmarks.peers
	$(PY) -m benchmarks.report

soak: install ; SESSIONSTORE_SOAK=1 $(VENV)/bin/pytest tests/reliability/test_corruption_matrix.py -q -s

spark-run: install
	$(PY) -m spark_adapter.example

clean:
	rm -rf $(VENV) .venv-bench build *.egg-info .pytest_cache .mypy_cache .ruff_cache .benchmarks out
