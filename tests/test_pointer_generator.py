"""PointerGenerator and its extended-id helpers: the formula by hand, numerical
safety (saturated gates, masked garbage, empty sources, underflow), decoding
with copies, and the contract clauses that fit.

The layer contract (tests/contract.py) is written for query/value layers.
Its clauses run here as follows:

* config round trip, ``.keras`` file, SavedModel served without the library,
  distinct initial weights: the contract's own checks, on `PointerCase`
  (the log-probabilities stand for the output, ``p_gen`` for the weights);
* fully masked row, NaN in masked positions, mixed precision, XLA training,
  MirroredStrategy, bad input: written here for this layer's arguments. A
  fully masked source gives ``p_gen = 1`` and ``log_softmax(logits)``, not a
  zero output; under mixed precision the output is float32 by design, not
  the compute dtype.

Clauses that cannot apply:

* implicit mask: Keras fills ``<argument>_mask`` from the mask of that
  argument, but the source mask travels with the source *embeddings*, while
  this layer gets the source ids (int, no Keras mask): pass ``source_mask``;
* causal mask: the layer has no query/value sequence pair; each target step
  is mixed on its own, nothing looks ahead;
* dropout: the layer has none.
"""

import contextlib
import json
import os
from functools import partial

import keras
import numpy as np
import pytest
from keras import ops

import attention_layers as al
from attention_layers.decoding import beam_search, greedy_search, tile_beams
from attention_layers.masking import NEG_INF
from tests import contract

B, T, V, S, F = 3, 4, 7, 5, 6
UNK = 1


def np_(x):
    return keras.ops.convert_to_numpy(x)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def jit(fn):
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn, jit_compile=True)


def source_ids_and_mask():
    """Extended ids of three sources of length S = 5 over V = 7.

    Row 0 is fully masked (an empty source). Row 1: word 2, OOV "x" (position
    1, id V + 1), word 4, "x" again, padding. Row 2: OOV "y" at 0, word 2,
    OOV "z" at 2, word 2, "y" again.
    """
    ids = np.array(
        [
            [0, 0, 0, 0, 0],
            [2, V + 1, 4, V + 1, 0],
            [V + 0, 2, V + 2, 2, V + 0],
        ],
        "int32",
    )
    mask = np.ones((B, S), bool)
    mask[0] = False
    mask[1, -1] = False
    return ids, mask


def feed(seed=0, scale=1.0, masked=True):
    rng = np.random.default_rng(seed)
    ids, mask = source_ids_and_mask()
    scores = rng.normal(size=(B, T, S))
    if masked:
        scores = np.where(mask[:, None], scores, -np.inf)
    with np.errstate(invalid="ignore"):  # the empty row: NaN, zeroed
        attention = np.nan_to_num(softmax(scores)).astype("float32")
    out = {
        "logits": (scale * rng.normal(size=(B, T, V))).astype("float32"),
        "attention": attention,
        "source_ids": ids,
        "gate_inputs": (scale * rng.normal(size=(B, T, F))).astype("float32"),
    }
    if masked:
        out["source_mask"] = mask
    return out


def reference(layer, f):
    """The formula in float64 numpy: ``(P [B, T, V + S], p_gen [B, T])``."""
    kernel, bias = (np.asarray(w, "float64") for w in layer.get_weights())
    mask = f.get("source_mask", np.ones(f["source_ids"].shape, bool))
    g = f["gate_inputs"].astype("float64") @ kernel[:, 0] + bias[0]
    p_gen = 1.0 / (1.0 + np.exp(-g))
    attention = np.where(mask[:, None], f["attention"], 0.0).astype("float64")
    total = attention.sum(-1)
    p_gen = np.where(total > 0, p_gen, 1.0)
    probs = np.zeros(f["logits"].shape[:2] + (V + S,))
    probs[..., :V] = p_gen[..., None] * softmax(f["logits"].astype("float64"))
    for b in range(B):
        for j in range(S):
            if mask[b, j] and total[b].all():
                w = f["source_ids"][b, j]
                probs[b, :, w] += (1 - p_gen[b]) * attention[b, :, j] / total[b]
    return probs, p_gen


def layer_for(f, **kwargs):
    layer = al.PointerGenerator(V, **kwargs)
    layer(**f)
    return layer


# -- the formula, by hand --------------------------------------------------------
def test_formula_by_hand():
    """V = 3 (0, 1 = unk, 2), S = 3: source "2 x x" with the OOV word x twice
    (extended id 3 + 1 = 4); one target step."""
    layer = al.PointerGenerator(3)
    layer(
        np.zeros((1, 1, 3), "float32"),
        np.ones((1, 1, 3), "float32") / 3,
        np.array([[2, 4, 4]]),
        np.zeros((1, 1, 2), "float32"),
    )
    layer.set_weights(
        [np.array([[1.0], [-2.0]], "float32"), np.array([0.5], "float32")]
    )
    logits = np.log(np.array([[[0.2, 0.3, 0.5]]], "float32"))
    attention = np.array([[[0.1, 0.6, 0.3]]], "float32")
    gate_inputs = np.array([[[0.25, 0.5]]], "float32")
    log_probs, p_gen = layer(
        logits, attention, np.array([[2, 4, 4]]), gate_inputs, return_p_gen=True
    )
    g = 0.25 - 1.0 + 0.5
    pg = 1 / (1 + np.exp(-g))
    want = [
        pg * 0.2,
        pg * 0.3,
        pg * 0.5 + (1 - pg) * 0.1,  # in-vocab source word: copy adds to it
        0.0,  # id 3 = "OOV word at position 0": none (position 0 is in vocab)
        (1 - pg) * (0.6 + 0.3),  # both x's
        0.0,
    ]
    np.testing.assert_allclose(np_(p_gen), [[pg]], rtol=1e-6)
    got = np_(log_probs)[0, 0]
    np.testing.assert_allclose(np.exp(got), want, rtol=1e-5, atol=1e-7)
    assert got[3] == NEG_INF and got[5] == NEG_INF  # no mass: exactly -1e9


def test_matches_the_formula_on_a_batch():
    f = feed()
    layer = layer_for(f)
    out, p_gen = layer(**f, return_p_gen=True)
    want, want_p_gen = reference(layer, f)
    out = np_(out)
    assert out.dtype == np.float32 and out.shape == (B, T, V + S)
    np.testing.assert_allclose(np_(p_gen), want_p_gen, rtol=1e-5)
    np.testing.assert_allclose(np.exp(out), want, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(np.log(np.exp(out).sum(-1)), 0.0, atol=1e-5)
    # Ids with no mass are exactly -1e9: row 1 has only the copy id V + 1.
    no_mass = want == 0
    assert (out[no_mass] == NEG_INF).all()
    assert (out[~no_mass] > -1e3).all()


def test_one_step_inputs_equal_the_full_call():
    f = feed()
    layer = layer_for(f)
    full, p_gen = layer(**f, return_p_gen=True)
    for t in range(T):
        step = {**f, **{k: f[k][:, t] for k in ("logits", "attention", "gate_inputs")}}
        out, p = layer(**step, return_p_gen=True)
        assert tuple(out.shape) == (B, V + S) and tuple(p.shape) == (B,)
        np.testing.assert_allclose(np_(out), np_(full)[:, t], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np_(p), np_(p_gen)[:, t], rtol=1e-6)


# -- the helpers -----------------------------------------------------------------
def test_extended_ids_helpers():
    # V = 7, unk = 1. Source: "a x b x y <pad>" (x, y OOV); keys are hashes.
    vocab_ids = np.array([[3, UNK, 4, UNK, UNK, 0]])
    keys = np.array([[30, 99, 40, 99, 77, 0]])
    mask = np.array([[True] * 5 + [False]])
    ext = np_(al.extended_source_ids(vocab_ids, keys, UNK, V, mask=mask))
    assert ext.tolist() == [[3, V + 1, 4, V + 1, V + 4, 0]]
    # Target "x z a y": z is OOV and not in the source; a masked source
    # position never gives a copy id.
    target = np.array([[UNK, UNK, 3, UNK]])
    target_keys = np.array([[99, 55, 30, 77]])
    got = al.extended_target_ids(target, target_keys, keys, ext, UNK, V, mask)
    assert np_(got).tolist() == [[V + 1, UNK, 3, V + 4]]
    hidden = mask.copy()
    hidden[0, 4] = False  # y now padding
    got = al.extended_target_ids(target, target_keys, keys, ext, UNK, V, hidden)
    assert np_(got).tolist() == [[V + 1, UNK, 3, UNK]]
    assert np_(al.copy_step_inputs(np.array([[V + 1, 3]]), V, UNK)).tolist() == [
        [UNK, 3]
    ]
    # The same inside a compiled function.
    fn = jit(lambda v, k, m: al.extended_source_ids(v, k, UNK, V, mask=m))
    np.testing.assert_array_equal(np_(fn(vocab_ids, keys, mask)), ext)


# -- numerical safety ------------------------------------------------------------
def gradients(layer, f, targets):
    """Gradients of the mean cross-entropy of ``targets`` with respect to the
    float inputs and the layer's weights, as numpy arrays, and the loss."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    names = ("logits", "attention", "gate_inputs")
    if keras.backend.backend() == "jax":
        import jax

        def loss(weights, inputs):
            out, _ = layer.stateless_call(weights, [], **{**f, **inputs})
            return loss_fn(targets, out)

        weights = [v.value for v in layer.trainable_variables]
        inputs = {n: f[n] for n in names}
        value, (gw, gi) = jax.value_and_grad(loss, argnums=(0, 1))(weights, inputs)
        grads = [np_(g) for g in gw] + [np_(gi[n]) for n in names]
        return float(value), grads
    import tensorflow as tf

    inputs = {n: tf.constant(f[n]) for n in names}
    with tf.GradientTape() as tape:
        tape.watch(list(inputs.values()))
        value = loss_fn(targets, layer(**{**f, **inputs}))
    grads = tape.gradient(value, layer.trainable_weights + list(inputs.values()))
    return float(value), [np_(g) for g in grads]


def assert_finite_gradients(layer, f, targets):
    value, grads = gradients(layer, f, targets)
    assert np.isfinite(value), value
    for g in grads:
        assert np.isfinite(g).all()
    return value


def copy_targets():
    """Targets mixing vocabulary ids and present copy ids (row 0: none)."""
    return np.array([[3, 2, 0, 6], [V + 1, 2, V + 1, 4], [V + 0, V + 2, 2, 5]])


@pytest.mark.parametrize("bias", [1e4, -1e4])
def test_saturated_gate_is_finite_and_correct(bias):
    f = feed()
    layer = layer_for(f)
    layer.set_weights([np.zeros((F, 1), "float32"), np.array([bias], "float32")])
    out, p_gen = layer(**f, return_p_gen=True)
    out = np_(out)
    assert np.isfinite(out).all()
    log_vocab = np.log(softmax(f["logits"].astype("float64")))
    mask = f["source_mask"]
    # Exact log-space values: log p_gen and log(1 - p_gen) are 0 and -|g|.
    log_pg, log_pc = (0.0, -bias) if bias > 0 else (bias, 0.0)
    for b in (1, 2):
        a = f["attention"][b].astype("float64")
        copy = np.zeros((T, V + S))
        for j in np.flatnonzero(mask[b]):
            copy[:, f["source_ids"][b, j]] += a[:, j]
        vocab = np.full((T, V + S), -np.inf)
        vocab[:, :V] = log_vocab[b]
        with np.errstate(divide="ignore"):
            want = np.logaddexp(log_pg + vocab, log_pc + np.log(copy))
        known = np.isfinite(want)
        np.testing.assert_allclose(out[b][known], want[known], rtol=1e-5, atol=1e-4)
        assert (out[b][~known] == NEG_INF).all()
    # The empty row 0 ignores the gate.
    np.testing.assert_allclose(np_(p_gen)[0], 1.0)
    assert_finite_gradients(layer, f, copy_targets())
    # Huge gate inputs, not only a huge bias.
    layer.set_weights([np.full((F, 1), bias / 10, "float32"), np.zeros(1, "float32")])
    big = {**f, "gate_inputs": np.full((B, T, F), 10.0, "float32")}
    assert np.isfinite(np_(layer(**big))).all()
    assert_finite_gradients(layer, big, copy_targets())


def test_masked_positions_do_not_leak():
    f = feed()
    layer = layer_for(f)
    mask = f["source_mask"]
    dirty = {k: np.copy(v) for k, v in f.items()}
    dirty["attention"][np.broadcast_to(~mask[:, None], (B, T, S))] = np.nan
    dirty["source_ids"][~mask] = np.array([-7, 10**6, V + S, -1, 3, 99])[
        : (~mask).sum()
    ]
    clean = np_(layer(**f))
    got = np_(layer(**dirty))
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, clean)
    assert_finite_gradients(layer, dirty, copy_targets())
    # Attention on padding (an attention computed without the mask) is
    # ignored too: the unmasked part is renormalised.
    spread = {**f, "attention": feed(masked=False)["attention"]}
    out = np.exp(np_(layer(**spread)))
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-5)
    want, _ = reference(layer, spread)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-7)


def test_empty_source_gives_the_vocabulary_distribution():
    f = feed()
    layer = layer_for(f)
    out, p_gen = layer(**f, return_p_gen=True)
    out, p_gen = np_(out), np_(p_gen)
    np.testing.assert_array_equal(p_gen[0], 1.0)
    log_vocab = np.log(softmax(f["logits"][0].astype("float64")))
    np.testing.assert_allclose(out[0, :, :V], log_vocab, rtol=1e-5, atol=1e-5)
    assert (out[0, :, V:] == NEG_INF).all()
    # No mask at all but an all-zero attention row: the same.
    zero = {**f, "attention": np.zeros_like(f["attention"])}
    zero.pop("source_mask")
    out, p_gen = layer(**zero, return_p_gen=True)
    np.testing.assert_array_equal(np_(p_gen), 1.0)
    assert_finite_gradients(layer, zero, copy_targets())
    # Every source empty.
    empty = {**f, "source_mask": np.zeros((B, S), bool)}
    targets = np.array([[3, 2, 0, 6]] * B)
    assert_finite_gradients(layer, empty, targets)


def test_underflowed_copy_target_has_a_finite_loss():
    """The target is the copy id of an OOV word whose attention is exactly 0,
    with p_gen near 1: the copy mass floor keeps the loss finite."""
    f = feed()
    f["attention"] = np.zeros_like(f["attention"])
    f["attention"][..., 0] = 1.0  # row 2: all on "y"; "z" (V + 2) gets 0
    layer = layer_for(f)
    layer.set_weights([np.zeros((F, 1), "float32"), np.array([30.0], "float32")])
    targets = np.array([[3, 2, 0, 6], [V + 1] * T, [V + 2] * T])
    out = np_(layer(**f))
    assert np.isfinite(out).all() and (out[2, :, V + 2] > -200).all()
    loss = assert_finite_gradients(layer, f, targets)
    assert 10 < loss < 200


def test_out_of_range_source_ids_raise_eagerly_and_clip_when_traced():
    f = feed()
    layer = layer_for(f)
    bad = {**f, "source_ids": np.where(f["source_ids"] == 4, V + S, f["source_ids"])}
    contract.assert_clear_error(al.PointerGenerator, "source_ids", lambda: layer(**bad))
    negative = {**f, "source_ids": np.where(f["source_ids"] == 4, -1, f["source_ids"])}
    contract.assert_clear_error(
        al.PointerGenerator, "source_ids", lambda: layer(**negative)
    )
    # Traced: clipped into [0, V + S) (id V + S becomes the last entry).
    out = np_(jit(lambda kw: layer(**kw))(bad))
    assert np.isfinite(out).all()
    clipped = {
        **f,
        "source_ids": np.where(bad["source_ids"] == V + S, V + S - 1, f["source_ids"]),
    }
    np.testing.assert_allclose(out, np_(layer(**clipped)), rtol=1e-6, atol=1e-6)


# -- decoding with copies ----------------------------------------------------------
END, START = 0, 2


def copy_step_fn(layer, source_ids, source_mask):
    """A hand-built step: step 0 attends to source position 2 (an OOV word)
    with p_gen ~ 0; afterwards the input is unk, which makes the vocabulary
    favour the end token with p_gen ~ 1."""
    table = np.full((V, V), -5.0, "float32")
    table[START, 3] = 0.0  # from the start token the vocabulary prefers word 3
    table[UNK, END] = 5.0  # after an unk (a copy), the end
    attend = np.zeros((S,), "float32")
    attend[2] = 1.0

    def step_fn(ids, state):
        inputs = al.copy_step_inputs(ids, V, UNK)
        logits = ops.take(table, inputs, axis=0)
        first = ops.expand_dims(ops.cast(state["t"] == 0, "float32"), 1)
        attention = first * attend + (1.0 - first) * (1.0 / S)
        gate = ops.where(first > 0, -1.0, 1.0) * ops.ones((ops.shape(ids)[0], 1))
        log_probs = layer(logits, attention, source_ids, gate, source_mask)
        return log_probs, {"t": state["t"] + 1}, attention

    return step_fn


def decoding_inputs():
    """Two sources; position 2 holds an OOV word (id V + 2) in both."""
    source_ids = np.array([[3, 4, V + 2, 5, 0], [V + 0, 5, V + 2, 0, 0]], "int32")
    source_mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], bool)
    layer = al.PointerGenerator(V)
    layer(
        np.zeros((2, V), "float32"),
        np.ones((2, S), "float32"),
        source_ids,
        np.zeros((2, 1), "float32"),
        source_mask,
    )
    layer.set_weights([np.array([[20.0]], "float32"), np.zeros(1, "float32")])
    return layer, source_ids, source_mask


@pytest.mark.parametrize("compiled", [False, True])
def test_greedy_and_beam_search_copy_an_oov_word(compiled):
    layer, source_ids, source_mask = decoding_inputs()
    start = np.full((2,), START, "int32")

    def greedy():
        step = copy_step_fn(layer, source_ids, source_mask)
        state = {"t": ops.zeros((2,), "int32")}
        return greedy_search(step, state, start, end_id=END, max_length=4)

    def beam():
        k = 3
        ids, mask = tile_beams((source_ids, source_mask), k)
        step = copy_step_fn(layer, ids, mask)
        state = {"t": ops.zeros((2 * k,), "int32")}
        return beam_search(step, state, start, end_id=END, max_length=4, beam_width=k)

    if compiled:
        greedy, beam = jit(greedy), jit(beam)
    out = greedy()
    assert np_(out["tokens"]).tolist() == [[V + 2, END, END, END]] * 2
    assert np.isfinite(np_(out["scores"])).all()
    np.testing.assert_allclose(np_(out["alignments"])[:, 0, 2], 1.0)
    out = beam()
    assert np_(out["tokens"])[:, 0].tolist() == [[V + 2, END, END, END]] * 2
    assert np.isfinite(np_(out["log_probs"])).all()


# -- contract clauses --------------------------------------------------------------
class PointerCase(contract.Case):
    """The layer as a `contract.Case`: ``output`` is the log-probabilities,
    ``weights`` is ``p_gen`` (``return_attention_scores`` asks for it)."""

    def arrays(self, seed=0, scale=1.0):
        f = feed(seed, scale)
        f.pop("source_mask")
        return f

    def masks(self):
        return {"source_mask": source_ids_and_mask()[1]}

    def call(self, layer, arrays, masks=None, return_attention_scores=False, **kw):
        return layer(**arrays, **(masks or {}), return_p_gen=return_attention_scores)

    def functional_model(self, layer, with_masks=True):
        feed_ = self.feed(with_masks)
        inputs = {
            k: keras.Input(shape=v.shape[1:], name=k, dtype=v.dtype.name)
            for k, v in feed_.items()
        }
        out, p_gen = layer(**inputs, return_p_gen=True)
        return keras.Model(inputs, {"output": out, "weights": p_gen})


CASE = PointerCase(
    "pointer_generator",
    partial(al.PointerGenerator, V),
    bad_ctor=[({"vocab_size": 0}, "vocab_size")],
)


def test_config_round_trip():
    contract.check_config(CASE)
    layer = al.PointerGenerator(V, gate_initializer="ones", name="pg")
    config = json.loads(json.dumps(layer.get_config()))
    assert config["vocab_size"] == V
    assert al.PointerGenerator.from_config(config).get_config() == layer.get_config()


def test_keras_file_round_trip(tmp_path):
    contract.check_keras_file(CASE, str(tmp_path))


def test_initial_weights_are_distinct():
    contract.check_distinct_initial_weights(CASE)


# One fresh TensorFlow process, 8 to 20 s on two cores: make test-slow.
@pytest.mark.slow
@pytest.mark.tf_only
def test_saved_model_loads_without_the_library(tmp_path):
    contract.check_saved_model(CASE, str(tmp_path))


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_output_is_float32_and_normalised(policy):
    f = feed()
    reference_layer = layer_for(f)
    want = np_(reference_layer(**f))
    layer = layer_for(f, dtype=policy)
    layer.set_weights(reference_layer.get_weights())
    assert layer.gate.dtype_policy.name == policy
    assert all(w.dtype == "float32" for w in layer.weights)
    out, p_gen = layer(**f, return_p_gen=True)
    for x in (out, p_gen):
        assert keras.backend.standardize_dtype(x.dtype) == "float32"
    out = np_(out)
    np.testing.assert_allclose(np.log(np.exp(out).sum(-1)), 0.0, atol=1e-5)
    tol = 2e-2 if policy == "mixed_float16" else 6e-2
    known = want > -100
    np.testing.assert_allclose(out[known], want[known], atol=tol, rtol=tol)
    # Large logits and gate inputs (300x): still finite and normalised.
    big = feed(scale=300.0)
    out = np_(layer(**big))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(np.log(np.exp(out).sum(-1)), 0.0, atol=1e-5)


def copy_model(dim=16):
    """A tiny pointer-generator: the decoder must copy the source's OOV words."""
    source = keras.Input((S,), dtype="int32", name="source")  # vocabulary ids
    source_ext = keras.Input((S,), dtype="int32", name="source_ext")
    target_in = keras.Input((T,), dtype="int32", name="target_in")
    emb = keras.layers.Embedding(V, dim)
    encoded = keras.layers.Dense(dim, activation="tanh")(emb(source))
    positions = al.PositionEmbedding(sequence_length=S)
    encoded = encoded + positions(encoded)
    decoded = emb(target_in)
    decoded = keras.layers.Dense(dim, activation="tanh")(
        decoded + al.PositionEmbedding(sequence_length=T)(decoded)
    )
    context, attention = al.ScaledDotProductAttention()(
        decoded, encoded, return_attention_scores=True
    )
    logits = keras.layers.Dense(V)(keras.layers.Concatenate()([decoded, context]))
    gate_inputs = keras.layers.Concatenate()([context, decoded, emb(target_in)])
    log_probs = al.PointerGenerator(V)(logits, attention, source_ext, gate_inputs)
    return keras.Model([source, source_ext, target_in], log_probs)


def copy_data(n=64, seed=0):
    """Target = the first T source words; half the words are OOV (unk)."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2 * V, size=(n, S))  # word keys
    vocab = np.where(words < V, words, UNK).astype("int32")
    ext = np_(al.extended_source_ids(vocab, words, UNK, V))
    target = np_(al.extended_target_ids(vocab[:, :T], words[:, :T], words, ext, UNK, V))
    target_in = np.concatenate([np.full((n, 1), START), vocab[:, : T - 1]], 1)
    return [vocab, ext, target_in.astype("int32")], target


def test_jit_compiled_training_decreases_the_loss():
    model = copy_model()
    model.compile(
        optimizer=keras.optimizers.Adam(0.02),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    x, y = copy_data()
    history = model.fit(x, y, batch_size=16, epochs=8, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all(), losses
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.tf_only
def test_mirrored_strategy_equals_one_device():
    """One SGD step (learning rate 1) on two replicas equals one device."""
    strategy = contract.two_device_strategy()
    f = feed()
    f["source_mask"] = f["source_mask"].astype("int32")
    targets = copy_targets()
    f = {k: np.concatenate([v, v[:1]]) for k, v in f.items()}  # batch 4
    targets = np.concatenate([targets, targets[:1]])

    def model_in(scope):
        with scope:
            inputs = {
                k: keras.Input(v.shape[1:], name=k, dtype=v.dtype.name)
                for k, v in f.items()
            }
            logits = keras.layers.Dense(V)(inputs["logits"])
            out = al.PointerGenerator(V)(**{**inputs, "logits": logits})
            model = keras.Model(inputs, out)
            model.compile(
                optimizer=keras.optimizers.SGD(1.0),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        return model

    mirrored = model_in(strategy.scope())
    single = model_in(contextlib.nullcontext())
    single.set_weights(mirrored.get_weights())
    before = single.get_weights()
    losses = [
        m.fit(f, targets, batch_size=4, shuffle=False, verbose=0).history["loss"][0]
        for m in (mirrored, single)
    ]
    assert np.isfinite(losses).all(), losses
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    for start, a, b in zip(
        before, mirrored.get_weights(), single.get_weights(), strict=True
    ):
        np.testing.assert_allclose(start - a, start - b, rtol=1e-4, atol=1e-6)


def test_bad_input_raises_clear_errors():
    err = contract.assert_clear_error
    cls = al.PointerGenerator
    f = feed()

    def call(**changes):
        return lambda: al.PointerGenerator(V)(**{**f, **changes})

    err(cls, "logits", call(logits=f["logits"][0, 0]))  # rank 1
    err(cls, "attention", call(attention=f["attention"][:, 0]))  # rank 2 vs 3
    err(cls, "gate_inputs", call(gate_inputs=f["gate_inputs"][:, 0]))
    err(cls, "source_ids", call(source_ids=f["source_ids"][0]))
    err(cls, "source_ids", call(source_ids=f["source_ids"][:, :-1]))  # S mismatch
    err(cls, "source_ids", call(source_ids=f["source_ids"].astype("float32")))
    err(cls, "logits", call(logits=f["logits"][..., :-1]))  # V mismatch
    err(cls, "logits", call(logits=f["logits"].astype("int32")))
    err(cls, "attention", call(attention=f["attention"][:2]))  # batch
    err(cls, "attention", call(attention=f["attention"][:, :-1]))  # target length
    err(cls, "source_mask", call(source_mask=f["source_mask"][:, :-1]))
    for kwargs, argument in CASE.bad_ctor + [
        ({"vocab_size": 2.5}, "vocab_size"),
        ({"vocab_size": True}, "vocab_size"),
    ]:
        err(cls, argument, lambda kw=kwargs: al.PointerGenerator(**kw))
    # A built layer refuses gate inputs of another size.
    layer = layer_for(f)
    err(
        cls,
        "gate_inputs",
        lambda: layer(**{**f, "gate_inputs": f["gate_inputs"][..., :-1]}),
    )


def test_the_layer_file_is_saved_and_loaded(tmp_path):
    """The tiny copy model round-trips as a .keras file (no custom_objects)."""
    model = copy_model()
    x, _ = copy_data(4)
    want = model.predict(x, verbose=0)
    path = os.path.join(tmp_path, "copy.keras")
    model.save(path)
    got = keras.saving.load_model(path).predict(x, verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_target_mask_reaches_the_loss():
    """The mask of an Embedding(mask_zero=True) over the target passes through
    the layer, so the loss leaves padded target steps out."""
    target_in = keras.Input((T,), dtype="int32", name="target_in")
    source_ext = keras.Input((S,), dtype="int32", name="source_ext")
    attention = keras.Input((T, S), name="attention")
    x = keras.layers.Embedding(V, 8, mask_zero=True)(target_in)
    logits = keras.layers.Dense(V)(x)
    out = al.PointerGenerator(V)(logits, attention, source_ext, x)
    model = keras.Model([target_in, source_ext, attention], out)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    f = feed()
    ids = np.array([[2, 3, 0, 0], [2, 4, 5, 0], [2, 6, 3, 4]], "int32")
    inputs = [ids, f["source_ids"][[1, 1, 2]], f["attention"][[1, 1, 2]]]
    targets = np.array([[3, 4, 0, 0], [V + 1, 2, 3, 0], [2, V + 0, 4, 5]])
    garbage = np.where(ids == 0, V + 4, targets)  # no mass there: -1e9
    losses = [model.evaluate(inputs, y, verbose=0) for y in (targets, garbage)]
    assert losses[0] < 10
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
