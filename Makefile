# HIR pipeline. `make help` lists the targets; `make test` is what CI runs.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# Airflow and its ~130 packages, in a virtualenv of their own: only tests/conf parses the DAG with it.
VENV_AIRFLOW := .venv-airflow
JARS := .jars
DELTA_VERSION := 4.4.0
DELTA_SPARK_ARTIFACT := io.delta:delta-spark_4.0_2.13:$(DELTA_VERSION)
DELTA_STORAGE_ARTIFACT := io.delta:delta-storage:$(DELTA_VERSION)
# s3a:// warehouses: Hadoop's S3A connector at the Hadoop version pyspark bundles (hadoop-client-api-3.4.1.jar) and
# the AWS SDK bundle that hadoop-aws 3.4.1 is built against (558 MB, fetched once). s3proxy (an S3 server on a
# folder) is for the tests only.
HADOOP_AWS_ARTIFACT := org.apache.hadoop:hadoop-aws:3.4.1
AWS_SDK_ARTIFACT := software.amazon.awssdk:bundle:2.24.6
S3PROXY_ARTIFACT := org.gaul:s3proxy:4.1.0:jar:jar-with-dependencies
# hdfs:// tests: an HDFS mini cluster at the Hadoop version pyspark bundles (tests only, 40 MB).
HDFS_MINICLUSTER_ARTIFACT := org.apache.hadoop:hadoop-client-minicluster:3.4.1
WAREHOUSE ?= warehouse
SHARED_DATA ?= ../shared/data
PYTEST_ARGS ?=
# Three pytest workers, each taking whole test files (module fixtures build once): the cores stay busy while one
# worker waits on a JVM start or a spark-submit, and the long files spread over more queues (suite 24m20s on 2
# cores, 2026-12-02). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 3
PYTEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: requirements.txt requirements-nodeps.txt setup.py
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 is required)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

$(VENV_AIRFLOW)/.installed: conf/airflow/requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 is required)"; exit 1; }
	$(PYTHON) -m venv $(VENV_AIRFLOW)
	$(VENV_AIRFLOW)/bin/python -m pip install --quiet --upgrade pip setuptools wheel
	$(VENV_AIRFLOW)/bin/python -m pip install --quiet -r conf/airflow/requirements.txt
	touch $@

$(JARS)/.fetched: Makefile
	@command -v mvn >/dev/null || { echo "error: mvn not found (Maven fetches the Delta jars)"; exit 1; }
	mkdir -p $(JARS)
	mvn -q -B dependency:copy -Dartifact=$(DELTA_SPARK_ARTIFACT) -DoutputDirectory=$(JARS)
	mvn -q -B dependency:copy -Dartifact=$(DELTA_STORAGE_ARTIFACT) -DoutputDirectory=$(JARS)
	mvn -q -B dependency:copy -Dartifact=$(HADOOP_AWS_ARTIFACT) -DoutputDirectory=$(JARS)
	mvn -q -B dependency:copy -Dartifact=$(AWS_SDK_ARTIFACT) -DoutputDirectory=$(JARS)
	mvn -q -B dependency:copy -Dartifact=$(S3PROXY_ARTIFACT) -DoutputDirectory=$(JARS)
	mvn -q -B dependency:copy -Dartifact=$(HDFS_MINICLUSTER_ARTIFACT) -DoutputDirectory=$(JARS)
	touch $@

setup: $(VENV)/.installed $(JARS)/.fetched $(VENV_AIRFLOW)/.installed ## Create .venv and .venv-airflow with pinned packages and fetch the Delta jars (idempotent)

lint: setup ## Ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint ## Lint, then every test (slow end-to-end ones included)
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

test-fast: setup ## Tests without the slow end-to-end ones
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) -m "not slow" $(PYTEST_ARGS)

format: setup ## Apply ruff fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

demo: setup ## hir pipeline + evaluation on the synthetic source, then the real datasets in ../shared/data
	HIR_SHARED_DATA=$(SHARED_DATA) WAREHOUSE=$(WAREHOUSE) $(VENV)/bin/python -m jobs.demo

evaluate-full: setup ## make demo's evaluation plus the three HIR ablations and ALS's whole grid (reuses the demo's warehouses)
	HIR_SHARED_DATA=$(SHARED_DATA) WAREHOUSE=$(WAREHOUSE) $(VENV)/bin/python -m jobs.demo --full

results: setup ## Rewrite the README's results section from the demo warehouses' eval_metrics (after make demo)
	$(PY) -m jobs.eval.readme_results $(WAREHOUSE)/synthetic $(WAREHOUSE)/taobao $(WAREHOUSE)/rees46 --readme README.md

clean: ## Remove generated tables, caches and build output (keeps .venv and .jars)
	rm -rf $(WAREHOUSE) build dist *.egg-info .pytest_cache .ruff_cache spark-warehouse

distclean: clean ## Also remove .venv and .jars
	rm -rf $(VENV) $(JARS)
	rm -rf $(VENV_AIRFLOW)

# Cluster packaging (README "Running on a cluster"). DIST_VENV=1 also packs an executor virtualenv for
# `--archives` (plain `python -m venv` + tar: executors need the same python3.11 path as this machine, since a
# venv links to its base interpreter; torch's CUDA wheels make it about 3 GB).
DIST ?= dist
DIST_VENV ?= 0
DIST_VENV_BUILD := build/executor-venv

dist: setup ## Package for spark-submit: dist/hir_pipeline-<ver>.zip (--py-files) + wheel; DIST_VENV=1 adds a venv
	@version=$$($(PY) setup.py --version 2>/dev/null) && mkdir -p $(DIST) && \
	rm -f $(DIST)/hir_pipeline-$$version.zip $(DIST)/hir_pipeline-$$version-*.whl && \
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir $(DIST) . && \
	$(PY) -c 'import pathlib, sys, zipfile; z = zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED); \
	[z.write(f) for d in sys.argv[2:] for f in sorted(pathlib.Path(d).rglob("*.py"))]; z.close()' \
	$(DIST)/hir_pipeline-$$version.zip jobs hir_model udfs schemas && \
	if [ "$(DIST_VENV)" = 1 ]; then \
	rm -rf $(DIST_VENV_BUILD) && $(PYTHON) -m venv $(DIST_VENV_BUILD) && \
	$(DIST_VENV_BUILD)/bin/python -m pip install --quiet -r requirements.txt && \
	$(DIST_VENV_BUILD)/bin/python -m pip install --quiet --no-deps -r requirements-nodeps.txt \
	$(DIST)/hir_pipeline-$$version-py3-none-any.whl && \
	tar -C $(DIST_VENV_BUILD) -czf $(DIST)/hir_venv-$$version.tar.gz . ; fi && \
	ls -1 $(DIST)/hir_*$$version*

.PHONY: help setup lint test test-fast format demo evaluate-full results clean distclean dist
