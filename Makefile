# Two entry points for a newcomer: `make demo` (the main job) and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest -p no:randomly --durations=30

.PHONY: install demo test test-fast test-slow bench docs lint clean

$(STAMP): setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev,docs,pipelines,torch]"
	touch $(STAMP)

install: $(STAMP)

## demo: the translation pipeline on bundled data: train, evaluate, export, translate.
demo: $(STAMP)
	$(BIN)/attention-pipelines translation demo --config dates --run-dir runs/dates

## test: lint, then the whole default suite on TensorFlow and on JAX, and the
## layer contract on PyTorch.
# The tests compare numbers, not speed, so XLA is told to compile fast: code
# generation at optimisation level 0 and without the fusion emitters. JAX
# compiles every eager loop; its compiled programs go to a cache that both
# test workers share (emptied at each `make test`, kept for `make test-slow`).
# On 2 cores the JAX half took 7:39 with level 0 alone, 4:28 with all three.
TEST_XLA_FLAGS := --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false
TEST_JAX_CACHE := $(CURDIR)/.jax-test-cache
TEST_JAX := KERAS_BACKEND=jax JAX_COMPILATION_CACHE_DIR="$(TEST_JAX_CACHE)" \
	JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
# On PyTorch: the layer contract, Keras' own MultiHeadAttention tests and
# parity (their slow parts, the contract's torch.compile clause among them,
# in test-slow), and the kernels' mask matrix.
TEST_TORCH := KERAS_BACKEND=torch
TORCH_TESTS := tests/test_contract.py tests/test_keras_parity.py tests/test_keras_suite.py \
	tests/test_kernels.py tests/test_decoding_numpy.py tests/test_docs.py
test: $(STAMP) lint
	rm -rf "$(TEST_JAX_CACHE)"
	XLA_FLAGS="$(TEST_XLA_FLAGS)" $(PYTEST) -n 2 -m "not slow"
	XLA_FLAGS="$(TEST_XLA_FLAGS)" $(TEST_JAX) $(PYTEST) -n 2 -m "not slow"
	$(TEST_TORCH) $(PYTEST) -n 2 -m "not slow" $(TORCH_TESTS)

## test-slow: real training runs to their stated accuracy, the docs pages'
## examples and the layer contract's XLA and MirroredStrategy clauses (XLA
## told to compile fast here too: nothing below times compiled code), and on
## JAX the docstring examples and integration tests that make test runs on
## TensorFlow only (conftest.py's SLOW_LAYER_CLAUSES and JAX_SLOW_MODULES).
test-slow: $(STAMP)
	XLA_FLAGS="$(TEST_XLA_FLAGS)" $(PYTEST) -n 2 -m slow
	XLA_FLAGS="$(TEST_XLA_FLAGS)" $(TEST_JAX) $(PYTEST) -n 2 -m jax_slow
	$(TEST_TORCH) $(PYTEST) -n 2 -m jax_slow $(TORCH_TESTS)

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
	$(BIN)/python -m benchmarks.bench_pipeline --xla
	$(BIN)/python -m benchmarks.bench_pipeline --tasks

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) site runs .jax-test-cache
