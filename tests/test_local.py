"""LocalAttention (Luong 2015, section 3.2) against the paper's formulas in numpy."""

import keras
import numpy as np
import pytest

import attention_layers as al
from tests.contract import assert_clear_error

RNG = np.random.default_rng(7)
B, TQ, TV, DQ, DV = 2, 5, 9, 4, 3
Q = RNG.normal(size=(B, TQ, DQ)).astype("float32")  # decoder states h_t
K = RNG.normal(size=(B, TV, DQ)).astype("float32")  # encoder states h_s
V = RNG.normal(size=(B, TV, DV)).astype("float32")
VALUE_MASK = np.ones((B, TV), bool)
VALUE_MASK[1, 6:] = False  # row 1: real source length S = 6


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def run(layer, query=Q, key=K, value=V, **kwargs):
    """``(context, weights, positions)`` of one call, as numpy arrays."""
    out = layer(
        query,
        value,
        key=key,
        return_attention_scores=True,
        return_positions=True,
        **kwargs,
    )
    return tuple(to_numpy(x) for x in out)


def local_reference(scores, p, window, mask=None, gaussian=False):
    """The paper's local weights, one decoder step at a time.

    ``scores`` ``[B, Tq, Tv]`` (every pair, only the window is used), ``p``
    ``[B, Tq]``: softmax over the integer s in [p_t - D, p_t + D] (and in the
    mask), times exp(-(s - p_t)^2 / (2 sigma^2)), sigma = D / 2, for local-p.
    """
    b, tq, tv = scores.shape
    s = np.arange(tv)
    weights = np.zeros(scores.shape)
    for i in range(b):
        for t in range(tq):
            inside = (s >= p[i, t] - window) & (s <= p[i, t] + window)
            if mask is not None:
                inside &= mask[i, t]
            if not inside.any():
                continue
            e = np.exp(scores[i, t] - scores[i, t][inside].max()) * inside
            a = e / e.sum()
            if gaussian:
                sigma = window / 2
                a = a * np.exp(-((s - p[i, t]) ** 2) / (2 * sigma**2))
            weights[i, t] = a
    return weights


def predicted_positions(query, w_p, v_p, length):
    """p_t = S sigmoid(v_p^T tanh(W_p h_t)), at most the last index S - 1."""
    p = length[:, None] / (1 + np.exp(-(np.tanh(query @ w_p) @ v_p)))
    return np.minimum(p, length[:, None] - 1)


def set_predictive(layer, w_p, v_p):
    layer.W_p.assign(w_p)
    layer.v_p.assign(v_p)


# -- formulas ------------------------------------------------------------------
def test_local_m_general_formula():
    layer = al.LocalAttention(
        "monotonic", window=2, score_mode="general", use_scale=True
    )
    run(layer)  # build
    w_a = RNG.normal(size=(DQ, DQ)).astype("float32")
    layer.W_a.kernel.assign(w_a)
    layer.g.assign(0.5)
    context, weights, p = run(layer, value_mask=VALUE_MASK)
    # local-m: p_t = t; score = g h_t^T W_a h_s; softmax inside [t - D, t + D]
    want_p = np.broadcast_to(np.arange(TQ, dtype="float32"), (B, TQ))
    np.testing.assert_array_equal(p, want_p)
    scores = 0.5 * np.einsum("bqd,bvd->bqv", Q, K @ w_a)
    mask = np.broadcast_to(VALUE_MASK[:, None], (B, TQ, TV))
    want = local_reference(scores, want_p, 2, mask)
    np.testing.assert_allclose(weights, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(context, want @ V, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("score_mode", ["dot", "concat"])
def test_local_p_formula(score_mode):
    layer = al.LocalAttention("predictive", window=2, score_mode=score_mode, units=3)
    run(layer)
    w_p = RNG.normal(size=(DQ, 3)).astype("float32")
    v_p = RNG.normal(size=(3,)).astype("float32")
    set_predictive(layer, w_p, v_p)
    if score_mode == "dot":
        scores = np.einsum("bqd,bvd->bqv", Q, K)
    else:
        w_a = RNG.normal(size=(2 * DQ, 3)).astype("float32")
        v_a = RNG.normal(size=(3,)).astype("float32")
        layer.W_a.assign(w_a)
        layer.v_a.assign(v_a)
        # score = v_a^T tanh(W_a [h_t; h_s]) with the concatenation built
        concat = np.concatenate(
            [
                np.broadcast_to(Q[:, :, None], (B, TQ, TV, DQ)),
                np.broadcast_to(K[:, None], (B, TQ, TV, DQ)),
            ],
            axis=-1,
        )
        scores = np.tanh(concat @ w_a) @ v_a
    context, weights, p = run(layer, value_mask=VALUE_MASK)
    # p_t = S sigmoid(v_p^T tanh(W_p h_t)) with S the real length (9 and 6)
    want_p = predicted_positions(Q, w_p, v_p, VALUE_MASK.sum(1).astype("float64"))
    np.testing.assert_allclose(p, want_p, rtol=1e-5)
    assert (p[1] <= 5).all()
    mask = np.broadcast_to(VALUE_MASK[:, None], (B, TQ, TV))
    want = local_reference(scores, p.astype("float64"), 2, mask, gaussian=True)
    np.testing.assert_allclose(weights, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(context, want @ V, rtol=1e-5, atol=1e-5)
    # Not renormalised after the Gaussian, as in the paper.
    assert (weights.sum(-1) < 1).all()


def test_local_p_stays_inside_the_source():
    """A saturated sigmoid would put p_t at S, one past the last index: it is
    clipped to S - 1, and that position keeps its weight."""
    layer = al.LocalAttention("predictive", window=2, score_mode="dot", units=3)
    run(layer)
    set_predictive(layer, np.ones((DQ, 3), "float32"), np.full(3, 50.0, "float32"))
    query = np.abs(Q) + 1.0  # tanh(W_p h_t) near 1: the sigmoid saturates at 1
    _, weights, p = run(layer, query=query, value_mask=VALUE_MASK)
    np.testing.assert_array_equal(p, np.broadcast_to([[8.0], [5.0]], (B, TQ)))
    last = VALUE_MASK.sum(1) - 1
    for i in range(B):
        assert (weights[i, :, last[i]] > 0).all()


def test_every_mask_source_is_gathered_in_the_window():
    layer = al.LocalAttention("predictive", window=3, score_mode="dot")
    attention_mask = RNG.random((B, TQ, TV)) > 0.3
    query_mask = np.ones((B, TQ), bool)
    query_mask[0, -1] = False
    masks = {
        "query_mask": query_mask,
        "value_mask": VALUE_MASK,
        "attention_mask": attention_mask,
    }
    context, weights, p = run(layer, **masks)
    merged = query_mask[:, :, None] & VALUE_MASK[:, None] & attention_mask
    scores = np.einsum("bqd,bvd->bqv", Q, K)
    want = local_reference(scores, p.astype("float64"), 3, merged, gaussian=True)
    np.testing.assert_allclose(weights, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(context, want @ V, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(weights[0, -1], 0.0)
    np.testing.assert_array_equal(context[0, -1], 0.0)


def test_wide_local_m_is_global_luong():
    """A window wider than the source: local-m is Luong's global attention."""
    local = al.LocalAttention("monotonic", window=TV, score_mode="general")
    glob = al.LuongAttention("general")
    run(local)
    glob(Q, V, key=K)
    glob.set_weights(local.get_weights())
    want = [to_numpy(x) for x in glob(Q, V, key=K, return_attention_scores=True)]
    got = run(local)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


# -- windows ---------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["monotonic", "predictive"])
@pytest.mark.parametrize("window", [1, 3])
def test_zero_weight_outside_the_window(mode, window):
    layer = al.LocalAttention(mode, window=window, score_mode="dot")
    _, weights, p = run(layer)
    s = np.arange(TV)
    outside = np.abs(s - p[..., None]) > window
    assert (weights[outside] == 0).all()
    assert (weights[~outside] > 0).all()
    assert ((~outside).sum(-1) <= 2 * window + 1).all()


def test_local_m_window_clipped_at_the_edges_and_the_padding():
    layer = al.LocalAttention("monotonic", window=2, score_mode="dot")
    positions = np.array([[0, 4, 8], [0, 5, 8]], "float32")
    _, weights, _ = run(
        layer, query=Q[:, :3], value_mask=VALUE_MASK, positions=positions
    )
    support = (weights > 0).astype(int)
    # Row 0 (S = 9): [0, 2], [2, 6], [6, 8]; row 1 (S = 6): [0, 2], [3, 5], none.
    np.testing.assert_array_equal(support[0, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(support[0, 1], [0, 0, 1, 1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(support[0, 2], [0, 0, 0, 0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(support[1, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(support[1, 1], [0, 0, 0, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(support[1, 2], 0)  # window all padding
    np.testing.assert_allclose(weights[:, :2].sum(-1), 1.0, rtol=1e-5)


def test_local_p_uses_the_real_length():
    """Padding (with garbage) after S real positions changes nothing: p_t comes
    from S, and the window stops at the padding."""
    layer = al.LocalAttention("predictive", window=2, score_mode="general")
    run(layer)
    set_predictive(layer, 2 * np.eye(DQ, dtype="float32"), np.full(DQ, 2, "float32"))
    # Queries whose p_t sweep the source from start to end.
    query = (0.1 * Q + np.linspace(-1, 1, TQ)[:, None]).astype("float32")
    short = run(layer, query=query, key=K[:, :6], value=V[:, :6])
    padded_k, padded_v = K.copy(), V.copy()
    padded_k[:, 6:] = 1e4
    padded_v[:, 6:] = np.nan
    mask = np.zeros((B, TV), bool)
    mask[:, :6] = True
    padded = run(layer, query=query, key=padded_k, value=padded_v, value_mask=mask)
    np.testing.assert_allclose(padded[2], short[2], rtol=1e-6)
    assert (padded[2] + 2 >= 6).any()  # some windows reach the padding
    np.testing.assert_allclose(padded[1][..., :6], short[1], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(padded[1][..., 6:], 0.0)
    np.testing.assert_allclose(padded[0], short[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["monotonic", "predictive"])
def test_single_step_equals_the_row_of_all_steps(mode):
    layer = al.LocalAttention(mode, window=2, score_mode="concat", units=5)
    all_steps = run(layer, value_mask=VALUE_MASK)
    for t in range(TQ):
        extra = {}
        if mode == "monotonic":
            extra["positions"] = np.full((B,), t, "int32")
        one = run(layer, query=Q[:, t], value_mask=VALUE_MASK, **extra)
        for got, want in zip(one, all_steps, strict=True):
            np.testing.assert_allclose(got, want[:, t], rtol=1e-5, atol=1e-6)


def test_outputs_follow_the_flags():
    layer = al.LocalAttention("predictive", window=2)
    assert tuple(layer(Q, V, key=K).shape) == (B, TQ, DV)
    context, p = layer(Q[:, 0], V, key=K, return_positions=True)
    assert tuple(context.shape) == (B, DV) and tuple(p.shape) == (B,)
    context, weights = layer(Q[:, 0], V, key=K, return_attention_scores=True)
    assert tuple(weights.shape) == (B, TV)


# -- learning p_t ------------------------------------------------------------------
def gradients(layer, loss_fn, variables):
    """Gradients of ``loss_fn()`` w.r.t. ``variables``, on TF or JAX."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = loss_fn()
        return [to_numpy(g) for g in tape.gradient(loss, variables)]
    import jax

    def f(*values):
        with keras.StatelessScope(
            state_mapping=list(zip(variables, values, strict=True))
        ):
            return loss_fn()

    values = [v.value for v in variables]
    grads = jax.grad(f, argnums=tuple(range(len(values))))(*values)
    return [np.asarray(g) for g in grads]


def test_gradients_reach_w_p_and_v_p():
    layer = al.LocalAttention("predictive", window=2, score_mode="dot", units=3)
    run(layer)
    w_p = RNG.normal(size=(DQ, 3))
    v_p = RNG.normal(size=(3,))
    set_predictive(layer, w_p.astype("float32"), v_p.astype("float32"))
    r = RNG.normal(size=(B, TQ, DV))

    def loss():
        return keras.ops.sum(layer(Q, V, key=K) * r.astype("float32"))

    g_w, g_v = gradients(layer, loss, [layer.W_p, layer.v_p])
    assert np.abs(g_w).max() > 0 and np.abs(g_v).max() > 0

    # Central differences of the numpy reference (float64).
    scores = np.einsum("bqd,bvd->bqv", Q, K).astype("float64")
    length = np.full(B, float(TV))

    def reference_loss(w, v):
        p = predicted_positions(Q.astype("float64"), w, v, length)
        return ((local_reference(scores, p, 2, gaussian=True) @ V) * r).sum()

    eps = 1e-6
    for i in range(3):
        dv = np.zeros(3)
        dv[i] = eps
        fd = (reference_loss(w_p, v_p + dv) - reference_loss(w_p, v_p - dv)) / (2 * eps)
        np.testing.assert_allclose(g_v[i], fd, rtol=1e-3, atol=1e-4)
    dw = np.zeros_like(w_p)
    dw[1, 2] = eps
    fd = (reference_loss(w_p + dw, v_p) - reference_loss(w_p - dw, v_p)) / (2 * eps)
    np.testing.assert_allclose(g_w[1, 2], fd, rtol=1e-3, atol=1e-4)


# -- errors ----------------------------------------------------------------------
def test_location_score_is_rejected():
    assert_clear_error(
        al.LocalAttention,
        "score_mode",
        lambda: al.LocalAttention(score_mode="location"),
    )


def test_monotonic_single_step_needs_positions():
    layer = al.LocalAttention("monotonic", window=2)
    assert_clear_error(al.LocalAttention, "positions", lambda: layer(Q[:, 0], V))


def test_bad_positions():
    layer = al.LocalAttention("monotonic", window=2)
    bad = np.zeros((B, TQ + 1), "float32")
    assert_clear_error(
        al.LocalAttention, "positions", lambda: layer(Q, V, positions=bad)
    )
    predictive = al.LocalAttention("predictive", window=2)
    assert_clear_error(
        al.LocalAttention,
        "positions",
        lambda: predictive(Q, V, positions=np.zeros((B, TQ), "float32")),
    )
