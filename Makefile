# One task runner for the project. `make demo` runs the main job; `make test` runs the whole suite.
PY      := .venv/bin/python
STAMP   := .venv/.installed
NPMSTAMP := node_modules/.installed
# The torch_xla export environment, apart from .venv (see requirements-xla.txt)
XLA_PY  := .venv-xla/bin/python
XLA_STAMP := .venv-xla/.installed
# The matching engine's hot modules, compiled to C extensions (see market/native.py)
ENGINE_SRC := market/engine/orders.py market/engine/book.py market/engine/engine.py market/native.py scripts/build_engine.py contracts/_recover.c
ENGINE_STAMP := .cache/engine-native.built
ARGS    ?=

.PHONY: demo test check lint typecheck unit fast setup setup-xla system-deps bench-gas clean

# What the demo runs: the venv, the npm packages (anvil, solc-js), the compiled engine. The
# torch_xla environment is not part of it: `make setup-xla` (or `make test`) builds it, and
# `job export --from torch-xla` builds it on first use (client/models/xla_env.py).
setup: $(STAMP) $(NPMSTAMP) $(ENGINE_STAMP)

setup-xla: $(XLA_STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv .venv || python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	# Model conversion and the real trained model: torch first (the CPU wheel), silero-vad only
	# for its ONNX weights (its own dependencies would pull torchaudio).
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet torchax==0.0.13 onnx==1.23.2 onnxruntime==1.32.0
	$(PY) -m pip install --quiet --no-deps silero-vad==6.2.3
	touch $(STAMP)

# torch-xla 2.9.0 needs exactly torch 2.9.0 (a CUDA build on PyPI: ~4.1 GB of downloads, 7.1 GB
# on disk) and its libtpu pin conflicts with jax[tpu], so the torch_xla export worker
# (client/models/xla_worker.py) runs in this venv of its own. Rebuilt when the pins change.
$(XLA_STAMP): requirements-xla.txt
	test -x $(XLA_PY) || python3.11 -m venv .venv-xla || python3 -m venv .venv-xla
	$(XLA_PY) -m pip install --quiet --upgrade pip
	$(XLA_PY) -m pip install --quiet -r requirements-xla.txt
	touch $(XLA_STAMP)

$(ENGINE_STAMP): $(STAMP) $(ENGINE_SRC)
	$(PY) scripts/build_engine.py || echo "warning: the engine was not compiled (no C compiler?); it runs as plain Python"
	mkdir -p $(dir $@) && touch $@

$(NPMSTAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $(NPMSTAMP)

demo: setup
	$(PY) -m client.demo $(ARGS)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports

typecheck: setup
	.venv/bin/mypy

system-deps:
	scripts/system-deps

# Test files run in parallel (pytest-xdist, one file per worker at a time: module fixtures stay
# whole). The suite is bound by CPU: its real processes (sandbox workers importing JAX, daemons,
# servers, command lines, anvil) kept 1.86 of a 2-core host's cores busy on average over an
# idle run with 3 workers (figures, and the command that measures CPU by kind of process:
# docs/benchmarks.md, "Where the suite's CPU goes"); 0: one process.
PYTEST_WORKERS ?= 3

# The tests run with bytecode cached (pytest's rewritten test modules too): an environment that
# sets PYTHONDONTWRITEBYTECODE would have every run recompile ~500 modules (~7 s of CPU).
PYTEST := PYTHONDONTWRITEBYTECODE= JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 .venv/bin/pytest

# `--durations 25`: every run ends with where its time went (the slowest set-ups and tests).
# Files are handed out costliest first (tests/file_order.py, from tests/file_seconds.json), not
# by their number of tests: a long one-scenario file started last would keep the run waiting.
unit: setup setup-xla system-deps
	$(PYTEST) -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations 25 $(ARGS)

# The set-up and the quick checks run side by side (the torch_xla venv, ~2 min of unpacking,
# beside the main venv, lint and types), then the suite.
test:
	$(MAKE) -j3 --output-sync=target lint typecheck setup-xla system-deps
	$(MAKE) unit

# The fast part: lint, types, import contracts and the tests that start no real component.
# tests/conftest.py marks slow every test that starts one (anvil, solc, a sandbox worker, a
# daemon, a server, a subprocess, PostgreSQL, Chromium, the PyTorch compiler) by reading what
# its fixtures and its code start; in this run starting any process or server is an error
# naming the test.
fast: setup
	$(PYTEST) -q -m "not slow" $(ARGS)

check: lint typecheck fast

bench-gas: setup
	scripts/bench-gas

clean:
	rm -rf .venv .venv-xla node_modules .cache market/engine/*.so contracts/*.so
