"""Keras' own MultiHeadAttention test file passes against our class
(`tests.keras_suite`): on the backend under test, in `make test-slow`."""

import os
import pathlib

import keras
import pytest

from tests import keras_suite

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Keras' file skips these itself where the backend has no flash attention.
KERAS_SKIPS = {
    "tensorflow": {
        "test_basics_with_flash_attention",
        "test_flash_attention_with_errors",
    }
}


@pytest.mark.slow  # one pytest run of Keras' 50 tests: 20 s on TF, 100 s on JAX
def test_keras_multi_head_attention_suite_passes(tmp_path_factory):
    cache = os.environ.get("KERAS_SUITE_CACHE") or tmp_path_factory.mktemp("sdist")
    test_file = keras_suite.prepare(tmp_path_factory.mktemp("keras_suite"), cache)
    backend = keras.backend.backend()
    outcomes = keras_suite.run(test_file, backend, ROOT)
    assert len(outcomes) >= 48, outcomes  # Keras 3.15.1 holds 50
    failed = {n: o for n, o in outcomes.items() if o.startswith("failed")}
    assert set(failed) == set(keras_suite.EXPECTED_FAILURES), failed
    skipped = {n for n, o in outcomes.items() if o == "skipped"}
    assert skipped == KERAS_SKIPS.get(backend, set()), skipped
