"""What a past release saved still loads and gives the same numbers.

``tests/fixtures/release-<version>/`` holds, per fixture, a small model around
one public layer as that release's code saved it
(tests/fixtures/make_release_fixtures.py): ``model.keras``, the inputs and the
outputs, and for one fixture of each public layer a SavedModel. Every public
import path, registered name, constructor argument and config key must keep
loading these files, and the layers must keep computing the same outputs from
them. A failure here is a break of compatibility: fix the library, never the
fixtures (their checksums are in ``MANIFEST.json``).
"""

import json
from pathlib import Path

import keras
import numpy as np
import pytest

import attention_layers  # noqa: F401  (registers the layers: no custom_objects)
from tests.fixtures.make_release_fixtures import model_losses, run_driver, sha256

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MANIFESTS = sorted(FIXTURES.glob("release-*/MANIFEST.json"))


def _manifest(path):
    with open(path) as f:
        return json.load(f)


JAX = keras.backend.backend() == "jax"
# JAX compiles every eager op and each decoding loop: the decoding fixtures
# (17 s there) run in `make test-slow`, as the other decoding loops' tests do
# (conftest.py's JAX_SLOW_MODULES).
JAX_SLOW = [pytest.mark.slow, pytest.mark.jax_slow] if JAX else []


def _params(saved_models_only=False):
    for path in MANIFESTS:
        manifest = _manifest(path)
        for name, entry in sorted(manifest["fixtures"].items()):
            if saved_models_only and not entry["saved_model"]:
                continue
            yield pytest.param(
                path.parent / name,
                entry,
                id=f"{manifest['release']}/{name}",
                marks=JAX_SLOW if entry["driver"] != "call" else [],
            )


every = pytest.mark.parametrize("folder, entry", list(_params()))
# One SavedModel per public layer (see make_release_fixtures.py).
exported = pytest.mark.parametrize("folder, entry", list(_params(True)))


def _on_accelerator():
    """Whether the backend computes on a GPU or TPU (other kernels, TF32)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_logical_devices("GPU"))
    if backend == "jax":
        import jax

        return jax.default_backend() != "cpu"
    if backend == "torch":
        import torch

        return torch.cuda.is_available()
    return False


def _tolerance():
    """rtol and atol: the fixtures were computed eagerly on TensorFlow's CPU
    kernels, which give them bit for bit today; JAX's and PyTorch's CPU
    kernels differ in the last bits (at most 1.1e-6 today), an accelerator's
    kernels (and TF32 matmuls) more."""
    if _on_accelerator():
        return 1e-3
    return 1e-6 if keras.backend.backend() == "tensorflow" else 1e-5


TOLERANCE = _tolerance()


def _load(path):
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _assert_same(got, want, keys=None):
    keys = sorted(want) if keys is None else keys
    assert sorted(got) == keys, (sorted(got), keys)
    for key in keys:
        a, b = np.asarray(got[key]), want[key]
        assert a.shape == b.shape, (key, a.shape, b.shape)
        if np.issubdtype(b.dtype, np.floating):
            np.testing.assert_allclose(
                a, b, rtol=TOLERANCE, atol=TOLERANCE, err_msg=key
            )
        else:
            np.testing.assert_array_equal(a, b, err_msg=key)


def test_fixtures_exist():
    assert MANIFESTS, f"no release fixtures under {FIXTURES}"


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.parent.name for p in MANIFESTS])
def test_manifest_lists_every_fixture(path):
    folders = {p.name for p in path.parent.iterdir() if p.is_dir()}
    assert folders == set(_manifest(path)["fixtures"])


@every
def test_files_are_unchanged(folder, entry):
    """The fixtures are as their release wrote them: no file edited, added or
    removed."""
    files = sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
    )
    assert files == sorted(entry["files"])
    for name, digest in entry["files"].items():
        assert sha256(folder / name) == digest, f"{name} was edited"


@every
def test_keras_file_gives_the_release_outputs(folder, entry):
    """``load_model`` with no custom_objects, then the same outputs (and, for
    the endpoint loss layers, the same losses)."""
    model = keras.saving.load_model(folder / "model.keras")
    feed = _load(folder / "inputs.npz")
    losses = folder / "losses.npz"
    if JAX and entry["driver"] == "call" and not losses.exists():
        # One compiled step instead of every op compiled eagerly: faster.
        batch = len(next(iter(feed.values())))
        got = model.predict(feed, batch_size=batch, verbose=0)
    else:
        got = run_driver(entry["driver"], model, feed)
    _assert_same(got, _load(folder / "outputs.npz"))
    if losses.exists():
        _assert_same(model_losses(model), _load(losses))


@pytest.mark.tf_only
@exported
def test_saved_model_gives_the_release_outputs(folder, entry):
    """The SavedModel's ``serving_default`` gives the model's outputs (for the
    decoding fixtures, the teacher-forced ones it exports)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(folder / "saved_model"))
    feed = _load(folder / "inputs.npz")
    got = loaded.signatures["serving_default"](
        **{k: tf.constant(v) for k, v in feed.items()}
    )
    got = {k: v.numpy() for k, v in got.items()}
    want = _load(folder / "outputs.npz")
    if entry["driver"] != "call":
        want = {k: v for k, v in want.items() if k in got}
    assert want, "the SavedModel returns none of the outputs"
    _assert_same(got, want)
