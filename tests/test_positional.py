"""Position layers: the paper formulas by hand, cached steps, and the contract
clauses that fit layers of one sequence (config, saving, dtypes, XLA)."""

import json
import os

import keras
import numpy as np
import pytest

import attention_layers as al
from tests import contract

B, T, D = 2, 6, 8
LAYERS = {
    "sinusoidal": lambda **kw: al.SinusoidalPositionEncoding(**kw),
    "learned": lambda **kw: al.PositionEmbedding(sequence_length=16, **kw),
    "rotary": lambda **kw: al.RotaryEmbedding(**kw),
    "rotary_half": lambda **kw: al.RotaryEmbedding(
        interleaved=False, scaling_factor=2.0, max_wavelength=500, **kw
    ),
}


def np_(x):
    return keras.ops.convert_to_numpy(x)


def inputs(shape=(B, T, D), seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def jit(fn):
    """``fn`` compiled with XLA on the current backend."""
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    return fn


# -- the paper formulas, by hand -------------------------------------------------
def sinusoid(positions, dim, wavelength=10000.0):
    pe = np.zeros(positions.shape + (dim,))
    for j in range(dim):
        angle = positions / wavelength ** (2 * (j // 2) / dim)
        pe[..., j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    return pe


def rope(x, positions, wavelength=10000.0, interleaved=True, scaling=1.0):
    """Rotate pairs of the last axis of ``x`` [B, T, ..., d] by hand."""
    x = np.asarray(x, "float64")
    d = x.shape[-1]
    out = np.empty_like(x)
    pos = np.broadcast_to(positions, x.shape[:2]) / scaling
    for i in range(d // 2):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
        angle = pos * wavelength ** (-2 * i / d)
        angle = angle.reshape(angle.shape + (1,) * (x.ndim - 3))
        out[..., a] = x[..., a] * np.cos(angle) - x[..., b] * np.sin(angle)
        out[..., b] = x[..., b] * np.cos(angle) + x[..., a] * np.sin(angle)
    return out


@pytest.mark.parametrize("dim", [6, 5])
def test_sinusoidal_matches_the_paper(dim):
    x = inputs((B, T, dim))
    got = np_(al.SinusoidalPositionEncoding()(x))
    np.testing.assert_allclose(got, sinusoid(np.arange(T)[None], dim)[[0, 0]], 1e-5)
    # Explicit positions [B, T], a start index and a shorter wavelength.
    positions = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])
    layer = al.SinusoidalPositionEncoding(max_wavelength=100)
    got = np_(layer(x, positions=positions))
    np.testing.assert_allclose(got, sinusoid(positions, dim, 100.0), atol=1e-5)
    got = np_(layer(x, start_index=7))
    np.testing.assert_allclose(
        got[1], sinusoid(np.arange(7, 7 + T), dim, 100.0), atol=1e-5
    )


def test_learned_embedding_indexes_its_table():
    layer = al.PositionEmbedding(sequence_length=10)
    x = inputs()
    out = np_(layer(x))
    table = np_(layer.embeddings)
    np.testing.assert_array_equal(out, np.broadcast_to(table[:T], (B, T, D)))
    np.testing.assert_array_equal(np_(layer(x, start_index=4))[0], table[4:10])
    positions = np.array([[0, 0, 9, 1, 2, 3], [5, 4, 3, 2, 1, 0]])
    np.testing.assert_array_equal(np_(layer(x, positions=positions)), table[positions])
    np.testing.assert_array_equal(
        np_(layer(x, positions=positions[1]))[0], table[5::-1]
    )


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("shape", [(B, T, D), (B, T, 3, D)])
def test_rotary_matches_the_paper(interleaved, shape):
    x = inputs(shape)
    layer = al.RotaryEmbedding(interleaved=interleaved, scaling_factor=2.0)
    np.testing.assert_allclose(
        np_(layer(x)),
        rope(x, np.arange(T)[None], interleaved=interleaved, scaling=2.0),
        atol=1e-5,
    )
    positions = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])
    np.testing.assert_allclose(
        np_(layer(x, positions=positions)),
        rope(x, positions, interleaved=interleaved, scaling=2.0),
        atol=1e-5,
    )


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_dot_products_depend_on_relative_position_only(interleaved):
    layer = al.RotaryEmbedding(interleaved=interleaved)
    q, k = inputs((1, 1, D), 1), inputs((1, 1, D), 2)

    def score(m, n):
        rq = np_(layer(q, positions=np.array([m])))
        rk = np_(layer(k, positions=np.array([n])))
        return float((rq * rk).sum())

    for m, n in [(5, 2), (2, 5), (7, 7)]:
        for shift in (1, 13, 100):
            assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)
    # Rotations keep the norm.
    np.testing.assert_allclose(
        np.linalg.norm(np_(layer(inputs(), start_index=3)), axis=-1),
        np.linalg.norm(inputs(), axis=-1),
        rtol=1e-5,
    )


# -- cached decoding: one position at a time equals the full call ---------------
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_one_step_at_a_time_equals_full_call(name):
    layer = LAYERS[name]()
    x = inputs((B, T, 2, D)) if name.startswith("rotary") else inputs()
    full = np_(layer(x))
    step = jit(lambda xt, i: layer(xt, start_index=i))
    for t in range(T):
        np.testing.assert_allclose(
            np_(layer(x[:, t : t + 1], start_index=t)), full[:, t : t + 1], atol=1e-6
        )
        index = keras.ops.convert_to_tensor(t, "int32")
        np.testing.assert_allclose(
            np_(step(x[:, t : t + 1], index)), full[:, t : t + 1], atol=1e-5
        )
    # Positions [T] and [B, T] agree with the start index.
    np.testing.assert_allclose(np_(layer(x, positions=np.arange(T))), full, atol=1e-6)
    np.testing.assert_allclose(
        np_(layer(x, positions=np.tile(np.arange(T), (B, 1)))), full, atol=1e-6
    )


# -- masks ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_keras_mask_passes_through(name):
    """The padding mask of an Embedding(mask_zero=True) reaches the attention."""
    tokens = keras.Input(shape=(None,), dtype="int32")
    x = keras.layers.Embedding(20, D, mask_zero=True)(tokens)
    layer = LAYERS[name]()
    y = layer(x) if name.startswith("rotary") else keras.layers.Add()([x, layer(x)])
    out, weights = al.ScaledDotProductAttention()(y, y, return_attention_scores=True)
    model = keras.Model(tokens, weights)
    ids = np.array([[3, 4, 5, 0], [6, 7, 0, 0]])
    weights = model.predict(ids, verbose=0)
    assert (weights[1, :, 2:] == 0).all() and (weights[0, :, 3] == 0).all()
    np.testing.assert_allclose(weights[1, :2].sum(-1), 1.0, rtol=1e-5)


# -- contract clauses that fit -------------------------------------------------------
def feed_for(name):
    shape = (contract.BATCH, T, 2, D) if name.startswith("rotary") else (3, T, D)
    return {"inputs": inputs(shape)}


def model_for(name, layer):
    x = keras.Input(shape=feed_for(name)["inputs"].shape[1:], name="inputs")
    return keras.Model({"inputs": x}, {"output": layer(x, start_index=2)})


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_config_round_trip(name):
    layer = LAYERS[name]()
    x = feed_for(name)["inputs"]
    out = np_(layer(x))
    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(np_(clone(x)), out)
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    restored = keras.saving.deserialize_keras_object(serialized)
    assert type(restored) is type(layer)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_keras_file_round_trip(name, tmp_path):
    model = model_for(name, LAYERS[name]())
    feed = feed_for(name)
    expected = model.predict(feed, verbose=0)["output"]
    path = os.path.join(tmp_path, f"{name}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects
    np.testing.assert_array_equal(loaded.predict(feed, verbose=0)["output"], expected)


# One fresh TensorFlow process, 8 to 20 s on two cores: make test-slow.
@pytest.mark.slow
@pytest.mark.tf_only
def test_saved_model_loads_without_the_library(tmp_path):
    """The learned and rotary layers exported, then served in one fresh process
    without the library."""
    models = {
        name: (model_for(name, LAYERS[name]()), feed_for(name))
        for name in ("learned", "rotary")
    }
    contract.assert_served_without_library(models, tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_mixed_precision(name, policy):
    compute = policy.split("_")[1]
    x = feed_for(name)["inputs"]
    start = 8 if name == "learned" else 300  # large angles for the fixed ones
    reference = LAYERS[name]()
    want = np_(reference(x, start_index=start))
    layer = LAYERS[name](dtype=policy)
    layer(x)
    layer.set_weights(reference.get_weights())
    assert all(w.dtype == "float32" for w in layer.weights)
    out = layer(x, start_index=start)
    assert keras.backend.standardize_dtype(out.dtype) == compute
    tol = 1e-2 if compute == "float16" else 5e-2
    np.testing.assert_allclose(np_(keras.ops.cast(out, "float32")), want, atol=tol * 4)


@pytest.mark.parametrize("name", ["learned", "rotary", "sinusoidal"])
def test_jit_training(name):
    x = keras.Input(shape=(T, D))
    layer = LAYERS[name]()
    y = keras.layers.Dense(D)(x)
    y = layer(y) if name == "rotary" else y + layer(y)
    model = keras.Model(x, keras.layers.Dense(1)(y))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    before = [np_(w) for w in model.trainable_weights]
    history = model.fit(inputs((4, T, D)), np.ones((4, T, 1)), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    after = [np_(w) for w in model.trainable_weights]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


# -- bad input ---------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_bad_input(name):
    cls = LAYERS[name]().__class__
    x = inputs()

    def call(*args, **kwargs):
        return lambda: LAYERS[name]()(*args, **kwargs)

    contract.assert_clear_error(cls, "inputs", call(x[0]))
    contract.assert_clear_error(cls, "inputs", call(x.astype("int32")))
    contract.assert_clear_error(cls, "positions", call(x, positions=np.arange(T + 1)))
    contract.assert_clear_error(
        cls, "positions", call(x, positions=np.zeros((B, T, 1), "int32"))
    )
    contract.assert_clear_error(cls, "start_index", call(x, start_index=-1))
    contract.assert_clear_error(
        cls, "start_index", call(x, start_index=np.array([1, 2]))
    )


def test_bad_constructor_arguments_and_ranges():
    err = contract.assert_clear_error
    err(
        al.SinusoidalPositionEncoding,
        "max_wavelength",
        lambda: al.SinusoidalPositionEncoding(max_wavelength=0),
    )
    err(
        al.RotaryEmbedding,
        "scaling_factor",
        lambda: al.RotaryEmbedding(scaling_factor=0),
    )
    err(al.RotaryEmbedding, "inputs", lambda: al.RotaryEmbedding()(inputs((B, T, 5))))
    err(
        al.PositionEmbedding,
        "sequence_length",
        lambda: al.PositionEmbedding(sequence_length=0),
    )
    layer = al.PositionEmbedding(sequence_length=T)
    layer(inputs())  # exactly fits
    err(al.PositionEmbedding, "start_index", lambda: layer(inputs(), start_index=1))
    err(
        al.PositionEmbedding,
        "positions",
        lambda: layer(inputs(), positions=np.arange(1, T + 1)),
    )
    err(
        al.PositionEmbedding,
        "start_index",
        lambda: al.PositionEmbedding(sequence_length=4)(inputs()),
    )


# -- the 2-D grid encoding -------------------------------------------------------------
def test_grid_encoding_is_row_then_column_by_hand():
    """PE(r, c) = [PE_{d/2}(r); PE_{d/2}(c)] (Parmar et al. 2018)."""
    grid = inputs((B, 3, 5, 12))
    layer = al.SinusoidalPositionEncoding2D(max_wavelength=50)
    got = np_(layer(grid))
    expected = np.zeros((3, 5, 12))
    for r in range(3):
        for c in range(5):
            expected[r, c, :6] = sinusoid(np.array(r), 6, 50.0)
            expected[r, c, 6:] = sinusoid(np.array(c), 6, 50.0)
    np.testing.assert_allclose(got, np.broadcast_to(expected, got.shape), atol=1e-6)
    # Every cell of a grid gets its own code.
    flat = got[0].reshape(15, 12)
    assert len({tuple(np.round(row, 5)) for row in flat}) == 15


def test_grid_encoding_in_a_model_saves_and_compiles(tmp_path):
    x = keras.Input((None, None, 4))
    y = keras.layers.Conv2D(8, 3, padding="same")(x)
    y = y + al.SinusoidalPositionEncoding2D()(y)
    y = keras.layers.GlobalAveragePooling2D()(keras.layers.Dense(8, "tanh")(y))
    model = keras.Model(x, keras.layers.Dense(1)(y))
    model.compile("adam", "mse", jit_compile=True)
    feed = inputs((4, 5, 6, 4))
    history = model.fit(feed, np.ones((4, 1)), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    path = os.path.join(tmp_path, "grid.keras")
    model.save(path)
    np.testing.assert_allclose(
        keras.saving.load_model(path).predict(feed, verbose=0),
        model.predict(feed, verbose=0),
        rtol=1e-6,
    )
    policy = al.SinusoidalPositionEncoding2D(dtype="mixed_bfloat16")
    assert keras.backend.standardize_dtype(policy(feed).dtype) == "bfloat16"


def test_grid_encoding_refuses_bad_input():
    err = contract.assert_clear_error
    cls = al.SinusoidalPositionEncoding2D
    err(cls, "inputs", lambda: cls()(inputs((B, T, D))))  # rank 3
    err(cls, "inputs", lambda: cls()(inputs((B, 2, 3, 5))))  # odd dim
    err(cls, "inputs", lambda: cls()(inputs((B, 2, 3, 4)).astype("int32")))
    err(cls, "max_wavelength", lambda: cls(max_wavelength=1))
    err(cls, "max_wavelength", lambda: cls(max_wavelength="long"))
