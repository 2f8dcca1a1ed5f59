# Two entry points for a newcomer: `make demo` (the main job) and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest -p no:randomly

.PHONY: install demo test test-fast test-slow bench docs lint clean

$(STAMP): setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev,docs,pipelines]"
	touch $(STAMP)

install: $(STAMP)

## demo: the translation pipeline on bundled data: train, evaluate, export, translate.
demo: $(STAMP)
	$(BIN)/attention-pipelines translation demo --config dates --run-dir runs/dates

## test: lint, then the whole default suite on TensorFlow and on JAX.
# The tests compare numbers, not speed: XLA's code generation at optimisation
# level 0 compiles about 1.5x faster (the JAX half: 5:49 instead of 8:26).
TEST_XLA_FLAGS := --xla_backend_optimization_level=0
test: $(STAMP) lint
	XLA_FLAGS="$(TEST_XLA_FLAGS)" $(PYTEST) -n 2 -m "not slow"
	XLA_FLAGS="$(TEST_XLA_FLAGS)" KERAS_BACKEND=jax $(PYTEST) -n 2 -m "not slow"

## test-slow: real training runs to their stated accuracy, and the docs
## examples on JAX (make test runs them on TensorFlow).
test-slow: $(STAMP)
	$(PYTEST) -n 2 -m slow
	XLA_FLAGS="$(TEST_XLA_FLAGS)" KERAS_BACKEND=jax ATTENTION_LAYERS_DOCS_ON_JAX=1 \
		$(PYTEST) -n 2 tests/test_docs.py -k test_python_blocks_run

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## bench: paired-ratio benchmarks; the results are recorded in docs/.
bench: $(STAMP)
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/python -m benchmarks.bench_bahdanau
	$(BIN)/python -m benchmarks.bench_local
	$(BIN)/python -m benchmarks.bench_decoding
	$(BIN)/python -m benchmarks.hard_variance
	$(BIN)/python -m benchmarks.bench_multi_head
	$(BIN)/python -m benchmarks.bench_memory
	$(BIN)/python -m benchmarks.bench_transformer_decoding

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) site runs
