"""BiDAF attention flow, the span pointer, best_span and span_loss: formulas by
hand, masks, numerics, a tiny extractive task, and the contract clauses that fit.

`BidirectionalAttentionFlow` is a query/value layer, but it returns two
attentions (``c2q`` ``[B, T, J]`` and ``q2c`` ``[B, T]``), and its output ``G``
is more than a context. It runs the contract (tests/contract.py) through
`BidafCase`, whose ``weights`` are ``c2q``:

* config round trip, ``.keras`` file, distinct initial weights, implicit
  mask, fully masked row (with ``output_is_context=False``: a fully masked
  question leaves ``h_t`` in ``G``), NaN in masked positions, dropout, XLA
  training, MirroredStrategy, ``mixed_bfloat16``: the contract's own checks;
* ``q2c``: checked here by hand, under padding, NaN and fully masked rows,
  and served without the library;
* SavedModel without the library: here, with ``q2c`` and a whole span model
  in the same process; the same numbers on JAX (clause 7) likewise;
* ``mixed_float16``: written here. The scores and softmaxes are float32, but
  ``G`` holds products ``h_t * U~_t`` in float16, which overflow at the
  contract's 300x scale (``|h| |u| > 65504``); the attentions and
  ``[h; U~]`` are checked there, the whole ``G`` at 30x;
* bad input: written here: the contract's check passes ``key``, which this
  layer does not take (the question is its own key).

Clauses that cannot apply to it: the causal mask (no ``use_causal_mask``: a
passage-to-question alignment has no order to respect).

`SpanPointer` runs as a ``"pool"`` `SpanCase` (``output`` the start logits,
``weights`` the end logits): config, ``.keras`` file, distinct initial
weights, implicit mask, NaN in masked positions, XLA training and
MirroredStrategy are the contract's; its masked logits are ``NEG_INF``, not
zero, and its outputs float32 under every policy, so the fully masked row,
mixed precision and bad input are written here. It has no dropout and no
causal mask.
"""

import json
import os
import subprocess
import sys
import time
from functools import partial

import keras
import numpy as np
import pytest
from keras import ops

import attention_layers as al
from attention_layers.masking import NEG_INF
from tests import contract

B, T, J, D = 3, 5, 4, 3


def np_(x):
    return keras.ops.convert_to_numpy(x)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def masked_softmax(x, mask, axis=-1):
    x = np.where(mask, x, -np.inf)
    top = np.max(np.where(mask, x, -np.inf), axis, keepdims=True)
    e = np.where(mask, np.exp(x - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = e.sum(axis, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)


def jit(fn):
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn, jit_compile=True)


def reference(h, u, w, passage_mask=None, question_mask=None):
    """The paper's formulas in float64 numpy, with the concatenation built:
    ``(S, c2q, q2c, G)``."""
    h, u, w = (np.asarray(x, "float64") for x in (h, u, w))
    b, t, d = h.shape
    pm = np.ones((b, t), bool) if passage_mask is None else passage_mask
    qm = np.ones(u.shape[:2], bool) if question_mask is None else question_mask
    h = np.where(pm[..., None], h, 0.0)
    u = np.where(qm[..., None], u, 0.0)
    s = np.zeros((b, t, u.shape[1]))
    for i in range(b):
        for k in range(t):
            for j in range(u.shape[1]):
                s[i, k, j] = w @ np.concatenate([h[i, k], u[i, j], h[i, k] * u[i, j]])
    pair = pm[:, :, None] & qm[:, None, :]
    c2q = masked_softmax(s, pair)
    best = np.where(pair, s, -np.inf).max(-1)
    q2c = masked_softmax(np.where(pair.any(-1), best, 0.0), pair.any(-1))
    attended = c2q @ u
    summary = np.einsum("bt,btd->bd", q2c, h)[:, None]
    g = np.concatenate([h, attended, h * attended, h * summary], -1)
    g = np.where(pm[..., None], g, 0.0)
    return s, c2q, q2c, g


def inputs(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    h = (scale * rng.normal(size=(B, T, D))).astype("float32")
    u = (scale * rng.normal(size=(B, J, D))).astype("float32")
    return h, u


def masks():
    """Row 0: a fully masked question; row 1: padding in both; row 2: a fully
    masked passage."""
    pm = np.ones((B, T), bool)
    qm = np.ones((B, J), bool)
    qm[0] = False
    pm[1, -2:] = False
    qm[1, -1] = False
    pm[2] = False
    return pm, qm


def bidaf(h, u, seed=3, **kwargs):
    layer = al.BidirectionalAttentionFlow(**kwargs)
    layer(h, u)
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(size=(3 * D,)).astype("float32")])
    return layer


def weight_gradients(layer, loss_of_outputs, **call_kwargs):
    """Gradients of ``loss_of_outputs(layer(**call_kwargs))`` with respect to
    the layer's trainable weights, as numpy arrays."""
    if keras.backend.backend() == "jax":
        import jax

        def loss(weights):
            out, _ = layer.stateless_call(weights, [], **call_kwargs)
            return loss_of_outputs(out)

        weights = [v.value for v in layer.trainable_variables]
        return [np_(g) for g in jax.grad(loss)(weights)]
    import tensorflow as tf

    with tf.GradientTape() as tape:
        value = loss_of_outputs(layer(**call_kwargs))
    return [np_(g) for g in tape.gradient(value, layer.trainable_weights)]


# -- BidirectionalAttentionFlow: the formulas by hand ------------------------------
def test_tiny_example_by_hand():
    """d = 1, w = [1, 2, 3]: S_tj = h_t + 2 u_j + 3 h_t u_j."""
    h = np.array([[[1.0], [2.0]]], "float32")
    u = np.array([[[0.0], [1.0]]], "float32")
    layer = al.BidirectionalAttentionFlow()
    layer(h, u)
    layer.set_weights([np.array([1.0, 2.0, 3.0], "float32")])
    np.testing.assert_allclose(np_(layer.score(h, u)), [[[1.0, 6.0], [2.0, 10.0]]])
    g, (c2q, q2c) = layer(h, u, return_attention_scores=True)
    a = np.array([softmax(np.array([1.0, 6.0])), softmax(np.array([2.0, 10.0]))])
    b = softmax(np.array([6.0, 10.0]))  # max_j S_tj
    np.testing.assert_allclose(np_(c2q)[0], a, rtol=1e-5)
    np.testing.assert_allclose(np_(q2c)[0], b, rtol=1e-5)
    attended = a[:, 1:2]  # sum_j a_tj u_j with u = [0, 1]
    summary = b @ h[0]  # [1]
    want = np.concatenate([h[0], attended, h[0] * attended, h[0] * summary], -1)
    np.testing.assert_allclose(np_(g)[0], want, rtol=1e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_similarity_attentions_and_output_match_numpy(masked):
    h, u = inputs()
    pm, qm = masks() if masked else (None, None)
    layer = bidaf(h, u)
    w = layer.get_weights()[0]
    s_want, c2q_want, q2c_want, g_want = reference(h, u, w, pm, qm)
    np.testing.assert_allclose(
        np_(layer.score(h, u)), reference(h, u, w)[0], rtol=1e-5, atol=1e-6
    )
    g, (c2q, q2c) = layer(
        h, u, query_mask=pm, value_mask=qm, return_attention_scores=True
    )
    np.testing.assert_allclose(np_(c2q), c2q_want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np_(q2c), q2c_want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np_(g), g_want, rtol=1e-5, atol=1e-6)
    assert tuple(g.shape) == (B, T, 4 * D)


def test_fully_masked_question_or_passage_gives_zeros():
    h, u = inputs()
    pm, qm = masks()
    layer = bidaf(h, u)
    g, (c2q, q2c) = layer(
        h, u, query_mask=pm, value_mask=qm, return_attention_scores=True
    )
    g, c2q, q2c = np_(g), np_(c2q), np_(q2c)
    for x in (g, c2q, q2c):
        assert np.isfinite(x).all()
    # Row 0, no question: no attention either way; G = [h; 0; 0; 0].
    assert (c2q[0] == 0).all() and (q2c[0] == 0).all()
    np.testing.assert_array_equal(g[0, :, :D], h[0])
    assert (g[0, :, D:] == 0).all()
    # Row 2, no passage: everything is zero.
    assert (g[2] == 0).all() and (c2q[2] == 0).all() and (q2c[2] == 0).all()
    # Row 1: padding gets nothing, the rest sums to 1.
    assert (g[1, -2:] == 0).all() and (c2q[1, -2:] == 0).all()
    assert (c2q[1, :, -1] == 0).all() and (q2c[1, -2:] == 0).all()
    np.testing.assert_allclose(c2q[1, :-2].sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(q2c[1].sum(), 1.0, rtol=1e-6)
    # Finite gradients through the fully masked rows.
    grads = weight_gradients(
        layer,
        lambda out: ops.sum(out[0]) + ops.sum(out[1][0]) + ops.sum(out[1][1]),
        query=h,
        value=u,
        query_mask=pm,
        value_mask=qm,
        return_attention_scores=True,
    )
    assert all(np.isfinite(g).all() for g in grads)


def test_padding_and_nan_under_it_change_nothing():
    """Longer inputs whose extra positions hold NaN, masked, give the same
    numbers on the real positions as the short inputs without masks."""
    h, u = inputs()
    layer = bidaf(h, u)
    want = layer(h, u, return_attention_scores=True)
    want = (np_(want[0]), np_(want[1][0]), np_(want[1][1]))
    hp = np.concatenate([h, np.full((B, 2, D), np.nan, "float32")], 1)
    up = np.concatenate([u, np.full((B, 3, D), np.inf, "float32")], 1)
    pm = np.arange(T + 2)[None] < np.full((B, 1), T)
    qm = np.arange(J + 3)[None] < np.full((B, 1), J)
    g, (c2q, q2c) = layer(
        hp, up, query_mask=pm, value_mask=qm, return_attention_scores=True
    )
    g, c2q, q2c = np_(g), np_(c2q), np_(q2c)
    assert np.isfinite(g).all() and np.isfinite(c2q).all() and np.isfinite(q2c).all()
    np.testing.assert_allclose(g[:, :T], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(c2q[:, :T, :J], want[1], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(q2c[:, :T], want[2], rtol=1e-6, atol=1e-7)
    assert (g[:, T:] == 0).all() and (c2q[:, :, J:] == 0).all()
    assert (q2c[:, T:] == 0).all()
    grads = weight_gradients(
        layer,
        lambda out: ops.sum(out),
        query=hp,
        value=up,
        query_mask=pm,
        value_mask=qm,
    )
    assert all(np.isfinite(g).all() for g in grads)


def test_output_keeps_the_passage_mask():
    """Keras fills both masks from Embedding(mask_zero=True), and G carries the
    passage mask on to the next layer."""
    passage = keras.Input((T,), dtype="int32")
    question = keras.Input((J,), dtype="int32")
    emb = keras.layers.Embedding(10, D, mask_zero=True)
    g = al.BidirectionalAttentionFlow()(emb(passage), emb(question))
    pooled = al.AttentionPooling(units=4)(g)  # honours the mask it receives
    model = keras.Model([passage, question], [g, pooled])
    p = np.array([[1, 2, 3, 0, 0]] * B, "int32")
    q = np.array([[4, 5, 0, 0]] * B, "int32")
    out_g, out_pool = model([p, q])
    assert (np_(out_g)[:, 3:] == 0).all()
    layer = model.layers[-1]
    explicit = layer(np_(out_g), mask=p != 0)
    np.testing.assert_allclose(np_(out_pool), np_(explicit), rtol=1e-6)


# -- BidirectionalAttentionFlow: the contract clauses ---------------------------------
class BidafCase(contract.Case):
    """The layer as a `contract.Case`: ``weights`` are the context-to-query
    attention ``c2q``."""

    def call(self, layer, arrays, masks=None, return_attention_scores=False, **kw):
        out = layer(
            **arrays,
            **(masks or {}),
            return_attention_scores=return_attention_scores,
            **kw,
        )
        if return_attention_scores:
            g, (c2q, _) = out
            return g, c2q
        return out


BIDAF = BidafCase(
    "bidirectional_attention_flow",
    al.BidirectionalAttentionFlow,
    query_dim=4,
    value_dim=4,
    output_is_context=False,
    bad_ctor=[({"dropout": 1.5}, "dropout")],
)
BIDAF_DROPOUT = BidafCase(
    "bidirectional_attention_flow_dropout",
    partial(al.BidirectionalAttentionFlow, dropout=0.5, seed=1),
    query_dim=4,
    value_dim=4,
    output_is_context=False,
    deterministic_training=False,
)


@pytest.mark.parametrize(
    "check",
    [
        contract.check_config,
        contract.check_distinct_initial_weights,
        contract.check_implicit_mask,
        contract.check_fully_masked_row,
        contract.check_nan_in_masked_positions,
        contract.check_jit_training,
        partial(contract.check_mixed_precision, policy="mixed_bfloat16"),
    ],
    ids=lambda c: getattr(c, "__name__", None) or c.func.__name__ + "_bfloat16",
)
def test_bidaf_contract(check):
    check(BIDAF)


def test_bidaf_keras_file_round_trip(tmp_path):
    contract.check_keras_file(BIDAF, str(tmp_path))


def test_bidaf_dropout_acts_in_training_only():
    contract.check_dropout(BIDAF_DROPOUT)
    # q2c is dropped too, and masked passage positions keep zero weight.
    h, u = inputs()
    pm, qm = masks()
    layer = al.BidirectionalAttentionFlow(dropout=0.5, seed=1)
    _, (_, q2c) = layer(
        h, u, query_mask=pm, value_mask=qm, return_attention_scores=True
    )
    out, (c2q_t, q2c_t) = layer(
        h, u, query_mask=pm, value_mask=qm, return_attention_scores=True, training=True
    )
    assert np.isfinite(np_(out)).all()
    np.testing.assert_allclose(np_(q2c).sum(-1)[1], 1.0, rtol=1e-6)
    assert (np_(q2c_t)[1, -2:] == 0).all() and (np_(q2c_t)[0] == 0).all()


@pytest.mark.tf_only
def test_bidaf_mirrored_strategy_equals_one_device():
    contract.check_mirrored_strategy(BIDAF)


def test_bidaf_mixed_float16():
    h, u = inputs()
    pm, qm = masks()
    reference_layer = bidaf(h, u)
    layer = al.BidirectionalAttentionFlow(dtype="mixed_float16")
    layer(h, u)
    layer.set_weights(reference_layer.get_weights())
    assert all(w.dtype == "float32" for w in layer.weights)
    kwargs = {"query_mask": pm, "value_mask": qm, "return_attention_scores": True}
    g, (c2q, q2c) = layer(h, u, **kwargs)
    for x in (g, c2q, q2c):
        assert keras.backend.standardize_dtype(x.dtype) == "float16"
    want = reference(h, u, reference_layer.get_weights()[0], pm, qm)
    for got, expected in zip((c2q, q2c, g), want[1:], strict=True):
        got = np_(ops.cast(got, "float32"))
        np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-2)
    # 300x: the scores are float32, the attentions finite and normalised, the
    # passage and its attended question finite (their products may overflow).
    big_h, big_u = inputs(scale=300.0)
    g, (c2q, q2c) = layer(big_h, big_u, **kwargs)
    g, c2q, q2c = (np_(ops.cast(x, "float32")) for x in (g, c2q, q2c))
    assert np.isfinite(c2q).all() and np.isfinite(q2c).all()
    np.testing.assert_allclose(c2q[1, :-2].sum(-1), 1.0, atol=2e-2)
    np.testing.assert_allclose(q2c[1].sum(), 1.0, atol=2e-2)
    assert np.isfinite(g[..., : 2 * D]).all()
    # 30x: all of G is finite.
    g = layer(*inputs(scale=30.0), query_mask=pm, value_mask=qm)
    assert np.isfinite(np_(ops.cast(g, "float32"))).all()


def test_bidaf_bad_input_raises_clear_errors():
    err = contract.assert_clear_error
    cls = al.BidirectionalAttentionFlow
    h, u = inputs()
    pm, qm = masks()

    def call(**changes):
        kwargs = {"query": h, "value": u, **changes}
        return lambda: al.BidirectionalAttentionFlow()(**kwargs)

    err(cls, "query", call(query=h[:, 0]))  # rank 2: BiDAF reads a whole passage
    err(cls, "query", call(query=h.astype("int32")))
    err(cls, "value", call(value=u[0]))
    err(cls, "value", call(value=u[:2]))  # batch
    err(cls, "value", call(value=u[..., :-1]))  # d differs from the passage's
    err(cls, "value_mask", call(value_mask=qm[:, :-1]))
    err(cls, "query_mask", call(query_mask=pm[:, None]))
    err(cls, "dropout", lambda: cls(dropout=1.5))
    layer = bidaf(h, u)
    err(cls, "query", lambda: layer(np.ones((B, T, D + 1), "float32"), u[..., :1]))
    err(
        cls,
        "query",
        lambda: layer(np.ones((B, T, D + 1), "float32"), np.ones((B, J, D + 1))),
    )


# -- SpanPointer ----------------------------------------------------------------------
F, F2 = 6, 4


def pointer_feed(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    mask = np.ones((B, T), bool)
    mask[0] = False
    mask[1, -2:] = False
    return {
        "inputs": (scale * rng.normal(size=(B, T, F))).astype("float32"),
        "end_inputs": (scale * rng.normal(size=(B, T, F2))).astype("float32"),
        "mask": mask,
    }


def test_span_pointer_by_hand():
    f = pointer_feed()
    layer = al.SpanPointer()
    start, end = layer(**f)
    w1, w2 = (np.asarray(w, "float64") for w in layer.get_weights())
    assert w1.shape == (F,) and w2.shape == (F2,)
    mask = f["mask"]
    want_start = np.where(mask, f["inputs"] @ w1, NEG_INF)
    want_end = np.where(mask, f["end_inputs"] @ w2, NEG_INF)
    for got, want in ((start, want_start), (end, want_end)):
        assert keras.backend.standardize_dtype(got.dtype) == "float32"
        np.testing.assert_allclose(np_(got), want, rtol=1e-5, atol=1e-6)
    assert (np_(start)[~mask] == NEG_INF).all()  # exactly, and finite
    # end_inputs defaults to inputs, with its own kernel w_2.
    layer = al.SpanPointer()
    start, end = layer(f["inputs"])
    w1, w2 = layer.get_weights()
    assert w2.shape == (F,) and not np.array_equal(w1, w2)
    np.testing.assert_allclose(np_(end), f["inputs"] @ w2, rtol=1e-5, atol=1e-6)


def test_span_pointer_nan_under_padding_does_not_leak():
    f = pointer_feed()
    layer = al.SpanPointer()
    want = [np_(x) for x in layer(**f)]
    dirty = {**f}
    for name in ("inputs", "end_inputs"):
        dirty[name] = np.where(f["mask"][..., None], f[name], np.nan).astype("float32")
    got = [np_(x) for x in layer(**dirty)]
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    grads = weight_gradients(
        layer,
        lambda out: ops.sum(ops.softmax(out[0])[1:]) + ops.sum(out[1][1:, :2]),
        **dirty,
    )
    assert all(np.isfinite(g).all() for g in grads)


def test_span_pointer_masks_from_keras_with_both_inputs():
    """With one tensor argument Keras fills ``mask``; with end_inputs too it
    fills ``inputs_mask``; either way the padding is masked."""
    ids = keras.Input((T,), dtype="int32")
    x = keras.layers.Embedding(10, F, mask_zero=True)(ids)
    y = keras.layers.Dense(F2)(x)  # Dense passes the mask on
    one = al.SpanPointer()
    two = al.SpanPointer()
    start_1, end_1 = one(x)
    start_2, end_2 = two(x, y)
    head = keras.layers.Dense(1)  # a layer after the pointer: no mask reaches it
    model = keras.Model(ids, [start_1, end_2, head(ops.expand_dims(start_2, -1))])
    feed = np.array([[1, 2, 3, 0, 0], [4, 0, 0, 0, 0], [1, 1, 1, 1, 1]], "int32")
    s1, e2, _ = (np_(t) for t in model(feed))
    for logits in (s1, e2):
        assert (logits[feed == 0] == NEG_INF).all()
        assert (logits[feed != 0] > NEG_INF / 2).all()


class SpanCase(contract.Case):
    """`SpanPointer` as a ``"pool"`` case: ``output`` the start logits,
    ``weights`` the end logits; without ``return_attention_scores`` the two
    pointer distributions ``[B, T, 2]`` (what the XLA and distribution
    clauses train)."""

    def call(self, layer, arrays, masks=None, return_attention_scores=False, **kw):
        start, end = layer(**arrays, **(masks or {}), **kw)
        if return_attention_scores:
            return start, end
        return ops.stack([ops.softmax(start), ops.softmax(end)], -1)


SPAN = SpanCase("span_pointer", al.SpanPointer, value_dim=F, kind="pool")


@pytest.mark.parametrize(
    "check",
    [
        contract.check_config,
        contract.check_distinct_initial_weights,
        contract.check_implicit_mask,
        contract.check_nan_in_masked_positions,
        contract.check_jit_training,
    ],
    ids=lambda c: c.__name__,
)
def test_span_pointer_contract(check):
    check(SPAN)


def test_span_pointer_keras_file_round_trip(tmp_path):
    contract.check_keras_file(SPAN, str(tmp_path))


@pytest.mark.tf_only
def test_span_pointer_mirrored_strategy_equals_one_device():
    contract.check_mirrored_strategy(SPAN)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_span_pointer_mixed_precision_gives_float32_logits(policy):
    f = pointer_feed()
    reference_layer = al.SpanPointer()
    want = [np_(x) for x in reference_layer(**f)]
    layer = al.SpanPointer(dtype=policy)
    layer(**f)
    layer.set_weights(reference_layer.get_weights())
    assert all(w.dtype == "float32" for w in layer.weights)
    got = layer(**f)
    tol = 2e-2 if policy == "mixed_float16" else 6e-2
    for a, b in zip(got, want, strict=True):
        assert keras.backend.standardize_dtype(a.dtype) == "float32"
        np.testing.assert_allclose(np_(a), b, rtol=tol, atol=tol)
    for x in layer(**pointer_feed(scale=300.0)):
        assert np.isfinite(np_(x)).all()


def test_span_pointer_bad_input_raises_clear_errors():
    err = contract.assert_clear_error
    cls = al.SpanPointer
    f = pointer_feed()

    def call(**changes):
        return lambda: al.SpanPointer()(**{**f, **changes})

    err(cls, "inputs", call(inputs=f["inputs"][:, 0]))
    err(cls, "inputs", call(inputs=f["inputs"].astype("int32")))
    err(cls, "end_inputs", call(end_inputs=f["end_inputs"][:, 0]))
    err(cls, "end_inputs", call(end_inputs=f["end_inputs"][:, :-1]))  # length
    err(cls, "end_inputs", call(end_inputs=f["end_inputs"][:2]))  # batch
    err(cls, "end_inputs", call(end_inputs=f["end_inputs"].astype("int32")))
    err(cls, "mask", call(mask=f["mask"][:, :-1]))
    layer = al.SpanPointer()
    layer(**f)
    err(cls, "inputs", lambda: layer(**{**f, "inputs": f["inputs"][..., :-1]}))
    err(cls, "end_inputs", lambda: layer(f["inputs"]))  # built with F2, not F


# -- best_span and span_loss -----------------------------------------------------------
def brute_force_span(start_logits, end_logits, max_span_length, mask):
    """The best (i, j) by a double loop, first best kept on ties."""
    out = []
    for s, e, m in zip(start_logits, end_logits, mask, strict=True):
        best = (0, 0, np.float32(NEG_INF))
        found = False
        for i in range(len(s)):
            for j in range(i, min(len(s), i + max_span_length)):
                if m[i] and m[j]:
                    score = np.float32(s[i]) + np.float32(e[j])
                    if not found or score > best[2]:
                        best, found = (i, j, score), True
        out.append(best)
    return [np.array(x) for x in zip(*out, strict=True)]


def span_logits(seed=0, batch=6, length=7):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(batch, length)).astype("float32")
    e = rng.normal(size=(batch, length)).astype("float32")
    mask = rng.random((batch, length)) < 0.7
    mask[0] = False  # nothing to pick
    mask[1] = True
    mask[2, 1:] = False  # one word
    # NaN under the mask never matters.
    return np.where(mask, s, np.nan), np.where(mask, e, np.nan), mask


@pytest.mark.parametrize("compiled", [False, True])
def test_best_span_matches_a_brute_force_search(compiled):
    s, e, mask = span_logits()
    length = s.shape[1]
    for max_span_length in range(1, length + 2):
        fn = partial(al.best_span, max_span_length=max_span_length)
        if compiled:
            fn = jit(fn)
        start, end, score = (np_(x) for x in fn(s, e, mask=mask))
        assert start.dtype == np.int32 and end.dtype == np.int32
        assert score.dtype == np.float32
        want = brute_force_span(s, e, max_span_length, mask)
        np.testing.assert_array_equal(start, want[0], err_msg=str(max_span_length))
        np.testing.assert_array_equal(end, want[1], err_msg=str(max_span_length))
        np.testing.assert_allclose(score, want[2], rtol=1e-6)
        assert (end >= start).all() and (end - start < max_span_length).all()
        assert (start[0], end[0], score[0]) == (0, 0, NEG_INF)
    # Without a mask every position counts.
    s, e, _ = span_logits(seed=1)
    s, e = np.nan_to_num(s), np.nan_to_num(e)
    everything = np.ones(s.shape, bool)
    for max_span_length in (1, 3, 7):
        got = [np_(x) for x in al.best_span(s, e, max_span_length)]
        want = brute_force_span(s, e, max_span_length, everything)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.tf_only
def test_best_span_with_unknown_lengths_in_a_graph():
    import tensorflow as tf

    s, e, mask = span_logits(seed=2)
    spec = tf.TensorSpec((None, None), tf.float32)
    fn = tf.function(
        lambda s, e, m: al.best_span(s, e, 3, mask=m),
        input_signature=[spec, spec, tf.TensorSpec((None, None), tf.bool)],
    )
    got = [np_(x) for x in fn(s, e, mask)]
    want = brute_force_span(s, e, 3, mask)
    for a, b in zip(got[:2], want[:2], strict=True):
        np.testing.assert_array_equal(a, b)


def test_span_loss_by_hand():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(B, T)).astype("float32")
    e = rng.normal(size=(B, T)).astype("float32")
    start, end = np.array([0, 2, 4]), np.array([1, 2, 4])
    got = np_(al.span_loss(s, e, start, end))
    log_p1 = s - np.log(np.exp(s.astype("float64")).sum(-1, keepdims=True))
    log_p2 = e - np.log(np.exp(e.astype("float64")).sum(-1, keepdims=True))
    want = -log_p1[np.arange(B), start] - log_p2[np.arange(B), end]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got.dtype == np.float32 and got.shape == (B,)
    # [B, 1] targets, and the mean is the two cross-entropies' sum.
    np.testing.assert_allclose(
        np_(al.span_loss(s, e, start[:, None], end[:, None])), want, rtol=1e-5
    )
    cce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    np.testing.assert_allclose(
        float(np_(cce(start, s)) + np_(cce(end, e))), want.mean(), rtol=1e-5
    )
    # Masked logits (NEG_INF, or -inf) keep it finite.
    s[:, -1], e[:, -1] = NEG_INF, -np.inf
    got = np_(al.span_loss(s, e, start, np.array([4, 4, 4])))
    assert np.isfinite(got).all() and (got > 1e8).all()
    got = np_(al.span_loss(s, e, start, end))
    assert np.isfinite(got[:2]).all() and got[:2].max() < 100


def test_span_functions_bad_input_raise_clear_errors():
    s, e, mask = span_logits()

    def err(function, argument, fn):
        try:
            fn()
        except ValueError as error:
            msg = str(error)
        else:
            raise AssertionError(f"no ValueError for bad `{argument}`")
        for part in (function, f"`{argument}`", "expected", "received"):
            assert part in msg, f"{part!r} missing from: {msg}"

    for bad in (0, -1, 2.0, True, None):
        err("best_span", "max_span_length", lambda b=bad: al.best_span(s, e, b))
    err("best_span", "start_logits", lambda: al.best_span(s[0], e, 2))
    err("best_span", "end_logits", lambda: al.best_span(s, e[:, :-1], 2))
    ints = np.nan_to_num(s).astype("int32")
    err("best_span", "start_logits", lambda: al.best_span(ints, e, 2))
    err("best_span", "mask", lambda: al.best_span(s, e, 2, mask=mask[:, :-1]))
    start = np.zeros(len(s), "int32")
    err("span_loss", "start", lambda: al.span_loss(s, e, start[:-1], start))
    err("span_loss", "end", lambda: al.span_loss(s, e, start, start.astype("float32")))
    err("span_loss", "end", lambda: al.span_loss(s, e, start, np.zeros((len(s), 2))))
    err("span_loss", "end_logits", lambda: al.span_loss(s, e[:, :3], start, start))


# -- a tiny extractive task ------------------------------------------------------------
MARKERS, VOCAB, P_LEN, Q_LEN, ANSWER = 3, 24, 12, 3, 2


def qa_data(n, seed):
    """Passages of random words holding every marker once; the question names
    one marker (among filler words), and the answer is the ANSWER words right
    after that marker in the passage. Passages have 9 to 12 words (0 pads)."""
    rng = np.random.default_rng(seed)
    first = MARKERS + 1  # ids 1..MARKERS are the markers
    passages = rng.integers(first, VOCAB, size=(n, P_LEN))
    questions = rng.integers(first, VOCAB, size=(n, Q_LEN))
    starts = np.zeros(n, "int32")
    for k in range(n):
        length = rng.integers(9, P_LEN + 1)
        passages[k, length:] = 0
        while True:  # markers anywhere, none inside another's answer
            slots = rng.choice(length - ANSWER, MARKERS, replace=False)
            if np.diff(np.sort(slots)).min() > ANSWER:
                break
        for m, slot in enumerate(slots):
            passages[k, slot] = m + 1
        asked = rng.integers(MARKERS)
        questions[k, rng.integers(Q_LEN)] = asked + 1
        starts[k] = slots[asked] + 1
    x = {"passage": passages.astype("int32"), "question": questions.astype("int32")}
    return x, {"start": starts, "end": starts + ANSWER - 1}


def qa_model(dim=16):
    """Embeddings, a convolution for the neighbours, BiDAF, a convolution as
    the modelling layer, the pointer. Masks are passed explicitly (Conv1D
    does not take Keras masks)."""
    passage = keras.Input((P_LEN,), dtype="int32", name="passage")
    question = keras.Input((Q_LEN,), dtype="int32", name="question")
    emb = keras.layers.Embedding(VOCAB, dim)
    encode = keras.layers.Conv1D(dim, 3, padding="same", activation="tanh")
    p_mask, q_mask = ops.not_equal(passage, 0), ops.not_equal(question, 0)
    h, u = encode(emb(passage)), encode(emb(question))
    g = al.BidirectionalAttentionFlow()(h, u, query_mask=p_mask, value_mask=q_mask)
    m = keras.layers.Conv1D(dim, 3, padding="same", activation="tanh")(g)
    m2 = keras.layers.Conv1D(dim, 3, padding="same", activation="tanh")(m)
    cat = keras.layers.Concatenate()
    start, end = al.SpanPointer()(cat([g, m]), cat([g, m2]), mask=p_mask)
    return keras.Model([passage, question], {"start": start, "end": end})


def exact_match(model, x, y):
    out = model.predict(x, verbose=0)
    start, end, _ = al.best_span(
        out["start"], out["end"], ANSWER + 1, mask=x["passage"] != 0
    )
    start, end = np_(start), np_(end)
    return float(np.mean((start == y["start"]) & (end == y["end"])))


@pytest.mark.slow  # 15 to 30 s on two CPU cores: make test-slow
def test_tiny_extractive_task_is_learned_with_jit_compile():
    keras.utils.set_random_seed(1)
    model = qa_model()
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss={
            "start": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "end": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        },
        jit_compile=True,
    )
    x, y = qa_data(1000, seed=0)
    x_test, y_test = qa_data(200, seed=1)
    chance = 1.0 / (P_LEN * (ANSWER + 1))
    before = exact_match(model, x_test, y_test)
    began = time.perf_counter()
    history = model.fit(x, y, batch_size=20, epochs=5, verbose=0)
    took = time.perf_counter() - began
    assert np.isfinite(history.history["loss"]).all()
    after = exact_match(model, x_test, y_test)
    # Picking one of the three markers blindly would match a third of the time.
    assert after > 0.6 and after > 10 * chance, (before, after, took)
    # The loss of the two pointers is span_loss.
    out = model.predict(x_test, verbose=0)
    per_example = np_(al.span_loss(out["start"], out["end"], *y_test.values()))
    total = model.evaluate(x_test, y_test, verbose=0)[0]
    np.testing.assert_allclose(per_example.mean(), total, rtol=1e-4, atol=1e-6)


def test_qa_model_keras_file_round_trip(tmp_path):
    """The whole reader (explicit masks from the ids, BiDAF, the pointer)
    reloads from .keras with no custom_objects."""
    model = qa_model()
    x, _ = qa_data(8, seed=3)
    want = model.predict(x, verbose=0)
    path = os.path.join(tmp_path, "qa.keras")
    model.save(path)
    got = keras.saving.load_model(path).predict(x, verbose=0)
    for name in ("start", "end"):
        np.testing.assert_array_equal(got[name], want[name])


# -- SavedModel served without the library ---------------------------------------------
class PredictedSpan(keras.layers.Layer):
    """`best_span` in a model, for the export: ``[B, 2]`` (start, end)."""

    def call(self, start, end, passage):
        first, last, _ = al.best_span(start, end, 3, mask=ops.not_equal(passage, 0))
        return ops.stack([first, last], -1)


def span_model():
    """Ids in (Keras masks from the embedding), logits and best_span out."""
    passage = keras.Input((P_LEN,), dtype="int32", name="passage")
    question = keras.Input((Q_LEN,), dtype="int32", name="question")
    emb = keras.layers.Embedding(VOCAB, 8, mask_zero=True)
    g = al.BidirectionalAttentionFlow()(emb(passage), emb(question))
    m = keras.layers.GRU(8, return_sequences=True)(g)
    start, end = al.SpanPointer()(g, m)  # Keras fills inputs_mask
    logits = ops.stack([start, end], -1)
    spans = PredictedSpan()(start, end, passage)
    inputs = {"passage": passage, "question": question}
    return keras.Model(inputs, {"output": logits}), keras.Model(
        inputs, {"output": spans}
    )


def attentions_model(case):
    """``[c2q, q2c]`` ``[B, T, J + 1]`` as the output."""
    arrays, case_masks = case.arrays(), case.masks()
    inputs = {k: keras.Input(v.shape[1:], name=k) for k, v in arrays.items()}
    mask_inputs = {
        k: keras.Input(v.shape[1:], name=k, dtype="bool") for k, v in case_masks.items()
    }
    _, (c2q, q2c) = case.make()(**inputs, **mask_inputs, return_attention_scores=True)
    both = ops.concatenate([c2q, ops.expand_dims(q2c, -1)], -1)
    return keras.Model({**inputs, **mask_inputs}, {"output": both})


# One fresh TensorFlow process, 8 to 20 s on two cores: make test-slow.
@pytest.mark.slow
@pytest.mark.tf_only
def test_saved_models_are_served_without_the_library(tmp_path):
    """G, the two attentions, and a whole span model (passage and question
    ids in, logits and best_span out), served in one fresh process."""
    logits, spans = span_model()
    x, _ = qa_data(4, seed=2)
    predicted = spans.predict(x, verbose=0)["output"]
    assert (predicted[:, 1] >= predicted[:, 0]).all()
    out = logits.predict(x, verbose=0)["output"]
    assert (out[x["passage"] == 0] == NEG_INF).all()
    models = {
        "bidaf": (BIDAF.functional_model(BIDAF.make()), BIDAF.feed()),
        "attentions": (attentions_model(BIDAF), BIDAF.feed()),
        "span_logits": (logits, x),
        "span": (spans, x),
    }
    contract.assert_served_without_library(models, tmp_path)


@pytest.mark.tf_only
@pytest.mark.slow  # a second backend in a subprocess
def test_jax_backend_gives_the_same_numbers(tmp_path):
    """The case models and the reader, saved on TensorFlow, predict the same
    numbers on JAX (clause 7 of the contract)."""
    from tests.test_contract import _JAX_PREDICT

    x, _ = qa_data(4, seed=4)
    models = {
        "bidaf": (BIDAF.functional_model(BIDAF.make()), BIDAF.feed()),
        "attentions": (attentions_model(BIDAF), BIDAF.feed()),
        "span_pointer": (SPAN.functional_model(SPAN.make()), SPAN.feed()),
        "reader": (qa_model(), x),
    }
    expected = {}
    for name, (model, feed) in models.items():
        expected[name] = model.predict(feed, verbose=0)
        model.save(tmp_path / f"{name}.keras")
        np.savez(tmp_path / f"{name}.in.npz", **feed)
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-c", _JAX_PREDICT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, want in expected.items():
        got = dict(np.load(tmp_path / f"{name}.jax.npz"))
        assert set(got) == set(want), name
        for key in want:
            np.testing.assert_allclose(
                want[key], got[key], rtol=1e-5, atol=1e-6, err_msg=f"{name}/{key}"
            )


def test_config_keeps_every_argument():
    layer = al.BidirectionalAttentionFlow(
        kernel_initializer="ones", dropout=0.25, seed=3, name="flow"
    )
    config = json.loads(json.dumps(layer.get_config()))
    assert config["dropout"] == 0.25 and config["seed"] == 3
    clone = al.BidirectionalAttentionFlow.from_config(config)
    assert clone.get_config() == layer.get_config()
    pointer = al.SpanPointer(kernel_initializer="zeros", name="pointer")
    config = json.loads(json.dumps(pointer.get_config()))
    assert al.SpanPointer.from_config(config).get_config() == pointer.get_config()
