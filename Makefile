# One task runner for the project. `make demo` runs the main job; `make test` runs the whole suite.
PY      := .venv/bin/python
STAMP   := .venv/.installed
NPMSTAMP := node_modules/.installed
ARGS    ?=

.PHONY: demo test lint typecheck unit setup system-deps bench-gas clean

setup: $(STAMP) $(NPMSTAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv .venv || python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(NPMSTAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $(NPMSTAMP)

demo: setup
	$(PY) -m contracts.demo $(ARGS)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

typecheck: setup
	.venv/bin/mypy

system-deps:
	scripts/system-deps

unit: setup system-deps
	JAX_PLATFORMS=cpu .venv/bin/pytest $(ARGS)

test: lint typecheck unit

bench-gas: setup
	$(PY) scripts/bench-gas

clean:
	rm -rf .venv node_modules .cache
