# Two commands do all the set-up: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: test run install lint typecheck bench clean

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
	$(PY) -m benchmarks.report

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .benchmarks
