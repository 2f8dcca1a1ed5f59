"""Each score function against the paper's formula, computed by hand in numpy."""

import math

import keras
import numpy as np
import pytest

import attention_layers as al

RNG = np.random.default_rng(42)
Q = RNG.normal(size=(2, 3, 4)).astype("float32")  # [B, Tq, Dq]
K = RNG.normal(size=(2, 5, 4)).astype("float32")  # [B, Tv, Dk]
V = RNG.normal(size=(2, 5, 6)).astype("float32")  # [B, Tv, Dv]


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def run(layer, query=Q, key=K, value=V, **kwargs):
    context, weights = layer(
        query, value, key=key, return_attention_scores=True, **kwargs
    )
    return keras.ops.convert_to_numpy(context), keras.ops.convert_to_numpy(weights)


def assert_attention(layer, scores, **kwargs):
    """The layer's weights are softmax(scores) and its context is weights @ V."""
    context, weights = run(layer, **kwargs)
    np.testing.assert_allclose(weights, softmax(scores), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(context, softmax(scores) @ V, rtol=1e-5, atol=1e-5)


def test_dot_by_hand():
    """q = [1, 0]; keys [1, 0] and [0, 1]: scores [1, 0], weights e/(1+e), 1/(1+e)."""
    q = np.array([[[1.0, 0.0]]], "float32")
    k = np.array([[[1.0, 0.0], [0.0, 1.0]]], "float32")
    v = np.array([[[10.0], [20.0]]], "float32")
    context, weights = al.LuongAttention("dot")(
        q, v, key=k, return_attention_scores=True
    )
    a = math.e / (1 + math.e)
    np.testing.assert_allclose(np.asarray(weights), [[[a, 1 - a]]], rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(context), [[[10 * a + 20 * (1 - a)]]], rtol=1e-6
    )


def test_bahdanau_formula():
    layer = al.BahdanauAttention(units=3)
    run(layer)  # build
    w1 = RNG.normal(size=(4, 3)).astype("float32")
    w2 = RNG.normal(size=(4, 3)).astype("float32")
    v = RNG.normal(size=(3,)).astype("float32")
    layer.query_dense.kernel.assign(w1)
    layer.key_dense.kernel.assign(w2)
    layer.v.assign(v)
    # e_ij = v^T tanh(W1 s_i + W2 h_j)
    e = np.tanh((Q @ w1)[:, :, None, :] + (K @ w2)[:, None, :, :]) @ v
    assert_attention(layer, e)
    # Blocked evaluation (one query row at a time) gives the same numbers.
    blocked = al.BahdanauAttention(units=3, block_elements=1)
    run(blocked)
    blocked.set_weights(layer.get_weights())
    np.testing.assert_allclose(run(blocked)[1], run(layer)[1], rtol=1e-6)


@pytest.mark.tf_only
@pytest.mark.parametrize("budget", [1, 2 * 5 * 3 * 2, 10**9])  # 1, 2, all rows
def test_bahdanau_blocks_at_lengths_unknown_when_traced(budget):
    """Lengths unknown at trace time (a tf.data pipeline of varying lengths):
    the blocks are planned when the step runs, and their written-out gradient
    equals autodiff of the formula, bias included."""
    import tensorflow as tf

    q = RNG.normal(size=(2, 7, 3)).astype("float32")  # 7 rows: a ragged last block
    k = RNG.normal(size=(2, 5, 3)).astype("float32")
    v, b = RNG.normal(size=(2, 3)).astype("float32")
    upstream = RNG.normal(size=(2, 7, 5)).astype("float32")
    spec = [tf.TensorSpec((None, None, 3)), tf.TensorSpec((None, None, 3))]
    spec += [tf.TensorSpec((3,))] * 2

    def gradients(scores):
        @tf.function(input_signature=spec)
        def step(q, k, v, b):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v, b])
                s = scores(q, k, v, b)
                loss = tf.reduce_sum(s * upstream)
            return s, tape.gradient(loss, [q, k, v, b])

        return step(q, k, v, b)

    def formula(q, k, v, b):
        return tf.einsum("bqvu,u->bqv", tf.tanh(q[:, :, None] + k[:, None] + b), v)

    got, got_grads = gradients(
        lambda q, k, v, b: al.additive_scores(q, k, v, bias=b, block_elements=budget)
    )
    want, want_grads = gradients(formula)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for name, a, w in zip("qkvb", got_grads, want_grads, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5, err_msg=name)


def test_bahdanau_normalized_formula():
    layer = al.BahdanauAttention(units=3, normalize=True)
    run(layer)
    w1, w2 = layer.query_dense.kernel.numpy(), layer.key_dense.kernel.numpy()
    v = np.array([3.0, 0.0, 4.0], "float32")
    b = np.array([0.1, -0.2, 0.3], "float32")
    layer.v.assign(v)
    layer.b.assign(b)
    layer.g.assign(2.0)
    # e_ij = g v/||v|| . tanh(W1 s_i + W2 h_j + b), ||v|| = 5
    e = np.tanh((Q @ w1)[:, :, None, :] + (K @ w2)[:, None, :, :] + b) @ (2.0 * v / 5)
    assert_attention(layer, e)


def test_luong_general_formula():
    layer = al.LuongAttention("general", use_scale=True)
    run(layer)
    w = RNG.normal(size=(4, 4)).astype("float32")  # maps keys to the query size
    layer.W_a.kernel.assign(w)
    layer.g.assign(0.5)
    # score = g * h_t^T W_a h_s
    assert_attention(layer, 0.5 * np.einsum("bqd,bvd->bqv", Q, K @ w))


def test_luong_concat_formula():
    layer = al.LuongAttention("concat", units=3)
    run(layer)
    w = RNG.normal(size=(8, 3)).astype("float32")
    v = RNG.normal(size=(3,)).astype("float32")
    layer.W_a.assign(w)
    layer.v_a.assign(v)
    # score = v_a^T tanh(W_a [h_t; h_s]), the concatenation built explicitly
    concat = np.concatenate(
        [
            np.broadcast_to(Q[:, :, None], (2, 3, 5, 4)),
            np.broadcast_to(K[:, None], (2, 3, 5, 4)),
        ],
        axis=-1,
    )
    assert_attention(layer, np.tanh(concat @ w) @ v)


def test_luong_location_formula():
    layer = al.LuongAttention("location", max_value_length=7)
    run(layer)
    w = RNG.normal(size=(4, 7)).astype("float32")
    layer.W_a.kernel.assign(w)
    # a_t = softmax(W_a h_t) over the first Tv = 5 positions; keys are ignored
    assert_attention(layer, (Q @ w)[..., :5])


def test_luong_dot_formula():
    assert_attention(al.LuongAttention("dot"), np.einsum("bqd,bvd->bqv", Q, K))


@pytest.mark.parametrize("scale", [None, 0.25])
def test_scaled_dot_product_formula(scale):
    s = 1 / math.sqrt(4) if scale is None else scale
    assert_attention(
        al.ScaledDotProductAttention(scale=scale), s * np.einsum("bqd,bvd->bqv", Q, K)
    )


def test_attention_pooling_formula():
    layer = al.AttentionPooling(units=3)
    pooled, weights = layer(V, return_attention_scores=True)
    w = RNG.normal(size=(6, 3)).astype("float32")
    b = RNG.normal(size=(3,)).astype("float32")
    u_w = RNG.normal(size=(3,)).astype("float32")
    layer.dense.kernel.assign(w)
    layer.dense.bias.assign(b)
    layer.context_vector.assign(u_w)
    pooled, weights = layer(V, return_attention_scores=True)
    # u_t = tanh(W h_t + b); a_t = softmax(u_t . u_w); s = sum_t a_t h_t
    a = softmax(np.tanh(V @ w + b) @ u_w)
    np.testing.assert_allclose(np.asarray(weights), a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(pooled), np.einsum("bt,btd->bd", a, V), rtol=1e-5, atol=1e-5
    )


def test_single_step_query_equals_one_row_of_all_steps():
    layer = al.BahdanauAttention(units=5)
    all_steps = run(layer)
    for i in range(Q.shape[1]):
        one = run(layer, query=Q[:, i])
        np.testing.assert_allclose(one[0], all_steps[0][:, i], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(one[1], all_steps[1][:, i], rtol=1e-5, atol=1e-6)


def test_dropout_only_in_training():
    layer = al.ScaledDotProductAttention(dropout=0.5, seed=1)
    x = RNG.normal(size=(2, 6, 4)).astype("float32")
    a = keras.ops.convert_to_numpy(layer(x, x, training=False))
    b = keras.ops.convert_to_numpy(layer(x, x, training=False))
    c = keras.ops.convert_to_numpy(layer(x, x, training=True))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
