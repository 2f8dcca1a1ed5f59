"""Each layer's evaluation by device: the choices, checked on a CPU with the
device query substituted, and the accelerator paths' numbers and memory."""

import keras
import numpy as np
import pytest

import attention_layers as al
from attention_layers.ops import additive_score, attention, devices
from attention_layers.ops.masks import Masks

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(0)
jax_only = pytest.mark.skipif(BACKEND != "jax", reason="Pallas is JAX's")


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def gradients(fn, *xs):
    """Gradients of ``sum(sin(fn(*xs)))`` with respect to every ``xs``."""
    if BACKEND == "jax":
        import jax

        def total(*a):
            return keras.ops.sum(keras.ops.sin(fn(*a)))

        return [to_numpy(g) for g in jax.grad(total, range(len(xs)))(*xs)]
    import tensorflow as tf

    xs = [tf.constant(x) for x in xs]
    with tf.GradientTape() as tape:
        tape.watch(xs)
        total = tf.reduce_sum(tf.sin(fn(*xs)))
    return [None if g is None else g.numpy() for g in tape.gradient(total, xs)]


@pytest.fixture
def on_gpu(monkeypatch):
    """Substitute the device query: the layers see a GPU."""
    monkeypatch.setattr(devices, "platform", lambda: "gpu")


# -- the device query -------------------------------------------------------------
def test_platform_reads_the_backends_devices(monkeypatch):
    assert devices.platform() == "cpu"  # these tests run on CPUs
    assert not devices.on_accelerator()
    if BACKEND == "torch":
        pytest.skip("PyTorch's default device is read from a tensor")
    for listed, kind in [("gpu:0", "gpu"), ("cuda:0", "gpu"), ("tpu:0", "tpu")]:
        monkeypatch.setattr(keras.distribution, "list_devices", lambda d=listed: [d])
        assert devices.platform.__wrapped__() == kind
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: ["cpu:0"])
    assert devices.platform.__wrapped__() == "cpu"


def test_pallas_is_not_offered_off_a_gpu():
    assert devices.pallas_attention_available() is False


# -- Bahdanau: blocks on a CPU, one fused piece on an accelerator -------------------
def test_bahdanau_auto_follows_the_device(monkeypatch):
    calls = []
    fused = additive_score.fused_scores

    def spy(*args):
        calls.append(len(args))
        return fused(*args)

    monkeypatch.setattr(additive_score, "fused_scores", spy)
    q = RNG.normal(size=(2, 6, 5)).astype("float32")
    v = RNG.normal(size=(2, 7, 4)).astype("float32")
    layer = al.BahdanauAttention(units=8)
    on_cpu = to_numpy(layer(q, v))
    assert additive_score.choose_implementation() == "blocks" and not calls
    monkeypatch.setattr(devices, "platform", lambda: "gpu")
    assert additive_score.choose_implementation() == "fused"
    np.testing.assert_allclose(to_numpy(layer(q, v)), on_cpu, rtol=1e-5, atol=1e-6)
    assert calls == [3]  # one piece, no coverage
    # What is built on the score follows: coverage and hard attention.
    covered = al.BahdanauAttention(units=8, use_coverage=True)
    covered(q, v, coverage=np.zeros((2, 6, 7), "float32"))
    al.HardAttention(units=8)(q, v)
    assert calls == [3, 5, 3]
    monkeypatch.setattr(devices, "platform", lambda: "tpu")
    assert additive_score.choose_implementation() == "fused"


@pytest.mark.parametrize("coverage", [False, True], ids=["plain", "coverage"])
@pytest.mark.parametrize("budget", [None, 2 * 7 * 4 * 2], ids=["one_piece", "blocks"])
def test_fused_scores_equal_the_formula_with_gradients(coverage, budget):
    """The fused piece (and fused blocks) against the paper's formula by
    autodiff: scores and the gradients of q, k, v, the bias, c and w_c."""
    q = RNG.normal(size=(2, 5, 4)).astype("float32")
    k = RNG.normal(size=(2, 7, 4)).astype("float32")
    v, b, w = (RNG.normal(size=4).astype("float32") for _ in range(3))
    c = RNG.uniform(size=(2, 5, 7)).astype("float32")
    ops = keras.ops

    def fused(q, k, v, b, c, w):
        extra = {"coverage": c, "coverage_weight": w} if coverage else {}
        return al.additive_scores(
            q, k, v, bias=b, block_elements=budget, implementation="fused", **extra
        )

    def formula(q, k, v, b, c, w):
        hidden = ops.expand_dims(q, 2) + ops.expand_dims(k, 1) + b
        if coverage:
            hidden = hidden + ops.expand_dims(c, -1) * w
        return ops.sum(ops.tanh(hidden) * v, axis=-1)

    args = (q, k, v, b, c, w)
    np.testing.assert_allclose(
        to_numpy(fused(*args)), to_numpy(formula(*args)), rtol=1e-5, atol=1e-6
    )
    got, want = gradients(fused, *args), gradients(formula, *args)
    for name, a, e in zip(["q", "k", "v", "b", "c", "w_c"], got, want, strict=True):
        if not coverage and name in ("c", "w_c"):
            continue  # unused: no gradient (None on TensorFlow)
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5, err_msg=name)


def test_fused_computes_in_float32_under_mixed_bfloat16():
    """Over eight seeded draws of inputs and weights, the fused score under
    mixed_bfloat16 is nearer float32 than the blocks' (one draw alone is a
    coin flip now and then: the errors are of one order)."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    fused_errors, blocks_errors = [], []
    for _ in range(8):
        q = rng.normal(size=(2, 5, 8)).astype("float32")
        v = rng.normal(size=(2, 6, 8)).astype("float32")
        reference = al.BahdanauAttention(units=16, implementation="fused")
        half = al.BahdanauAttention(
            units=16, implementation="fused", dtype="mixed_bfloat16"
        )
        blocks = al.BahdanauAttention(
            units=16, implementation="blocks", dtype="mixed_bfloat16"
        )
        for layer in (reference, half, blocks):
            layer(q, v)
        half.set_weights(reference.get_weights())
        blocks.set_weights(reference.get_weights())
        want = to_numpy(reference(q, v, return_attention_scores=True)[1])
        got = to_numpy(half(q, v, return_attention_scores=True)[1])
        fused_errors.append(np.abs(got - want))
        got = to_numpy(blocks(q, v, return_attention_scores=True)[1])
        blocks_errors.append(np.abs(got.astype("float32") - want))
    fused_error, blocks_error = np.stack(fused_errors), np.stack(blocks_errors)
    # Only the bfloat16 projections round: the score's sum stays in float32.
    assert fused_error.max() < 2e-2 and fused_error.mean() < blocks_error.mean()


@pytest.mark.skipif(BACKEND != "jax", reason="reads XLA's compiled memory on JAX")
def test_fused_stores_no_tanh_tensor_under_xla():
    """Compiled forward + backward on XLA: the fused piece keeps less temporary
    memory than one ``[B, Tq, Tv, U]`` tanh tensor; plain autodiff of the
    formula (what keras.layers.AdditiveAttention does) keeps several."""
    import jax

    shape = (4, 64, 64, 64)  # B, Tq, Tv, U: 4 MiB of float32 per tanh tensor
    q = RNG.normal(size=shape[:2] + shape[3:]).astype("float32")
    k = RNG.normal(size=(shape[0],) + shape[2:]).astype("float32")
    v = RNG.normal(size=shape[3]).astype("float32")
    ops = keras.ops

    def temp_bytes(score):
        def loss(q, k, v):
            return ops.sum(ops.sin(score(q, k, v)))

        step = jax.jit(jax.grad(loss, (0, 1, 2)))
        return step.lower(q, k, v).compile().memory_analysis().temp_size_in_bytes

    tensor = 4 * np.prod(shape)
    fused = temp_bytes(additive_score.fused_scores)
    plain = temp_bytes(additive_score.tanh_block)
    assert fused < tensor <= plain, (fused, tensor, plain)


# -- multi-head attention: the accelerator's choices --------------------------------
def mha(**kwargs):
    return al.MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)


def choose(layer, training, return_scores, tq, tk, masks=None):
    """The evaluation ``layer`` takes for a call of lengths ``tq``, ``tk``."""
    return attention.choose(
        layer.implementation,
        tq,
        tk,
        masks,
        dtype=layer.compute_dtype,
        key_dim=layer.key_dim,
        value_dim=layer.value_dim,
        dropout=layer.dropout,
        training=training,
        return_scores=return_scores,
        flash_attention=layer._flash_attention,
        tile_threshold=layer.tile_threshold,
    )


def test_multi_head_auto_on_an_accelerator(on_gpu, monkeypatch):
    long, longest = 2048, 16384  # past tile_threshold; past 2^26 pairs
    layer, uneven = mha(), mha(value_dim=6)
    monkeypatch.setattr(devices, "pallas_attention_available", lambda: False)
    assert choose(layer, False, False, 8, 8) == "fused"
    assert choose(layer, False, False, long, long) == "fused"  # the scores fit
    assert choose(layer, False, False, longest, longest) == "tiled"  # they do not
    assert choose(layer, False, False, None, None) == "fused"
    assert choose(layer, False, True, long, long) == "direct"  # scores returned
    assert choose(mha(dtype="mixed_bfloat16"), False, False, longest, longest) == (
        "fused"  # 16-bit: the backend's flash kernel keeps memory linear
    )
    assert choose(uneven, False, False, longest, longest) == "tiled"
    assert choose(uneven, False, False, 8, 8) == "direct"
    monkeypatch.setattr(devices, "pallas_attention_available", lambda: True)
    causal = Masks(None, None, None, 0)
    assert choose(layer, False, False, long, long) == "pallas"
    assert choose(layer, False, False, long, long, causal) == "pallas"
    assert choose(layer, False, False, 8, 8) == "fused"  # short
    padded = Masks(None, np.ones((1, long), bool), None, None)
    assert choose(layer, False, False, long, long, padded) == "fused"
    assert choose(layer, False, False, longest, longest, padded) == "tiled"
    assert choose(layer, False, False, long, long + 1) == "fused"  # lengths
    monkeypatch.setattr(devices, "platform", lambda: "cpu")
    assert choose(layer, False, False, long, long) == "tiled"  # the CPU rule


def test_multi_head_accelerator_choice_gives_the_cpu_numbers(on_gpu):
    """A call under the substituted GPU (the backend's fused kernel, in
    float32) equals the direct path, masks included."""
    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    mask = np.ones((2, 6), bool)
    mask[0] = False
    layer, direct = mha(), mha(implementation="direct")
    layer(x, x)
    direct(x, x)
    direct.set_weights(layer.get_weights())
    for kwargs in ({}, {"value_mask": mask}, {"use_causal_mask": True}):
        np.testing.assert_allclose(
            to_numpy(layer(x, x, **kwargs)),
            to_numpy(direct(x, x, **kwargs)),
            rtol=1e-5,
            atol=1e-6,
        )


# -- multi-head attention: Pallas' kernel (interpreted on a CPU) --------------------
def pallas_pair(**kwargs):
    layer = mha(implementation="pallas", **kwargs)
    direct = mha(implementation="direct", **kwargs)
    return layer, direct


@jax_only
@pytest.mark.parametrize(
    "tq,tk,causal",
    [(6, 6, False), (6, 6, True), (256, 256, False), (128, 128, True)],
    ids=["padded", "padded_causal", "blocks", "causal_blocks"],
)
def test_pallas_equals_direct_with_gradients(tq, tk, causal):
    q = RNG.normal(size=(2, tq, 8)).astype("float32")
    v = RNG.normal(size=(2, tk, 8)).astype("float32")
    layer, direct = pallas_pair()
    layer(q, v)
    direct(q, v)
    direct.set_weights(layer.get_weights())
    for a, b in zip(
        gradients(lambda q, v: layer(q, v, use_causal_mask=causal), q, v),
        gradients(lambda q, v: direct(q, v, use_causal_mask=causal), q, v),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        to_numpy(layer(q, v, use_causal_mask=causal)),
        to_numpy(direct(q, v, use_causal_mask=causal)),
        rtol=1e-5,
        atol=1e-5,
    )


@jax_only
def test_pallas_keeps_the_mask_contract():
    """Query masks: a fully masked row's output is the output bias alone (zero
    here), NaN under the padding does not leak, and the rest equals direct."""
    x = RNG.normal(size=(3, 5, 8)).astype("float32")
    query_mask = np.ones((3, 5), bool)
    query_mask[0] = False
    query_mask[1, -2:] = False
    dirty = np.where(query_mask[..., None], x, np.nan).astype("float32")
    layer, direct = pallas_pair()
    layer(x, x)
    direct(x, x)
    direct.set_weights(layer.get_weights())
    got = to_numpy(layer(dirty, x, query_mask=query_mask, use_causal_mask=True))
    want = to_numpy(direct(x, x, query_mask=query_mask, use_causal_mask=True))
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[0], 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_pallas_refuses_what_it_cannot_serve():
    from tests.contract import assert_clear_error

    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    layer = mha(implementation="pallas")
    cls = al.MultiHeadAttention
    if BACKEND != "jax":
        assert_clear_error(cls, "implementation", lambda: layer(x, x))
        return
    mask = np.ones((2, 6), bool)
    assert_clear_error(cls, "implementation", lambda: layer(x, x, value_mask=mask))
    assert_clear_error(cls, "implementation", lambda: layer(x, x[:, :5]))
    assert_clear_error(
        cls,
        "return_attention_scores",
        lambda: layer(x, x, return_attention_scores=True),
    )
