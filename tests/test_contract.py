"""The shared layer contract (tests/contract.py) run on every public layer."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from tests import contract
from tests.cases import CASES, DROPOUT_CASES, SCORE_CASES, ids

every = pytest.mark.parametrize("case", CASES, ids=ids(CASES))
score = pytest.mark.parametrize("case", SCORE_CASES, ids=ids(SCORE_CASES))


@every
def test_config_round_trip(case):
    contract.check_config(case)


@every
def test_keras_file_round_trip(case, tmp_path):
    contract.check_keras_file(case, str(tmp_path))


@pytest.fixture(scope="module")
def served_without_library(request, tmp_path_factory):
    """The selected cases exported, then loaded in one fresh process where this
    library cannot be imported (one TensorFlow start instead of one per case;
    the root conftest.py keeps these tests on one xdist worker)."""
    wanted = {
        item.callspec.params["case"].id
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_saved_model_without_library"
    }
    root = tmp_path_factory.mktemp("saved_models")
    prepared, exports = {}, {}
    for case in CASES:
        if case.id not in wanted:
            continue
        keras.config.set_dtype_policy("float32")
        keras.utils.set_random_seed(0)
        try:
            feed, expected, export_dir = contract.export_case(case, str(root / case.id))
        except Exception as error:  # reported by the case's own test
            prepared[case.id] = error
            continue
        prepared[case.id] = expected
        exports[case.id] = (export_dir, feed)
    return prepared, contract.run_many_without_library(exports, str(root))


@pytest.mark.tf_only
@every
def test_saved_model_without_library(case, served_without_library):
    prepared, results = served_without_library
    if isinstance(prepared[case.id], Exception):
        raise prepared[case.id]
    got = results[case.id]
    assert not isinstance(got, str), got[-3000:]
    contract.check_served(prepared[case.id], got)


@every
def test_initial_weights_are_distinct(case):
    contract.check_distinct_initial_weights(case)


@every
def test_implicit_mask_equals_explicit(case):
    contract.check_implicit_mask(case)


@every
def test_fully_masked_row_is_zero(case):
    contract.check_fully_masked_row(case)


@every
def test_nan_in_masked_positions_does_not_leak(case):
    contract.check_nan_in_masked_positions(case)


@score
def test_causal_mask_hides_the_future(case):
    contract.check_causal(case)


@every
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(case, policy):
    contract.check_mixed_precision(case, policy)


@pytest.mark.parametrize("case", DROPOUT_CASES, ids=ids(DROPOUT_CASES))
def test_dropout_acts_in_training_only(case):
    contract.check_dropout(case)


@every
def test_jit_compiled_training(case):
    contract.check_jit_training(case)


@pytest.mark.tf_only
@every
def test_mirrored_strategy_equals_one_device(case):
    contract.check_mirrored_strategy(case)


@pytest.fixture(scope="module")
def distributed_runs(request, tmp_path_factory):
    """Every selected case's distribution clause, run in one JAX process."""
    wanted = [
        item.callspec.params["case"].id
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_distribution_api"
    ]
    return contract.run_distributed(wanted, str(tmp_path_factory.mktemp("dist")))


@pytest.mark.slow  # one JAX process over every case: about 2.5 minutes
@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="starts its own JAX process: run once, from the TensorFlow half",
)
@every
def test_distribution_api(case, distributed_runs):
    contract.check_distributed(case, distributed_runs[case.id])


@every
def test_bad_input_raises_clear_errors(case):
    contract.check_bad_input(case)


_JAX_PREDICT = textwrap.dedent(
    """
    import os, sys
    os.environ["KERAS_BACKEND"] = "jax"
    import keras, numpy as np
    import attention_layers  # registers the layers; no custom_objects needed
    assert keras.backend.backend() == "jax"
    folder = sys.argv[1]
    for name in sorted(os.listdir(folder)):
        if name.endswith(".keras"):
            model = keras.saving.load_model(os.path.join(folder, name))
            feed = dict(np.load(os.path.join(folder, name[:-6] + ".in.npz")))
            out = model.predict(feed, verbose=0)
            np.savez(os.path.join(folder, name[:-6] + ".jax.npz"), **out)
    """
)


@pytest.mark.tf_only
@pytest.mark.slow  # a second backend in a subprocess
def test_jax_backend_gives_the_same_numbers(tmp_path):
    """Every case, saved on TensorFlow, predicts the same numbers on JAX."""
    expected = {}
    for case in CASES:
        model = case.functional_model(case.make())
        feed = case.feed()
        expected[case.id] = model.predict(feed, verbose=0)
        model.save(tmp_path / f"{case.id}.keras")
        np.savez(tmp_path / f"{case.id}.in.npz", **feed)
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-c", _JAX_PREDICT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case in CASES:
        got = dict(np.load(tmp_path / f"{case.id}.jax.npz"))
        for name in ("output", "weights"):
            np.testing.assert_allclose(
                expected[case.id][name],
                got[name],
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"{case.id}/{name}",
            )


def test_backend_is_reported():
    assert keras.backend.backend() in ("tensorflow", "jax", "torch")
