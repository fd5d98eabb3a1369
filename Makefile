# Everything runs from a virtualenv this Makefile creates: `make test` on a fresh machine
# needs nothing else installed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv test test-fast lint format run bench bench-broker namesrv brokers clean

help:
	@echo "make test         create the virtualenv and run the whole test suite"
	@echo "make run          start the proxy with embedded broker stubs (proxy issue)"
	@echo "make lint         ruff"
	@echo "make bench-broker broker stub throughput and wake-up latency"
	@echo "make clean        remove the virtualenv and caches"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: bench-broker

bench-broker: $(STAMP)
	$(BIN)/python tests/bench/bench_broker.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
