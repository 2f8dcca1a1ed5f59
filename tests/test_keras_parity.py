"""MultiHeadAttention as a drop-in for keras.layers.MultiHeadAttention: the
same numbers on the same weights for every argument and input form, Keras'
configs and errors; and the cache behaviours of keras-hub's
CachedMultiHeadAttention (its tests are not in its distributions, so they
are written here from its behaviours)."""

import keras
import numpy as np
import pytest

import attention_layers as al

RNG = np.random.default_rng(5)
B, TQ, TV, D = 2, 4, 6, 8


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def array(*shape):
    return RNG.normal(size=shape).astype("float32")


def pair(ours=None, **kwargs):
    """Keras' layer and ours with the same arguments and weights."""
    kwargs = {"num_heads": 2, "key_dim": 4, **kwargs}
    return keras.layers.MultiHeadAttention(**kwargs), al.MultiHeadAttention(
        **kwargs, **(ours or {})
    )


def build_same(reference, layer, *args, **kwargs):
    # With scores: Keras' path that takes two head sizes on every backend.
    reference(*args, return_attention_scores=True, **kwargs)
    layer(*args, **kwargs)
    assert [w.shape for w in layer.weights] == [w.shape for w in reference.weights]
    layer.set_weights(reference.get_weights())


def tril(tq, tv):
    return np.tril(np.ones((tq, tv), bool))


# Each case: constructor arguments, (query, value, key) shapes, call arguments.
CASES = {
    "self": ({}, ((B, TQ, D), (B, TQ, D), None), {}),
    "cross_key": ({}, ((B, TQ, D), (B, TV, 5), (B, TV, 3)), {}),
    "value_dim": ({"value_dim": 3}, ((B, TQ, D), (B, TV, D), None), {}),
    "no_bias": ({"use_bias": False}, ((B, TQ, D), (B, TV, D), None), {}),
    "output_int": ({"output_shape": 5}, ((B, TQ, D), (B, TV, D), None), {}),
    "output_tuple": ({"output_shape": (3, 2)}, ((B, TQ, D), (B, TV, D), None), {}),
    "gate": ({"use_gate": True}, ((B, TQ, D), (B, TV, D), None), {}),
    "window": ({"sliding_window": 2}, ((B, TV, D), (B, TV, D), None), {}),
    "window_causal": (
        {"sliding_window": 3},
        ((B, TV, D), (B, TV, D), None),
        {"use_causal_mask": True},
    ),
    "causal_fewer_queries": (
        {},
        ((B, TQ, D), (B, TV, D), None),
        {"use_causal_mask": True},
    ),
    "causal_more_queries": (
        {},
        ((B, TV, D), (B, TQ, D), None),
        {"use_causal_mask": True},
    ),
    "mask_2d": ({}, ((B, TQ, D), (B, TV, D), None), {"attention_mask": tril(TQ, TV)}),
    "mask_1": (
        {},
        ((B, TQ, D), (B, TV, D), None),
        {"attention_mask": tril(TQ, TV)[None]},
    ),
    "mask_batch": (
        {},
        ((B, TQ, D), (B, TV, D), None),
        {"attention_mask": RNG.random((B, TQ, TV)) > 0.3},
    ),
    "mask_per_head": (
        {},
        ((B, TQ, D), (B, TV, D), None),
        {"attention_mask": np.stack([tril(TQ, TV), tril(TQ, TV)[::-1]])[None]},
    ),
    "value_mask_causal": (
        {},
        ((B, TV, D), (B, TV, D), None),
        {
            "value_mask": np.array([[1] * TV, [1] * 4 + [0] * 2], bool),
            "use_causal_mask": True,
        },
    ),
    "rank4_axis2": ({"attention_axes": 2}, ((B, 3, TQ, D), (B, 3, TV, D), None), {}),
    "rank4_axis_neg": (
        {"attention_axes": -2},
        ((B, 3, TQ, D), (B, 3, TV, D), None),
        {},
    ),
    "rank4_both_axes": (
        {"attention_axes": (1, 2)},
        ((B, 3, TQ, D), (B, 2, TV, D), None),
        {},
    ),
    "rank4_default_axes": ({}, ((B, 3, TQ, D), (B, 2, TV, D), None), {}),
    "rank5_two_axes": (
        {"attention_axes": (2, 3)},
        ((B, 2, 3, TQ, D), (B, 2, 3, TV, D), None),
        {},
    ),
    "rank4_causal_axis1": (
        {"attention_axes": 1},
        ((B, TV, 3, D), (B, TV, 3, D), None),
        {"use_causal_mask": True},
    ),
    "rank4_mask": (
        {"attention_axes": 2},
        ((B, 3, TQ, D), (B, 3, TV, D), None),
        {"attention_mask": RNG.random((B, 3, TQ, TV)) > 0.3},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_numbers_as_keras(case):
    kwargs, (q_shape, v_shape, k_shape), call = CASES[case]
    query, value = array(*q_shape), array(*v_shape)
    key = None if k_shape is None else array(*k_shape)
    reference, layer = pair(**kwargs)
    build_same(reference, layer, query, value, key=key)
    want, want_scores = reference(
        query, value, key=key, return_attention_scores=True, **call
    )
    got, scores = layer(query, value, key=key, return_attention_scores=True, **call)
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=2e-5)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(want_scores), atol=2e-6)
    # Without scores: Keras' fused call, and our "auto" path (Keras' fused
    # call fails on JAX with two head sizes: jax.nn.dot_product_attention
    # takes one; ours takes the direct path there).
    if not (kwargs.get("value_dim") and keras.backend.backend() == "jax"):
        want = reference(query, value, key=key, **call)
    np.testing.assert_allclose(
        to_numpy(layer(query, value, key=key, **call)), to_numpy(want), atol=2e-5
    )
    assert layer.compute_output_shape(q_shape, v_shape, k_shape) == tuple(got.shape)


@pytest.mark.parametrize("implementation", ["direct", "fused", "tiled"])
@pytest.mark.parametrize("case", ["window_causal", "causal_fewer_queries", "mask_2d"])
def test_every_path_gives_keras_numbers(case, implementation):
    kwargs, (q_shape, v_shape, _), call = CASES[case]
    query, value = array(*q_shape), array(*v_shape)
    reference, layer = pair(
        {"implementation": implementation, "block_size": 2}, **kwargs
    )
    build_same(reference, layer, query, value)
    np.testing.assert_allclose(
        to_numpy(layer(query, value, **call)),
        to_numpy(reference(query, value, **call)),
        atol=2e-5,
    )


def test_keras_configs_build_ours():
    reference = keras.layers.MultiHeadAttention(
        num_heads=2,
        key_dim=4,
        value_dim=3,
        output_shape=(5,),
        attention_axes=(1,),
        sliding_window=3,
        use_gate=True,
        kernel_regularizer="l2",
        bias_constraint="non_neg",
        dropout=0.25,
        seed=3,
    )
    layer = al.MultiHeadAttention.from_config(reference.get_config())
    config = layer.get_config()
    for name, value in reference.get_config().items():
        if name not in ("name", "dtype", "output_shape", "attention_axes"):
            assert config[name] == value, name
    assert list(config["output_shape"]) == [5] and tuple(config["attention_axes"]) == (
        1,
    )
    query, value = array(B, TQ, D), array(B, TV, D)
    build_same(reference, layer, query, value)
    np.testing.assert_allclose(
        to_numpy(layer(query, value)), to_numpy(reference(query, value)), atol=2e-5
    )
    # The regularizer and the constraint reach the projections, as in Keras.
    assert len(layer.losses) == len(reference.losses) == 5
    assert isinstance(layer.query_dense.bias.constraint, keras.constraints.NonNeg)


def test_causal_alignment_with_a_cache_is_the_cache_index():
    """Without a cache query i sees keys j <= i (Keras); with a self-attention
    cache the index says where the queries sit: query i sees slots <= index + i."""
    layer = al.MultiHeadAttention(num_heads=2, key_dim=4)
    x = array(B, TV, D)
    full = to_numpy(layer(x, x, use_causal_mask=True))
    cache = layer.empty_cache(B, TV)
    _, cache = layer(x[:, :3], x[:, :3], cache=cache, cache_update_index=0)
    tail, _ = layer(
        x[:, 3:], x[:, 3:], cache=cache, cache_update_index=3, use_causal_mask=True
    )
    np.testing.assert_allclose(to_numpy(tail), full[:, 3:], atol=1e-5)
    # The last three queries against all six keys, no cache: aligned at key 0.
    head = to_numpy(layer(x[:, 3:], x, use_causal_mask=True))
    reference = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    build_same(reference, al.MultiHeadAttention(num_heads=2, key_dim=4), x, x)
    reference.set_weights(layer.get_weights())
    want = to_numpy(reference(x[:, 3:], x, use_causal_mask=True))
    np.testing.assert_allclose(head, want, atol=2e-5)


# -- keras-hub's CachedMultiHeadAttention behaviours ---------------------------------
def test_cache_step_by_step_with_an_attention_mask_equals_one_call():
    """A causal ``attention_mask`` over the cache slots, fed one row per step,
    gives the outputs and the cache of one call over all the tokens."""
    layer = al.MultiHeadAttention(num_heads=2, key_dim=4)
    x = array(B, 5, D)
    mask = np.tril(np.ones((5, 5), bool))
    cache = keras.ops.zeros((B, 2, 5, 2, 4))
    whole, whole_cache = layer(
        x, x, cache=cache, cache_update_index=0, attention_mask=mask
    )
    outputs, step_cache = [], cache
    for i in range(5):
        out, step_cache = layer(
            x[:, i : i + 1],
            x[:, i : i + 1],
            cache=step_cache,
            cache_update_index=i,
            attention_mask=mask[i : i + 1],
        )
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, 1), to_numpy(whole), atol=1e-5)
    np.testing.assert_allclose(to_numpy(step_cache), to_numpy(whole_cache), atol=1e-5)


def test_cache_returns_scores_and_keeps_its_shape():
    layer = al.MultiHeadAttention(num_heads=2, key_dim=4)
    x = array(B, 5, D)
    cache = keras.ops.zeros((B, 2, 5, 2, 4))
    out, scores, new_cache = layer(
        x,
        x,
        cache=cache,
        cache_update_index=0,
        attention_mask=np.tril(np.ones((5, 5))),
        return_attention_scores=True,
    )
    assert tuple(out.shape) == (B, 5, D) and tuple(scores.shape) == (B, 2, 5, 5)
    assert tuple(new_cache.shape) == tuple(cache.shape)
    np.testing.assert_allclose(to_numpy(scores).sum(-1), 1.0, rtol=1e-5)


def test_training_reaches_the_dropout():
    """Dropout of (almost) every weight in training: the output is the output
    projection of a zero context, its bias."""
    layer = al.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.99999, seed=1)
    x = array(B, 5, D)
    out = to_numpy(layer(x, x, training=True))
    bias = to_numpy(layer.output_dense.bias)
    np.testing.assert_allclose(out, np.broadcast_to(bias, out.shape), atol=1e-5)


# -- errors in Keras' words --------------------------------------------------------
def test_keras_error_messages_are_kept():
    with pytest.raises(ValueError, match="Invalid `output_shape`"):
        al.MultiHeadAttention(num_heads=2, key_dim=4, output_shape=8.0)
    with pytest.raises(ValueError, match="must be equal"):
        al.MultiHeadAttention(num_heads=2, key_dim=4).compute_output_shape(
            (2, 4, 8), (2, 2, 8), (2, 1, 7)
        )
    with pytest.raises(ValueError, match="Dropout is not supported when flash"):
        al.MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=True, dropout=0.1)
    layer = al.MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=True)
    with pytest.raises(ValueError, match="Returning attention scores is not supported"):
        layer(array(B, 4, D), array(B, 4, D), return_attention_scores=True)
    for bad in ({"sliding_window": 0}, {"attention_axes": "1"}, {"num_heads": 1.5}):
        with pytest.raises(ValueError, match=f"`{next(iter(bad))}`"):
            al.MultiHeadAttention(**{"num_heads": 2, "key_dim": 4, **bad})
    with pytest.raises(ValueError, match="`attention_mask`"):
        al.MultiHeadAttention(num_heads=2, key_dim=4)(
            array(B, 4, D), array(B, 6, D), attention_mask=np.ones((4, 5), bool)
        )
