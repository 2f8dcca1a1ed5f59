"""MultiHeadAttention: the formula in numpy, parity with Keras, the KV cache,
the tiled and fused paths, one mask semantics on every path, errors."""

import keras
import numpy as np
import pytest

import attention_layers as al
from attention_layers.ops import attention, tiles
from tests.contract import assert_clear_error
from tests.test_accelerators import choose

RNG = np.random.default_rng(11)
B, TQ, TV, D = 2, 5, 7, 6
Q = RNG.normal(size=(B, TQ, D)).astype("float32")
V = RNG.normal(size=(B, TV, 4)).astype("float32")
K = RNG.normal(size=(B, TV, 3)).astype("float32")
PATHS = ["direct", "fused", "tiled"]
# The tiled path in both of its modes: query blocks that take all the keys
# at once (the default at these lengths), and square tiles with a running
# log-sum-exp (the default past tiled.WHOLE_ROW_ELEMENTS).
TILED_PATHS = ["tiled", "tiled-square"]
BACKEND = keras.backend.backend()
TF_ONLY = pytest.mark.skipif(BACKEND != "tensorflow", reason="a TensorFlow-only path")


def path(implementation, monkeypatch):
    """The layer's ``implementation`` for a test path name."""
    if implementation == "tiled-square":
        monkeypatch.setattr(tiles, "WHOLE_ROW_ELEMENTS", 0)
        return "tiled"
    if implementation in ("tiled-native", "tiled-cast"):
        # Whole rows of bfloat16 scores with the native softmax check forced.
        native = keras.ops.convert_to_tensor(implementation == "tiled-native")
        monkeypatch.setattr(tiles, "native_softmax_is_float32", lambda *args: native)
        return "tiled"
    return implementation


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def layer_on(implementation="auto", **kwargs):
    kwargs = {"num_heads": 2, "key_dim": 3, "block_size": 2, **kwargs}
    return al.MultiHeadAttention(implementation=implementation, **kwargs)


def same_weights(layer, src, *args, **kwargs):
    """``layer``, built by a call on ``args``, with the weights of ``src``."""
    layer(*args, **kwargs)
    layer.set_weights(src.get_weights())
    return layer


def masks():
    """A value mask with padding and one fully masked row, a query mask."""
    value_mask = np.ones((B, TV), bool)
    value_mask[0, :] = False
    value_mask[1, 4:] = False
    query_mask = np.ones((B, TQ), bool)
    query_mask[1, -1] = False
    return {"value_mask": value_mask, "query_mask": query_mask}


def compiled(fn):
    """``fn`` compiled with XLA on the backend under test."""
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn, jit_compile=True)


def input_grads(fn, *xs):
    """Gradients of ``sum(fn(*xs))`` with respect to every ``xs``."""
    if BACKEND == "jax":
        import jax

        def total(*a):
            return keras.ops.sum(fn(*a))

        return [to_numpy(g) for g in jax.grad(total, range(len(xs)))(*xs)]
    import tensorflow as tf

    xs = [tf.constant(x) for x in xs]
    with tf.GradientTape() as tape:
        tape.watch(xs)
        total = tf.reduce_sum(fn(*xs))
    return [g.numpy() for g in tape.gradient(total, xs)]


# -- the formula ----------------------------------------------------------------
@pytest.mark.parametrize("implementation", PATHS)
def test_one_head_identity_projections_is_scaled_dot_product(implementation):
    layer = al.MultiHeadAttention(
        num_heads=1, key_dim=D, implementation=implementation, block_size=2
    )
    x = RNG.normal(size=(B, TV, D)).astype("float32")
    layer(Q, x)
    eye = np.eye(D, dtype="float32")
    zeros = np.zeros((1, D), "float32")
    layer.set_weights(
        [eye[:, None], zeros, eye[:, None], zeros, eye[:, None], zeros]
        + [eye[None], np.zeros(D, "float32")]
    )
    scores = Q @ x.transpose(0, 2, 1) / np.sqrt(D)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(to_numpy(layer(Q, x)), weights @ x, atol=1e-5)
    if implementation == "direct":
        _, got = layer(Q, x, return_attention_scores=True)
        np.testing.assert_allclose(to_numpy(got)[:, 0], weights, atol=1e-6)


# -- parity with keras.layers.MultiHeadAttention ----------------------------------
@pytest.mark.parametrize("implementation", ["auto", *PATHS])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_keras_weights_give_keras_outputs(kind, implementation):
    query = Q if kind == "cross" else RNG.normal(size=(B, TV, 4)).astype("float32")
    key = K if kind == "cross" else None
    # Keras's own layer on JAX (its fused call) and our fused path need one
    # head size.
    value_dim = 5 if BACKEND == "tensorflow" and implementation != "fused" else 3
    reference = keras.layers.MultiHeadAttention(2, 3, value_dim=value_dim)
    ours = layer_on(implementation, value_dim=value_dim)
    reference(query, V, key=key)
    ours(query, V, key=key)
    assert [w.shape for w in ours.weights] == [w.shape for w in reference.weights]
    ours.set_weights(reference.get_weights())
    # No fully masked row: Keras spreads those uniformly, we zero them.
    value_mask = np.ones((B, TV), bool)
    value_mask[1, 5:] = False
    attention_mask = RNG.random((B, query.shape[1], TV)) > 0.3
    attention_mask[..., 0] = True
    calls = [{}, {"value_mask": value_mask}, {"attention_mask": attention_mask}]
    if kind == "self":
        calls.append({"use_causal_mask": True, "value_mask": value_mask})
    for kwargs in calls:
        want = to_numpy(reference(query, V, key=key, **kwargs))
        got = to_numpy(ours(query, V, key=key, **kwargs))
        np.testing.assert_allclose(got, want, atol=2e-5, err_msg=str(kwargs))
    if implementation in ("auto", "direct"):
        _, want = reference(query, V, key=key, return_attention_scores=True)
        _, got = ours(query, V, key=key, return_attention_scores=True)
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-6)


# -- one mask semantics on every path --------------------------------------------
@pytest.mark.parametrize("implementation", PATHS + TILED_PATHS[1:])
def test_fully_masked_rows_give_the_output_bias(implementation, monkeypatch):
    layer = layer_on(path(implementation, monkeypatch), bias_initializer="ones")
    out = to_numpy(layer(Q, V, key=K, **masks()))
    np.testing.assert_array_equal(out[0], 1.0)  # every value masked
    np.testing.assert_array_equal(out[1, -1], 1.0)  # a masked query
    assert np.isfinite(out).all()
    # Under causal attention with a fully masked first row.
    attention_mask = np.ones((B, TQ, TV), bool)
    attention_mask[:, 0] = False
    out = layer(Q, V, key=K, attention_mask=attention_mask, use_causal_mask=True)
    out = to_numpy(out)
    np.testing.assert_array_equal(out[:, 0], 1.0)


def test_fully_masked_rows_with_dropout_and_scores():
    layer = layer_on("direct", dropout=0.5, bias_initializer="ones", seed=1)
    out, scores = layer(Q, V, training=True, return_attention_scores=True, **masks())
    out, scores = to_numpy(out), to_numpy(scores)
    np.testing.assert_array_equal(out[0], 1.0)
    np.testing.assert_array_equal(scores[0], 0.0)
    np.testing.assert_array_equal(scores[1, :, -1], 0.0)
    np.testing.assert_allclose(scores[1, :, :-1].sum(-1), 1.0, rtol=1e-5)
    assert (scores[1, ..., 4:] == 0).all()


@pytest.mark.parametrize("implementation", PATHS + TILED_PATHS[1:])
def test_nan_under_padding_does_not_leak(implementation, monkeypatch):
    layer = layer_on(path(implementation, monkeypatch))
    m = masks()
    dirty_q, dirty_v = Q.copy(), V.copy()
    dirty_q[~m["query_mask"]] = np.nan
    dirty_v[~m["value_mask"]] = np.inf
    clean = to_numpy(layer(Q, V, **m))
    dirty = to_numpy(layer(dirty_q, dirty_v, **m))
    np.testing.assert_array_equal(clean, dirty)
    grads = input_grads(lambda q, v: layer(q, v, **m), dirty_q, dirty_v)
    assert all(np.isfinite(g).all() for g in grads)


# -- the tiled path -----------------------------------------------------------------
@pytest.mark.parametrize(
    # 3: ragged last blocks, 16: one block; 1 and 2 (many tiny tiles) are slow.
    "block_size",
    [
        pytest.param(1, marks=pytest.mark.slow),
        pytest.param(2, marks=pytest.mark.slow),
        3,
        16,
    ],
)
@pytest.mark.parametrize("mode", TILED_PATHS)
def test_tiled_equals_direct_with_masks_causal_and_gradients(
    block_size, mode, monkeypatch
):
    direct = layer_on("direct")
    direct(Q, V, key=K)
    layer = layer_on(path(mode, monkeypatch), block_size=block_size)
    tiled = same_weights(layer, direct, Q, V, key=K)
    m = masks()
    attention_mask = RNG.random((B, TQ, TV)) > 0.4
    for kwargs in (
        {},
        m,
        {**m, "use_causal_mask": True},
        {"attention_mask": attention_mask, "key_mask": m["value_mask"]},
        {"use_causal_mask": True},
    ):
        want = to_numpy(direct(Q, V, key=K, **kwargs))
        got = to_numpy(tiled(Q, V, key=K, **kwargs))
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(kwargs))

        def through(layer, kw=kwargs):
            return lambda q, k, v: layer(q, v, key=k, **kw)

        want = input_grads(through(direct), Q, K, V)
        got = input_grads(through(tiled), Q, K, V)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5, err_msg=str(kwargs))


@pytest.mark.parametrize("block_size", [2, 3])
def test_tiled_causal_with_more_queries_than_keys_and_xla(block_size):
    # 7 queries over 5 keys, aligned at the first key as in Keras: query i
    # sees keys j <= i, so the last two see every key; whole tiles above the
    # diagonal are skipped, forward and backward.
    direct = layer_on("direct")
    direct(V[..., :3], Q[..., :3])
    tiled = same_weights(
        layer_on("tiled", block_size=block_size), direct, V[..., :3], Q[..., :3]
    )
    q, v = V[..., :3], Q[..., :3]

    def through(layer):
        return lambda q, v: layer(q, v, use_causal_mask=True)

    for run in (lambda f: f, compiled):
        got = to_numpy(run(through(tiled))(q, v))
        want = to_numpy(through(direct)(q, v))
        np.testing.assert_allclose(got, want, atol=1e-5)
    unmasked = to_numpy(direct(q, v))
    np.testing.assert_allclose(got[:, 5:], unmasked[:, 5:], atol=1e-5)
    assert not np.allclose(got[:, :4], unmasked[:, :4], atol=1e-3)
    got = input_grads(through(tiled), q, v)
    want = input_grads(through(direct), q, v)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_auto_tiles_long_inputs_and_falls_back_for_scores_and_dropout():
    direct = layer_on("direct", dropout=0.3)
    direct(Q, V)
    auto = same_weights(layer_on("auto", dropout=0.3, tile_threshold=4), direct, Q, V)
    assert choose(auto, False, False, TQ, TV) == "tiled"
    assert choose(auto, True, False, TQ, TV) == "direct"
    assert choose(auto, False, True, TQ, TV) == "direct"
    assert choose(auto, False, False, 2, 2) == "fused"
    assert choose(auto, False, False, None, TV) == "fused"
    out, scores = auto(Q, V, return_attention_scores=True, **masks())
    want, want_scores = direct(Q, V, return_attention_scores=True, **masks())
    np.testing.assert_allclose(to_numpy(out), to_numpy(want), atol=1e-6)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(want_scores), atol=1e-6)
    np.testing.assert_allclose(
        to_numpy(auto(Q, V, **masks())), to_numpy(want), atol=1e-5
    )


@pytest.mark.tf_only
def test_tiled_with_lengths_unknown_at_trace_time():
    import tensorflow as tf

    direct = layer_on("direct")
    direct(Q, V)
    tiled = same_weights(layer_on("tiled", block_size=3), direct, Q, V)
    spec = [
        tf.TensorSpec((None, None, D)),
        tf.TensorSpec((None, None, 4)),
        tf.TensorSpec((None, None), tf.bool),
        tf.TensorSpec((None, None), tf.bool),
    ]

    @tf.function(input_signature=spec)
    def run(q, v, qm, vm):
        return tiled(q, v, query_mask=qm, value_mask=vm, use_causal_mask=True)

    m = masks()
    got = run(Q, V, m["query_mask"], m["value_mask"]).numpy()
    want = to_numpy(direct(Q, V, use_causal_mask=True, **m))
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("implementation", ["fused", *TILED_PATHS])
def test_fast_paths_under_mixed_float16(implementation, monkeypatch):
    reference = layer_on("direct")
    reference(Q, V)
    keras.config.set_dtype_policy("mixed_float16")
    layer = same_weights(layer_on(path(implementation, monkeypatch)), reference, Q, V)
    out = layer(Q, V, **masks())
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    want = to_numpy(reference(Q, V, **masks()))
    np.testing.assert_allclose(to_numpy(out).astype("float32"), want, atol=2e-2)
    big = to_numpy(layer(300 * Q, 300 * V, **masks())).astype("float32")
    assert np.isfinite(big).all()


@pytest.mark.parametrize(
    "mode",
    [
        *TILED_PATHS,
        pytest.param("tiled-native", marks=TF_ONLY),
        pytest.param("tiled-cast", marks=TF_ONLY),
    ],
)
def test_tiled_under_mixed_bfloat16_matches_direct_with_gradients(mode, monkeypatch):
    # bfloat16 queries, keys and values; both paths normalise in float32.
    # On TensorFlow whole rows take the native softmax where the check holds,
    # else float32 score products: "tiled-native" and "tiled-cast" force each.
    keras.config.set_dtype_policy("mixed_bfloat16")
    direct = layer_on("direct")
    direct(Q, V, key=K)
    layer = same_weights(layer_on(path(mode, monkeypatch)), direct, Q, V, key=K)
    m = masks()

    def through(layer):
        return lambda q, k, v: layer(q, v, key=k, **m)

    got = to_numpy(through(layer)(Q, K, V)).astype("float32")
    want = to_numpy(through(direct)(Q, K, V)).astype("float32")
    np.testing.assert_allclose(got, want, atol=3e-2)
    for g, w in zip(
        input_grads(through(layer), Q, K, V),
        input_grads(through(direct), Q, K, V),
        strict=True,
    ):
        np.testing.assert_allclose(g, w, atol=5e-2, rtol=5e-2)


# -- the bfloat16 softmax check -------------------------------------------------------
def float32_inside(s, axis=-1):
    """A softmax that computes in float32: the contract's."""
    x = keras.ops.cast(s, "float32")
    return keras.ops.cast(keras.ops.softmax(x, axis=axis), s.dtype)


def rounded_exponentials(s, axis=-1):
    """XLA's bfloat16 softmax: exponentials rounded to bfloat16, summed in float32."""
    x = keras.ops.cast(s, "float32")
    e = keras.ops.exp(x - keras.ops.max(x, axis, keepdims=True))
    e = keras.ops.cast(keras.ops.cast(e, s.dtype), "float32")
    return keras.ops.cast(e / keras.ops.sum(e, axis, keepdims=True), s.dtype)


def rounded_sum(s, axis=-1):
    """Float32 exponentials over a sum rounded to bfloat16."""
    x = keras.ops.cast(s, "float32")
    e = keras.ops.exp(x - keras.ops.max(x, axis, keepdims=True))
    total = keras.ops.cast(keras.ops.sum(e, axis, keepdims=True), s.dtype)
    return keras.ops.cast(e / keras.ops.cast(total, "float32"), s.dtype)


@pytest.mark.parametrize(
    "softmax, holds",
    [(float32_inside, True), (rounded_exponentials, False), (rounded_sum, False)],
)
def test_native_softmax_check_tells_float32_kernels_apart(softmax, holds):
    check = tiles.native_softmax_is_float32("bfloat16", 0.0, softmax)
    assert bool(to_numpy(check)) == holds


@TF_ONLY
@pytest.mark.parametrize("jit", [False, True])
def test_native_softmax_check_implies_float32_weights_at_full_size(jit):
    # Wherever the check holds in a graph (TensorFlow's oneDNN kernel; not
    # XLA, not the Eigen kernel), the native bfloat16 softmax of full-size
    # rows gives the float32 weights bit for bit.
    import tensorflow as tf

    scores = tf.constant(3 * RNG.normal(size=(4, 256, 2048)), tf.bfloat16)

    @tf.function(jit_compile=jit)
    def run(s):
        zero = tf.minimum(tf.abs(tf.cast(s[0, 0, 0], tf.float32)), 0.0)
        holds = tiles.native_softmax_is_float32(s.dtype, zero)
        same = tf.reduce_all(tf.nn.softmax(s) == float32_inside(s))
        return holds, same

    holds, same = run(scores)
    assert same or not holds


# -- the KV cache ---------------------------------------------------------------------
def decoder_layer():
    layer = al.MultiHeadAttention(num_heads=2, key_dim=3)
    layer(Q, Q)
    return layer


def test_decoding_one_token_at_a_time_equals_one_causal_call():
    layer = decoder_layer()
    full = to_numpy(layer(Q, Q, use_causal_mask=True))
    cache = layer.empty_cache(B, TQ + 2)  # more slots than tokens
    steps = []
    for t in range(TQ):
        token = Q[:, t : t + 1]
        out, cache = layer(
            token, token, cache=cache, cache_update_index=t, use_causal_mask=True
        )
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)
    # A prompt of 3 tokens at once, then one more token.
    cache = layer.empty_cache(B, TQ)
    first, cache = layer(
        Q[:, :3], Q[:, :3], cache=cache, cache_update_index=0, use_causal_mask=True
    )
    nxt, cache = layer(
        Q[:, 3:4], Q[:, 3:4], cache=cache, cache_update_index=3, use_causal_mask=True
    )
    np.testing.assert_allclose(to_numpy(first), full[:, :3], atol=1e-5)
    np.testing.assert_allclose(to_numpy(nxt), full[:, 3:4], atol=1e-5)


@pytest.mark.parametrize("implementation", ["auto", "tiled"])
def test_cached_decoding_in_a_compiled_loop(implementation):
    layer = decoder_layer()
    layer.implementation = implementation
    full = to_numpy(layer(Q, Q, use_causal_mask=True))
    ops = keras.ops

    def decode(x):
        def body(t, state):
            cache, outputs = state
            token = ops.take(x, ops.expand_dims(t, 0), axis=1)
            out, cache = layer(
                token, token, cache=cache, cache_update_index=t, use_causal_mask=True
            )
            outputs = ops.slice_update(outputs, [0, t, 0], out)
            return cache, outputs

        state = (layer.empty_cache(B, TQ), ops.zeros_like(x))
        return ops.fori_loop(0, TQ, body, state)[1]

    np.testing.assert_allclose(to_numpy(compiled(decode)(Q)), full, atol=1e-5)


def test_cross_attention_cache_equals_a_plain_call():
    layer = layer_on("direct")
    layer(Q, V, key=K)
    m = masks()
    want, want_scores = layer(Q, V, key=K, return_attention_scores=True, **m)
    cache = layer.compute_cache(V, key=K)
    assert tuple(cache.shape) == (B, 2, TV, 2, 3)
    out, scores, same = layer(
        Q,
        None,
        cache=cache,
        return_attention_scores=True,
        query_mask=m["query_mask"],
        value_mask=m["value_mask"],
    )
    np.testing.assert_allclose(to_numpy(out), to_numpy(want), atol=1e-6)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(want_scores), atol=1e-6)
    assert same is cache


# -- config and errors -----------------------------------------------------------
def test_config_round_trip_keeps_every_argument():
    layer = al.MultiHeadAttention(
        num_heads=3,
        key_dim=2,
        value_dim=5,
        dropout=0.1,
        use_bias=False,
        output_shape=7,
        implementation="tiled",
        tile_threshold=99,
        block_size=4,
        seed=3,
    )
    out = layer(Q, V)
    assert tuple(out.shape) == (B, TQ, 7)
    assert len(layer.weights) == 4  # no biases
    config = layer.get_config()
    clone = al.MultiHeadAttention.from_config(config)
    assert clone.get_config() == config


def _l2_penalty(x):
    return 0.01 * keras.ops.sum(keras.ops.square(x))


def test_config_serializes_plain_function_regularizers_and_constraints():
    """Keras keeps a plain function given as a regularizer or constraint as
    it is; the config holds its serialized form, so a model saves to JSON."""
    import json

    layer = al.MultiHeadAttention(
        num_heads=2,
        key_dim=4,
        kernel_regularizer=_l2_penalty,
        kernel_constraint=keras.constraints.NonNeg(),
    )
    config = layer.get_config()
    assert isinstance(config["kernel_regularizer"], dict)
    assert config["kernel_regularizer"] == keras.regularizers.serialize(_l2_penalty)
    json.dumps(config)


def test_bad_arguments_raise_clear_errors():
    cls = al.MultiHeadAttention
    for kwargs, argument in [
        ({"num_heads": 0}, "num_heads"),
        ({"implementation": "flash"}, "implementation"),
        ({"tile_threshold": 0}, "tile_threshold"),
        ({"output_shape": (0,)}, "output_shape"),
        ({"implementation": "fused", "value_dim": 4}, "value_dim"),
    ]:
        assert_clear_error(cls, argument, lambda kw=kwargs: layer_on(**kw))
    layer = layer_on()
    checks = [
        ("query", lambda: layer(Q[0], V)),
        ("query", lambda: layer(Q.astype("int32"), V)),
        ("value", lambda: layer(Q, V[:1])),
        ("key", lambda: layer(Q, V, key=K[:, :3])),
        ("value_mask", lambda: layer(Q, V, value_mask=np.ones((B, 3), bool))),
        ("value", lambda: layer(Q, None)),
        (
            "return_attention_scores",
            lambda: layer_on("tiled")(Q, V, return_attention_scores=True),
        ),
        (
            "return_attention_scores",
            lambda: layer_on("fused")(Q, V, return_attention_scores=True),
        ),
        ("training", lambda: layer_on("tiled", dropout=0.2)(Q, V, training=True)),
        ("cache", lambda: layer(Q, V, cache_update_index=0)),
        ("cache", lambda: layer_on(value_dim=4).empty_cache(B, 3)),
        ("cache", lambda: layer_on().compute_cache(V)),  # not built
    ]
    for argument, fn in checks:
        assert_clear_error(cls, argument, fn)


# -- rotary positions ------------------------------------------------------------
def rotate(x, start, wavelength=10000.0, interleaved=True):
    """RoPE in numpy on ``x`` ``[B, T, H, d]`` at positions ``start + t``."""
    d = x.shape[-1]
    theta = wavelength ** (-np.arange(d // 2) * 2.0 / d)
    angle = (start + np.arange(x.shape[1]))[:, None] * theta  # [T, d/2]
    cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
        return out
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def rotary_layer(implementation="auto", rotary=True, **kwargs):
    kwargs = {"num_heads": 2, "key_dim": 4, "block_size": 2, **kwargs}
    return al.MultiHeadAttention(implementation=implementation, rotary=rotary, **kwargs)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("implementation", PATHS + TILED_PATHS[1:])
def test_rotary_equals_numpy_rotate_then_attend(
    implementation, interleaved, monkeypatch
):
    rotary = {"max_wavelength": 50, "interleaved": interleaved}
    layer = rotary_layer(path(implementation, monkeypatch), rotary)
    x = RNG.normal(size=(B, TV, D)).astype("float32")
    layer(x, x)
    wq, bq, wk, bk, wv, bv, wo, bo = layer.get_weights()

    def project(w, b, t):
        return np.einsum("btd,dhk->bthk", x[:, :t], w) + b

    # Self-attention, and the first 3 queries: queries and keys both at
    # positions from 0, the causal mask aligned at the first key (Keras').
    for tq in (TV, 3):
        q = rotate(project(wq, bq, tq), 0, 50.0, interleaved)
        k = rotate(project(wk, bk, TV), 0, 50.0, interleaved)
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0  # sqrt(key_dim)
        s = np.where(np.tril(np.ones((tq, TV), bool)), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        heads = np.einsum("bhqk,bkhd->bqhd", w, project(wv, bv, TV))
        want = np.einsum("bqhd,hdo->bqo", heads, wo) + bo
        got = layer(x[:, :tq], x, use_causal_mask=True)
        np.testing.assert_allclose(to_numpy(got), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("implementation", PATHS)
def test_rotary_cache_equals_the_full_causal_call(implementation):
    layer = rotary_layer(implementation)
    layer(Q, Q)
    full = to_numpy(layer(Q, Q, use_causal_mask=True))
    # A prompt of 2 tokens fed into the cache at once, then one at a time;
    # the index as a tensor (as in a compiled loop), and as a Python int.
    for as_tensor in (True, False) if implementation == "direct" else (True,):
        cache = layer.empty_cache(B, TQ + 1)
        out, cache = layer(
            Q[:, :2], Q[:, :2], cache=cache, cache_update_index=0, use_causal_mask=True
        )
        steps = [to_numpy(out)]
        for t in range(2, TQ):
            index = keras.ops.convert_to_tensor(t, "int32") if as_tensor else t
            token = Q[:, t : t + 1]
            out, cache = layer(
                token,
                token,
                cache=cache,
                cache_update_index=index,
                use_causal_mask=True,
            )
            steps.append(to_numpy(out))
        np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_rotary_cache_in_a_compiled_loop():
    layer = rotary_layer()
    layer(Q, Q)
    full = to_numpy(layer(Q, Q, use_causal_mask=True))
    ops = keras.ops

    def decode(x):
        def body(t, state):
            cache, outputs = state
            token = ops.take(x, ops.expand_dims(t, 0), axis=1)
            out, cache = layer(
                token, token, cache=cache, cache_update_index=t, use_causal_mask=True
            )
            return cache, ops.slice_update(outputs, [0, t, 0], out)

        state = (layer.empty_cache(B, TQ), ops.zeros_like(x))
        return ops.fori_loop(0, TQ, body, state)[1]

    np.testing.assert_allclose(to_numpy(compiled(decode)(Q)), full, atol=1e-5)


def test_rotary_scores_depend_on_relative_positions_only():
    layer = rotary_layer("direct")
    layer(Q, Q)
    _, want = layer(Q, Q, use_causal_mask=True, return_attention_scores=True)
    shift = 1000
    # The same tokens at positions shift..shift+T-1: written into a cache at
    # that index, the empty slots before it masked out.
    cache = layer.empty_cache(B, shift + TQ)
    value_mask = np.arange(shift + TQ)[None].repeat(B, 0) >= shift
    _, got, _ = layer(
        Q,
        Q,
        cache=cache,
        cache_update_index=shift,
        value_mask=value_mask,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    got = to_numpy(got)
    np.testing.assert_allclose(got[..., shift:], to_numpy(want), atol=1e-5)
    assert (got[..., :shift] == 0).all()
    # Without rotary positions the scores did not depend on positions at all;
    # with them they do (a check that the rotation is applied).
    plain = al.MultiHeadAttention(num_heads=2, key_dim=4)
    plain(Q, Q)
    plain.set_weights(layer.get_weights())
    _, unrotated = plain(Q, Q, use_causal_mask=True, return_attention_scores=True)
    assert not np.allclose(to_numpy(unrotated), to_numpy(want), atol=1e-3)


def test_rotary_config_and_keras_file_round_trip(tmp_path):
    for rotary, want in [
        (True, {"max_wavelength": 10000, "scaling_factor": 1.0, "interleaved": True}),
        (
            al.RotaryEmbedding(max_wavelength=500, interleaved=False),
            {"max_wavelength": 500, "scaling_factor": 1.0, "interleaved": False},
        ),
        (
            {"scaling_factor": 2.0},
            {"max_wavelength": 10000, "scaling_factor": 2.0, "interleaved": True},
        ),
    ]:
        layer = rotary_layer(rotary=rotary)
        config = layer.get_config()
        assert config["rotary"] == want
        assert al.MultiHeadAttention.from_config(config).get_config() == config
    assert rotary_layer(rotary=None).get_config()["rotary"] is None
    query = keras.Input((TQ, D))
    model = keras.Model(query, layer(query, query, use_causal_mask=True))
    expected = model.predict(Q, verbose=0)
    file = str(tmp_path / "rotary.keras")
    model.save(file)
    loaded = keras.saving.load_model(file)  # no custom_objects
    assert loaded.layers[-1].rotary == want
    np.testing.assert_allclose(loaded.predict(Q, verbose=0), expected, atol=1e-6)


def test_rotary_bad_arguments_raise_clear_errors():
    cls = al.MultiHeadAttention
    for kwargs, argument in [
        ({"rotary": "yes"}, "rotary"),
        ({"rotary": {"max_wavelength": 1}}, "rotary"),
        ({"rotary": {"base": 10}}, "rotary"),
        ({"key_dim": 3}, "key_dim"),
    ]:
        assert_clear_error(cls, argument, lambda kw=kwargs: rotary_layer(**kw))
    layer = rotary_layer()
    layer(Q, V)
    cache = layer.empty_cache(B, TV)
    assert_clear_error(cls, "rotary", lambda: layer.compute_cache(V))
    assert_clear_error(cls, "cache_update_index", lambda: layer(Q, None, cache=cache))


# -- "auto" on accelerators (the choices: tests/test_accelerators.py) -------------
def test_auto_takes_the_fused_kernel_on_accelerators(monkeypatch):
    """On a GPU (the device query substituted) the call takes the fused path,
    whatever tile_threshold says, and gives the direct path's numbers."""
    from attention_layers.ops import devices

    monkeypatch.setattr(devices, "platform", lambda: "gpu")
    direct = layer_on("direct")
    direct(Q, V)
    auto = same_weights(layer_on(tile_threshold=1), direct, Q, V)
    taken = []
    fused = attention.fused
    monkeypatch.setattr(attention, "fused", lambda *a: taken.append(1) or fused(*a))
    np.testing.assert_allclose(
        to_numpy(auto(Q, V, **masks())), to_numpy(direct(Q, V, **masks())), atol=1e-5
    )
    assert taken
