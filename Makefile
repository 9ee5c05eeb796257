# Two commands do all the set-up: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# pip runs only when pyproject.toml is newer than this stamp, quietly; its log is shown on failure
STAMP := $(VENV)/.installed
# pip keeps no cache: the only thing it cached was the wheel it builds from pyspark's source
# release (about 450 MB for 4.x), which no other install here reuses (the 3.5 environment
# builds its own); `make PIP_CACHE= test` keeps pip's cache for repeated fresh set-ups
PIP_CACHE ?= --no-cache-dir

.PHONY: test run install lint typecheck bench bench-peers spark-floors spark-run test-spark35 soak \
	cluster-test clean

$(PY):
	@$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@echo "installing sessionstore[dev] into $(VENV) (once; pip's output is shown only if it fails)"
	@$(PY) -m pip install -q $(PIP_CACHE) --upgrade pip > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	@$(PY) -m pip install -q $(PIP_CACHE) -e '.[dev]' >> $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	@touch $@

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check sessionstore spark_adapter tests benchmarks

typecheck: install
	$(VENV)/bin/mypy sessionstore spark_adapter benchmarks

test: install lint typecheck
	$(VENV)/bin/pytest
	@$(MAKE) --no-print-directory test-spark35

run: install
	@$(PY) -m sessionstore.demo

bench: install
	$(PY) -m benchmarks.store_bench
	$(PY) -m benchmarks.engine_bench
	$(PY) -m benchmarks.spark_bench
	$(PY) -m pip install -q -e '.[bench-static]'
	$(PY) -m benchmarks.static_bench
	$(PY) -m benchmarks.report

# PyFlink cannot share the dev environment (see pyproject.toml), so it gets its own.
.venv-bench/bin/python:
	$(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install -e '.[bench]'

# Spark's own per-micro-batch floor beside native and sessionize (a few minutes; not in `bench`)
spark-floors: install
	$(PY) -m benchmarks.spark_floors

bench-peers: install .venv-bench/bin/python
	$(PY) -m benchmarks.peers
	$(PY) -m benchmarks.report

soak: install ; SESSIONSTORE_SOAK=1 $(VENV)/bin/pytest tests/reliability/test_corruption_matrix.py -q -s

# The Arrow engine needs only mapInArrow (Spark >= 3.3): check it on the 3.5 line, still the most
# deployed, in its own environment with the numpy/pandas/pyarrow pins that 3.5 supports. Like the
# main one it installs once (again when pyproject.toml or these pins change), quietly, with pip's
# log shown only on failure.
SPARK35 := .venv-spark35
SPARK35_PINS := 'pyspark>=3.5,<4' 'numpy>=1.26,<2' 'pandas>=2.2,<2.3' 'pyarrow>=15,<17' \
	'pytest>=8,<10' 'hypothesis>=6.100,<7' 'pyyaml>=6,<7'
SPARK35_STAMP := $(SPARK35)/.installed
$(SPARK35)/bin/python:
	@$(PYTHON) -m venv $(SPARK35)

$(SPARK35_STAMP): pyproject.toml Makefile | $(SPARK35)/bin/python
	@echo "installing sessionstore with Spark 3.5 into $(SPARK35) (once; pip's output is shown only if it fails)"
	@$(SPARK35)/bin/python -m pip install -q $(PIP_CACHE) --upgrade pip > $(SPARK35)/pip.log 2>&1 \
		|| { cat $(SPARK35)/pip.log; exit 1; }
	@$(SPARK35)/bin/python -m pip install -q $(PIP_CACHE) -e . $(SPARK35_PINS) >> $(SPARK35)/pip.log 2>&1 \
		|| { cat $(SPARK35)/pip.log; exit 1; }
	@touch $@

# The oracle (native session_window parity, micro-batch by micro-batch; the static columnar
# path and its pre-reduction by gap-wide buckets, written with SQL expressions for 3.x; per-row
# gaps and max duration; partitions kept open between micro-batches) and
# exactly-once (driver-kill replay) Spark tests on Spark 3.5; part of `make test`. The processor engine needs Spark 4
# (transformWithStateInPandas), so its cases are left out here.
test-spark35: $(SPARK35_STAMP)
	$(SPARK35)/bin/python -m pytest -p no:cacheprovider -q tests/spark/test_parity.py \
		tests/spark/test_static_columnar.py tests/spark/test_static_buckets.py \
		tests/spark/test_dynamic_gap.py \
		tests/spark/test_replay.py tests/spark/test_kept.py -k 'not processor'

# The cluster test (local-cluster[2,1,1024], state on moto S3) runs once in `make test`; this
# repeats its executor and driver SIGKILL runs with more kill points.
CLUSTER_LOOPS ?= 5
cluster-test: install
	SESSIONSTORE_CLUSTER_LOOPS=$(CLUSTER_LOOPS) $(VENV)/bin/pytest tests/spark_cluster -q

spark-run: install
	$(PY) -m spark_adapter.example

clean:
	rm -rf $(VENV) .venv-bench $(SPARK35) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .benchmarks out
