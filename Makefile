# One task runner for the project. `make demo` runs the main job; `make test` runs the whole suite.
PY      := .venv/bin/python
STAMP   := .venv/.installed
NPMSTAMP := node_modules/.installed
# The matching engine's hot modules, compiled to C extensions (see market/native.py)
ENGINE_SRC := market/engine/book.py market/engine/engine.py market/native.py scripts/build_engine.py
ENGINE_STAMP := .cache/engine-native.built
ARGS    ?=

.PHONY: demo test lint typecheck unit setup system-deps bench-gas clean

setup: $(STAMP) $(NPMSTAMP) $(ENGINE_STAMP)

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

unit: setup system-deps
	JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 .venv/bin/pytest $(ARGS)

test: lint typecheck unit

bench-gas: setup
	scripts/bench-gas

clean:
	rm -rf .venv node_modules .cache market/engine/*.so
