PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench bench-quick lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/loom serve

test: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy loom workers clickhouse_schema

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench

bench-quick: $(STAMP)
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) .loom
