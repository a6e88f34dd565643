# The two commands: `make demo` and `make test`. Both build the environments first if needed.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
TVENV := .venv-trainer
AIRFLOW_HOME ?= $(CURDIR)/.airflow
DATA ?= $(CURDIR)/data/sample
ROWS_PER_DAY ?= 6000
DAYS ?= 3

export AIRFLOW_HOME
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export HETERO_TRAINER_PYTHON := $(CURDIR)/$(TVENV)/bin/python
export PYTHON

.PHONY: setup demo test test-trainer test-airflow lint docs data bench clean

## setup: build .venv and .venv-trainer if missing or out of date (stamp keyed on the lock files)
setup:
	@scripts/setup-env.sh all

## data: generate the sample dataset (day-partitioned Parquet under data/sample)
data: setup
	@if [ ! -d "$(DATA)" ]; then \
	  $(TVENV)/bin/python -m pipelines generate-data --out "$(DATA)" --rows-per-day $(ROWS_PER_DAY) --days $(DAYS); \
	else echo "sample data already in $(DATA)"; fi

## demo: set-up, sample data, then the main DAG end to end on the local launcher
## the demo trains on DATA when it is given on the command line, else on HETERO_DATASET_URI if set, else on DATA's default
demo: setup data
	@HETERO_DATASET_URI="$(if $(filter command line,$(origin DATA)),$(DATA),$${HETERO_DATASET_URI:-$(DATA)})" scripts/demo.sh

## test: set-up, then the whole test suite (unit, DAG, integration) in both environments, then the
## time each part took (scripts/test-suite.sh)
test:
	@scripts/test-suite.sh

## TRAINER_TESTS / AIRFLOW_TESTS narrow a run, e.g. make test-airflow AIRFLOW_TESTS=tests/k8s/test_manifests.py
TRAINER_TESTS ?= tests/unit tests/integration/trainer tests/bench
AIRFLOW_TESTS ?= tests/dags tests/k8s tests/cluster tests/integration/airflow

PYTEST_OPTS ?= -q -p no:cacheprovider --durations=15

test-trainer:
	$(TVENV)/bin/python -m pytest $(PYTEST_OPTS) $(TRAINER_TESTS)

test-airflow:
	$(VENV)/bin/python -m pytest $(PYTEST_OPTS) $(AIRFLOW_TESTS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python scripts/check_layering.py

## docs: write the reference pages docs/reference/*.md from the spec's models and the commands' parsers
docs: setup
	$(TVENV)/bin/python scripts/gen_reference.py

bench: setup
	$(TVENV)/bin/python bench/hetero.py

clean:
	rm -rf .airflow artifacts data
