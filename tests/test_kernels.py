"""The kernels below the layers (`attention_layers.ops`), each alone against
the formula written here in NumPy: every evaluation of the attention times
every mask kind, the choice of ``"auto"`` with the device query substituted,
and the additive score's evaluations. Tiny shapes: the grid runs on every
backend in `make test`."""

import keras
import numpy as np
import pytest

from attention_layers.ops import additive_score, attention, devices, tiles
from attention_layers.ops.masks import Masks

BACKEND = keras.backend.backend()
B, H, D = 2, 2, 4
SCALE = 0.5
BLOCK = 2  # the tiled path in blocks of 2: padding and several blocks
# "tiled" takes all the keys of a block at once at these lengths; "tiled-square"
# tiles the keys too, with the running log-sum-exp.
IMPLEMENTATIONS = ["direct", "fused", "tiled", "tiled-square", "pallas"]


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def tensor(x):
    return None if x is None else keras.ops.convert_to_tensor(x)


# -- the formula ---------------------------------------------------------------------
def formula(q, k, v, mask):
    """``(context, weights)`` of ``softmax(scale q k^T + mask) v`` per head;
    ``mask`` ``[B, 1 or H, Tq, Tk]`` (True: may attend). A row with no key
    gets zero weights and a zero context."""
    s = np.einsum("bqhd,bkhd->bhqk", q, k).astype("float64") * SCALE
    s = np.where(mask, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    e = np.where(mask, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = e.sum(-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return np.einsum("bhqk,bkhd->bqhd", w, v), w


# -- the mask kinds --------------------------------------------------------------------
def mask_case(kind, tq, tk):
    """``(Masks, dense [B, 1 or H, Tq, Tk] bool)`` of one mask kind."""
    query, kv, pair, offset, window = None, None, None, None, None
    if kind in ("key_padding", "padding_causal"):
        kv = np.ones((B, tk), bool)
        kv[0, -2:] = False
        kv[1, -1:] = False
    if kind in ("query_padding", "padding_causal"):
        query = np.ones((B, tq), bool)
        query[0, -1] = False
        query[1, :2] = False
    if kind in ("causal", "padding_causal"):
        offset = 0
    if kind == "fully_masked":  # every key of batch 0 hidden, two rows of batch 1
        kv = np.ones((B, tk), bool)
        kv[0] = False
        query = np.ones((B, tq), bool)
        query[1, 1:3] = False
    if kind == "pairwise":
        pair = np.random.default_rng(1).random((B, tq, tk)) > 0.3
    if kind == "per_head":
        pair = np.random.default_rng(2).random((B, H, tq, tk)) > 0.3
    if kind == "window":
        window = 2
    start = 0  # where the queries sit: past 0 for new tokens after a cache
    if kind in ("cache_causal", "cache_causal_tensor", "cache_window"):
        start, offset = 3, 3
    if kind == "cache_causal_tensor":  # as in a traced decoding loop
        offset = keras.ops.convert_to_tensor(3)
    if kind == "cache_window":
        window = 3
    dense = np.ones((B, 1, tq, tk), bool)
    if query is not None:
        dense &= query[:, None, :, None]
    if kv is not None:
        dense &= kv[:, None, None, :]
    if pair is not None:
        dense = dense & (pair if pair.ndim == 4 else pair[:, None])
    rows, cols = start + np.arange(tq)[:, None], np.arange(tk)[None, :]
    if offset is not None:
        dense &= rows >= cols
    if window is not None:
        dense &= np.abs(rows - cols) < window
    masks = Masks(tensor(query), tensor(kv), tensor(pair), offset, window, start)
    return masks, dense


CASES = [
    ("none", 5, 5),
    ("key_padding", 3, 7),
    ("query_padding", 7, 3),
    ("query_padding", 5, 5),  # rows fully masked, Pallas' kind of mask
    ("causal", 5, 5),
    ("causal", 3, 7),  # Tq < Tk: query i sees keys 0..i
    ("causal", 7, 3),  # Tq > Tk: the last queries see every key
    ("padding_causal", 3, 7),
    ("padding_causal", 7, 3),
    ("fully_masked", 5, 5),
    ("pairwise", 3, 7),
    ("per_head", 3, 7),
    ("window", 5, 5),
    # New tokens after a cache of 3: query i sits at 3 + i.
    ("cache_causal", 2, 7),
    ("cache_causal_tensor", 2, 7),
    ("cache_window", 2, 7),
]
CASE_IDS = [f"{kind}-{tq}x{tk}" for kind, tq, tk in CASES]


def inputs(tq, tk, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(size=(B, t, H, D)).astype("float32") for t in (tq, tk, tk))


def served(impl, kind, tq):
    """``None`` where ``impl`` computes the case, else the argument its
    clear error names."""
    if impl.startswith("tiled") and kind == "per_head":
        return "attention_mask"
    # Pallas' kernel: equal lengths, no key, pairwise or window mask.
    pallas_masks = ("none", "query_padding", "causal")  # offset 0 only
    if impl == "pallas" and (tq != 5 or kind not in pallas_masks):
        return "implementation"
    return None


def implementation(name, monkeypatch):
    """The ``implementation`` for a test name; Pallas only on JAX (its
    interpreter on a CPU)."""
    if name == "pallas" and BACKEND != "jax":
        pytest.skip("Pallas' kernel is JAX's")
    if name == "tiled-square":
        monkeypatch.setattr(tiles, "WHOLE_ROW_ELEMENTS", 0)
        return "tiled"
    return name


def attend(impl, q, k, v, masks, **kwargs):
    return attention.dot_product_attention(
        tensor(q), tensor(k), tensor(v), masks, scale=SCALE,
        implementation=impl, block_size=BLOCK, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("kind,tq,tk", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_each_kernel_equals_the_formula(name, kind, tq, tk, monkeypatch):
    impl = implementation(name, monkeypatch)
    q, k, v = inputs(tq, tk)
    masks, dense = mask_case(kind, tq, tk)
    refused = served(name, kind, tq)
    if refused:
        with pytest.raises(ValueError, match=f"`{refused}` expected"):
            attend(impl, q, k, v, masks)
        return
    want, weights = formula(q, k, v, dense)
    context, scores = attend(impl, q, k, v, masks)
    assert (scores is None) == (impl != "direct")  # only the direct path has them
    context = to_numpy(context)
    assert context.shape == (B, tq, H, D) and np.isfinite(context).all()
    np.testing.assert_allclose(context, want, rtol=1e-5, atol=1e-5)
    # A row that sees no key: zero context (the layers' mask contract).
    empty = np.broadcast_to(np.moveaxis(~dense.any(-1), 1, 2), (B, tq, H))
    np.testing.assert_array_equal(context[empty], 0.0)
    if kind in ("query_padding", "padding_causal", "fully_masked"):
        assert empty.any()


@pytest.mark.parametrize("kind,tq,tk", CASES, ids=CASE_IDS)
def test_direct_returns_the_formulas_weights(kind, tq, tk):
    q, k, v = inputs(tq, tk)
    masks, dense = mask_case(kind, tq, tk)
    want, weights = formula(q, k, v, dense)
    context, scores = attend("direct", q, k, v, masks, return_scores=True)
    scores = to_numpy(scores)
    assert scores.shape == (B, H, tq, tk)
    np.testing.assert_allclose(
        scores, np.broadcast_to(weights, scores.shape), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(to_numpy(context), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["fused", "tiled", "pallas"])
def test_kernels_without_scores_refuse_to_return_them(name, monkeypatch):
    impl = implementation(name, monkeypatch)
    q, k, v = inputs(5, 5)
    with pytest.raises(ValueError, match="`return_attention_scores` expected"):
        attend(impl, q, k, v, Masks(None, None, None, None), return_scores=True)


@pytest.mark.parametrize("name", ["fused", "tiled", "pallas"])
def test_kernels_without_dropout_refuse_it_in_training(name, monkeypatch):
    impl = implementation(name, monkeypatch)
    q, k, v = inputs(5, 5)
    with pytest.raises(ValueError, match="`training` expected"):
        attend(impl, q, k, v, Masks(None, None, None, None), dropout=0.5, training=True)


def test_direct_drops_the_weights_it_multiplies_not_those_it_returns():
    q, k, v = inputs(3, 7)
    masks, dense = mask_case("key_padding", 3, 7)
    want, weights = formula(q, k, v, dense)

    def half(w, training):  # a stand-in for a dropout layer
        return w * (0.5 if training else 1.0)

    for training, factor in ((True, 0.5), (False, 1.0)):
        context, scores = attend(
            "auto", q, k, v, masks, dropout=0.5, dropout_fn=half, training=training,
            return_scores=True,
        )  # fmt: skip
        np.testing.assert_allclose(to_numpy(scores), weights, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(to_numpy(context), factor * want, atol=1e-5)


# -- gradients: each kernel's against the direct path's ---------------------------
def gradients(fn, *xs):
    """Gradients of ``sum(sin(fn(*xs)))`` with respect to every ``xs``."""
    if BACKEND == "jax":
        import jax

        def total(*a):
            return keras.ops.sum(keras.ops.sin(fn(*a)))

        return [to_numpy(g) for g in jax.grad(total, range(len(xs)))(*xs)]
    if BACKEND == "torch":
        import torch

        xs = [torch.tensor(x, requires_grad=True) for x in xs]
        torch.sum(torch.sin(fn(*xs))).backward()
        return [x.grad.numpy() for x in xs]
    import tensorflow as tf

    xs = [tf.constant(x) for x in xs]
    with tf.GradientTape() as tape:
        tape.watch(xs)
        total = tf.reduce_sum(tf.sin(fn(*xs)))
    return [g.numpy() for g in tape.gradient(total, xs)]


GRADIENT_CASES = [("padding_causal", 3, 7), ("causal", 7, 3), ("fully_masked", 5, 5)]


@pytest.mark.parametrize(
    "kind,tq,tk", GRADIENT_CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}" for c in GRADIENT_CASES]
)
@pytest.mark.parametrize("name", ["fused", "tiled", "tiled-square"])
def test_each_kernels_gradients_equal_the_direct_ones(name, kind, tq, tk, monkeypatch):
    impl = implementation(name, monkeypatch)
    masks, _ = mask_case(kind, tq, tk)

    def run(impl):
        return lambda q, k, v: attend(impl, q, k, v, masks)[0]

    got = gradients(run(impl), *inputs(tq, tk))
    want = gradients(run("direct"), *inputs(tq, tk))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


# -- the choice of "auto", the device query substituted ---------------------------
SHORT, LONG, LONGEST = 8, 2048, 16384  # under and past 2^20 pairs; past 2^26
# (platform, dtype, length) -> the evaluation "auto" takes for one head size.
AUTO = {
    ("cpu", "float32", SHORT): "fused",
    ("cpu", "float32", LONG): "tiled",
    ("cpu", "float16", SHORT): "direct",
    ("cpu", "bfloat16", SHORT): "direct",
    ("cpu", "bfloat16", LONG): "tiled",
    ("gpu", "float32", SHORT): "fused",
    ("gpu", "float32", LONG): "pallas",
    ("gpu", "float32", LONGEST): "pallas",
    ("gpu", "float16", LONGEST): "fused",
    ("gpu", "bfloat16", LONGEST): "fused",
    ("tpu", "float32", SHORT): "fused",
    ("tpu", "float32", LONG): "fused",  # no Pallas off a GPU; the scores fit
    ("tpu", "float32", LONGEST): "tiled",
    ("tpu", "bfloat16", LONGEST): "fused",
}


def on_device(monkeypatch, platform):
    """Substitute the device query; Pallas' kernel counts as available on a
    GPU (its probe would compile it)."""
    monkeypatch.setattr(devices, "platform", lambda: platform)
    available = platform == "gpu"
    monkeypatch.setattr(devices, "pallas_attention_available", lambda: available)


@pytest.mark.parametrize(
    "platform,dtype,length", list(AUTO), ids=["-".join(map(str, c)) for c in AUTO]
)
def test_auto_picks_by_device_and_dtype(platform, dtype, length, monkeypatch):
    on_device(monkeypatch, platform)
    choice = attention.choose(
        "auto", length, length, dtype=dtype, key_dim=D, value_dim=D
    )
    assert choice == AUTO[platform, dtype, length]


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
def test_auto_falls_back_where_a_kernel_cannot_serve(platform, monkeypatch):
    on_device(monkeypatch, platform)

    def choose(length, masks=None, value_dim=D, **kwargs):
        return attention.choose(
            "auto", length, length, masks, key_dim=D, value_dim=value_dim, **kwargs
        )

    assert choose(LONG, return_scores=True) == "direct"
    assert choose(LONG, dropout=0.1, training=True) == "direct"
    long_choice = {"cpu": "tiled", "gpu": "pallas", "tpu": "fused"}[platform]
    assert choose(LONG, dropout=0.1, training=False) == long_choice
    assert choose(SHORT, flash_attention=True) == "fused"
    per_head = Masks(None, None, np.ones((1, H, 1, 1), bool), None)  # its rank
    assert choose(LONGEST, per_head) == "fused"  # the tiled path takes one mask
    assert choose(LONGEST, value_dim=D + 2) == "tiled"  # two head sizes
    assert choose(SHORT, value_dim=D + 2) == "direct"
    assert choose(None) == "fused"  # lengths unknown at trace time
    padded = Masks(None, np.ones((1, LONG), bool), None, None)
    want = "tiled" if platform == "cpu" else "fused"  # Pallas takes no key mask
    assert choose(LONG, padded) == want


def test_the_chosen_kernel_runs(monkeypatch):
    """``dot_product_attention`` runs what `choose` picks: on a substituted
    GPU in float32 the backend's kernel, and still the formula."""
    on_device(monkeypatch, "gpu")
    taken = []
    fused = attention.fused
    monkeypatch.setattr(attention, "fused", lambda *a: taken.append(1) or fused(*a))
    q, k, v = inputs(3, 7)
    masks, dense = mask_case("padding_causal", 3, 7)
    context, _ = attend("auto", q, k, v, masks)
    assert taken
    np.testing.assert_allclose(
        to_numpy(context), formula(q, k, v, dense)[0], rtol=1e-5, atol=1e-5
    )


# -- the additive score ---------------------------------------------------------------
def additive_formula(q, k, v, bias=0.0, coverage=None, w_c=None):
    hidden = q[:, :, None, :] + k[:, None, :, :] + bias
    if coverage is not None:
        hidden = hidden + coverage[..., None] * w_c
    return np.tanh(hidden.astype("float64")) @ v


@pytest.mark.parametrize("coverage", [False, True], ids=["plain", "coverage"])
@pytest.mark.parametrize("budget", [None, 24], ids=["one_piece", "blocks_of_rows"])
@pytest.mark.parametrize("impl", ["blocks", "fused"])
def test_additive_score_evaluations_equal_the_formula(impl, budget, coverage):
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 4, 3))
    v, bias = rng.normal(size=3), rng.normal(size=3)
    extra = {}
    if coverage:
        extra = {"coverage": rng.random((2, 5, 4)), "coverage_weight": rng.random(3)}
    q, k, v, bias = (x.astype("float32") for x in (q, k, v, bias))
    extra = {name: x.astype("float32") for name, x in extra.items()}
    got = additive_score.additive_scores(
        q, k, v, bias, block_elements=budget, implementation=impl, **extra
    )
    want = additive_formula(
        q, k, v, bias, extra.get("coverage"), extra.get("coverage_weight")
    )
    np.testing.assert_allclose(to_numpy(got), want, rtol=1e-5, atol=1e-5)
    if budget:  # 24 tanh values a block: one query row of 2 x 4 keys x 3 units
        assert additive_score.block_rows(tensor(q), tensor(k), budget) == 1


@pytest.mark.parametrize(
    "platform,want", [("cpu", "blocks"), ("gpu", "fused"), ("tpu", "fused")]
)
def test_additive_score_picks_by_device(platform, want, monkeypatch):
    on_device(monkeypatch, platform)
    assert additive_score.choose_implementation("auto") == want
    assert additive_score.choose_implementation("blocks") == "blocks"
    with pytest.raises(ValueError, match="`implementation` expected"):
        additive_score.choose_implementation("tiles")
