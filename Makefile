PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench bench-quick lint clean browser node screenshots sdk

# The dashboard's browser tests drive the system's Chromium (Debian's package).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/loom serve

test: $(STAMP) browser node
	$(BIN)/python -m pytest -p no:cacheprovider

browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  $(SUDO) sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium'

# The Claude Code hook's tests (and integrations/README.md's tries) run it with Node.js.
node:
	@command -v node >/dev/null 2>&1 || \
	  $(SUDO) sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs'

# Refresh the committed screenshots of the dashboard (taken by its browser tests).
screenshots: $(STAMP) browser
	LOOM_TEST_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest -p no:cacheprovider tests/dashboard/test_browser.py tests/dashboard/test_memory_page.py

# Regenerate the SDK's methods from the request models (loom/sdk/codegen.py).
sdk: $(STAMP)
	$(BIN)/python -m loom.sdk.codegen

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
