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

# The bench extra (the Postgres + pgvector baseline) is part of the test install: the
# harness's end-to-end test (tests/bench/test_harness.py) runs both targets.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/loom serve

test: $(STAMP) browser node
	$(BIN)/python -m pytest -p no:cacheprovider

browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  $(SUDO) sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium'

# The capture hooks' tests and the TypeScript client's (tests/sdk/test_typescript_sdk.py) run
# under the system's Node.js and npm (Debian's packages; the client's dev dependencies then
# come from the npm registry).
node:
	@{ command -v node || command -v nodejs; } >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || \
	  $(SUDO) sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm'

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
	$(BIN)/python -m bench

bench-quick: $(STAMP)
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) .loom

# Regenerate the TypeScript client's types from this checkout's OpenAPI document (after
# changing an op's request or response; a test checks they are current).
ts-types: $(STAMP) node
	$(BIN)/python -c 'import json; from loom.api.app import create_app; print(json.dumps(create_app().openapi()))' > clients/typescript/openapi.json
	cd clients/typescript && npm ci --no-audit --no-fund >/dev/null && \
	  npx openapi-typescript openapi.json --default-non-nullable false -o src/generated/api.ts; \
	  status=$$?; rm -f openapi.json; exit $$status
