"""Transformer blocks: the block equations, masks, cached decoding, the step
function for the decoders, and the contract clauses that fit."""

import json
import os

import keras
import numpy as np
import pytest

import attention_layers as al
from attention_layers.decoding import (
    beam_search,
    greedy_search,
    tile_beams,
    transformer_initial_state,
    transformer_step_fn,
)
from tests import contract

B, T, S, D = 3, 5, 6, 8


def np_(x):
    return keras.ops.convert_to_numpy(x)


def arrays(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    x = (scale * rng.normal(size=(B, T, D))).astype("float32")
    memory = (scale * rng.normal(size=(B, S, D))).astype("float32")
    return x, memory


def masks():
    """Padding at the end; batch row 0 of the decoder mask is unpadded."""
    dec = np.ones((B, T), bool)
    dec[1, -2:] = False
    dec[2, -1:] = False
    enc = np.ones((B, S), bool)
    enc[1, -3:] = False
    enc[2, -1:] = False
    return dec, enc


def encoder(**kw):
    return al.TransformerEncoderBlock(**{"num_heads": 2, "intermediate_dim": 16, **kw})


def decoder(**kw):
    return al.TransformerDecoderBlock(**{"num_heads": 2, "intermediate_dim": 16, **kw})


def jit(fn):
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn, jit_compile=True)


# -- the block equations ------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_equations(norm_first):
    block = encoder(norm_first=norm_first, activation="gelu")
    x, _ = arrays()
    out = np_(block(x))
    mha, ln1, ln2 = (
        block.self_attention,
        block.self_attention_norm,
        block.feed_forward_norm,
    )

    def ffn(y):
        return block.output_dense(block.intermediate_dense(y))

    if norm_first:
        h = x + mha(ln1(x), ln1(x))
        want = h + ffn(ln2(h))
    else:
        h = ln1(x + mha(x, x))
        want = ln2(h + ffn(h))
    np.testing.assert_allclose(out, np_(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_equations(norm_first):
    block = decoder(norm_first=norm_first)
    x, memory = arrays()
    out = np_(block(x, memory))
    sa, ca = block.self_attention, block.cross_attention
    ln1, ln2, ln3 = (
        block.self_attention_norm,
        block.cross_attention_norm,
        block.feed_forward_norm,
    )

    def ffn(y):
        return block.output_dense(block.intermediate_dense(y))

    if norm_first:
        h = x + sa(ln1(x), ln1(x), use_causal_mask=True)
        h = h + ca(ln2(h), memory)
        want = h + ffn(ln3(h))
    else:
        h = ln1(x + sa(x, x, use_causal_mask=True))
        h = ln2(h + ca(h, memory))
        want = ln3(h + ffn(h))
    np.testing.assert_allclose(out, np_(want), rtol=1e-5, atol=1e-5)


# -- masks ----------------------------------------------------------------------
def test_encoder_padding_mask():
    block = encoder()
    x, _ = arrays()
    dec, _ = masks()
    out, scores = block(x, padding_mask=dec, return_attention_scores=True)
    out, scores = np_(out), np_(scores)
    assert scores.shape == (B, 2, T, T)
    assert (out[~dec] == 0).all()
    assert (scores[1][..., 3:] == 0).all()  # padded keys get no weight
    # Whatever sits under the padding (NaN included) changes nothing.
    dirty = x.copy()
    dirty[~dec] = np.nan
    np.testing.assert_array_equal(np_(block(dirty, padding_mask=dec)), out)
    # The implicit mask of an Embedding(mask_zero=True) is the same mask.
    ids = np.where(dec, np.arange(1, T + 1)[None], 0)
    emb = keras.layers.Embedding(T + 1, D, mask_zero=True)
    implicit = np_(block(emb(ids)))
    explicit = np_(block(np_(emb(ids)), padding_mask=dec))
    np.testing.assert_array_equal(implicit, explicit)
    # and an attention_mask combines with it.
    causal = np.tril(np.ones((T, T), bool))[None].repeat(B, 0)
    _, scores = block(
        x, padding_mask=dec, attention_mask=causal, return_attention_scores=True
    )
    assert (np_(scores)[:, :, ~causal[0]] == 0).all()


def test_masks_in_a_functional_model():
    src = keras.Input(shape=(None,), dtype="int32")
    tgt = keras.Input(shape=(None,), dtype="int32")
    x = keras.layers.Embedding(20, D, mask_zero=True)(src)
    memory = encoder()(x)
    y = keras.layers.Embedding(20, D, mask_zero=True)(tgt)
    out, scores = decoder()(y, memory, return_attention_scores=True)
    model = keras.Model([src, tgt], [out, scores["alignment"]])
    src_ids = np.array([[3, 4, 5, 6], [7, 8, 0, 0]])
    tgt_ids = np.array([[1, 2, 3], [4, 0, 0]])
    out, alignment = model.predict([src_ids, tgt_ids], verbose=0)
    assert (out[1, 1:] == 0).all() and (out[0] != 0).any()
    assert (alignment[1, :, 2:] == 0).all()
    np.testing.assert_allclose(alignment[0].sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(alignment[1, 0].sum(-1), 1.0, rtol=1e-5)


def test_decoder_is_causal_and_masks_the_memory():
    block = decoder()
    x, memory = arrays()
    dec, enc = masks()
    out, scores = block(x, memory, dec, enc, return_attention_scores=True)
    perturbed = x.copy()
    perturbed[:, -1] += 10.0
    dirty = memory.copy()
    dirty[~enc] = np.nan
    out2 = block(perturbed, dirty, dec, enc)
    np.testing.assert_array_equal(np_(out)[:, :-1], np_(out2)[:, :-1])
    assert (np_(out)[~dec] == 0).all()
    alignment = np_(scores["alignment"])
    np.testing.assert_allclose(alignment, np_(scores["cross_attention"]).mean(1), 1e-6)
    assert (alignment[~dec] == 0).all()
    assert (alignment[1][:, ~enc[1]] == 0).all()
    np.testing.assert_allclose(alignment[0].sum(-1), 1.0, rtol=1e-5)
    upper = np.triu(np.ones((T, T), bool), 1)
    assert (np_(scores["self_attention"])[:, :, upper] == 0).all()


# -- cached decoding ------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("with_memory", [True, False])
def test_one_token_at_a_time_equals_the_full_call(norm_first, with_memory):
    block = decoder(norm_first=norm_first)
    x, memory = arrays()
    _, enc = masks()
    if with_memory:
        full = np_(block(x, memory, encoder_padding_mask=enc))
        cross = block.cross_attention.compute_cache(memory)
    else:
        full = np_(block(x))
        cross = None
    cache = block.self_attention.empty_cache(B, T + 2)  # longer than needed

    def step(xt, cache, index):
        kwargs = {}
        if with_memory:
            kwargs = {"cross_attention_cache": cross, "encoder_padding_mask": enc}
        out, cache, _ = block(
            xt,
            self_attention_cache=cache,
            self_attention_cache_update_index=index,
            **kwargs,
        )
        return out, cache

    compiled = jit(step)
    jit_cache = cache
    for t in range(T):
        out, cache = step(x[:, t : t + 1], cache, t)
        np.testing.assert_allclose(np_(out)[:, 0], full[:, t], rtol=1e-4, atol=1e-5)
        index = keras.ops.convert_to_tensor(t, "int32")
        out, jit_cache = compiled(x[:, t : t + 1], jit_cache, index)
        np.testing.assert_allclose(np_(out)[:, 0], full[:, t], rtol=1e-4, atol=1e-4)
    # Two tokens at a time through the cache as well.
    cache = block.self_attention.empty_cache(B, T)
    out, cache = step(x[:, :2], cache, 0)
    out2, _ = step(x[:, 2:4], cache, 2)
    np.testing.assert_allclose(np_(out2), full[:, 2:4], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_memory", [True, False])
def test_rotary_block_one_token_at_a_time_equals_the_full_call(with_memory):
    block = decoder(norm_first=True, rotary=True)
    x, memory = arrays()
    _, enc = masks()
    kwargs = {}
    if with_memory:
        full = np_(block(x, memory, encoder_padding_mask=enc))
        cross = block.cross_attention.compute_cache(memory)
        kwargs = {"cross_attention_cache": cross, "encoder_padding_mask": enc}
    else:
        full = np_(block(x))
    assert block.self_attention.rotary is not None
    if with_memory:
        assert block.cross_attention.rotary is None

    def step(xt, cache, index):
        out, cache, _ = block(
            xt,
            self_attention_cache=cache,
            self_attention_cache_update_index=index,
            **kwargs,
        )
        return out, cache

    # A prompt of 2 tokens through the cache, then one at a time, compiled
    # with a tensor index.
    compiled = jit(step)
    cache = block.self_attention.empty_cache(B, T + 1)
    out, cache = step(x[:, :2], cache, 0)
    np.testing.assert_allclose(np_(out), full[:, :2], rtol=1e-4, atol=1e-5)
    for t in range(2, T):
        index = keras.ops.convert_to_tensor(t, "int32")
        out, cache = compiled(x[:, t : t + 1], cache, index)
        np.testing.assert_allclose(np_(out)[:, 0], full[:, t], rtol=1e-4, atol=1e-4)


def test_rotary_encoder_block_is_order_aware():
    """Without positions an encoder block is permutation equivariant; rotary
    positions in its self-attention break that symmetry."""
    x, _ = arrays()
    block = encoder(rotary=True)
    plain = encoder()
    out, scores = block(x, return_attention_scores=True)
    plain(x)
    plain.set_weights(block.get_weights())
    assert not np.allclose(np_(plain(x)), np_(out), atol=1e-3)
    flipped = np_(plain(x[:, ::-1]))
    np.testing.assert_allclose(flipped[:, ::-1], np_(plain(x)), atol=1e-5)
    assert not np.allclose(np_(block(x[:, ::-1]))[:, ::-1], np_(out), atol=1e-3)
    assert tuple(scores.shape) == (B, 2, T, T)


# -- the step function for the decoders -----------------------------------------------
V = 11


def seq2seq(num_blocks=2, rotary=None):
    """With ``rotary`` the blocks rotate and no positions are added."""
    embedding = keras.layers.Embedding(V, D)
    blocks = [decoder(norm_first=True, rotary=rotary) for _ in range(num_blocks)]
    final_norm = keras.layers.LayerNormalization()
    dense = keras.layers.Dense(V)
    position = None if rotary else al.SinusoidalPositionEncoding()

    def full_logits(ids, memory, memory_mask):
        x = embedding(ids)
        if position is not None:
            x = x + position(x)
        for block in blocks:
            x = block(x, memory, encoder_padding_mask=memory_mask)
        return dense(final_norm(x))

    def projection(x):
        return dense(final_norm(x))

    return embedding, blocks, projection, position, full_logits


@pytest.mark.parametrize("rotary", [None, True])
def test_greedy_search_equals_argmax_of_the_full_model(rotary):
    _, memory = arrays(1, scale=3.0)
    _, enc = masks()
    embedding, blocks, projection, position, full_logits = seq2seq(rotary=rotary)
    start = np.array([1, 1, 1], "int32")
    full_logits(start[:, None], memory, enc)  # build
    max_length = 6
    step = transformer_step_fn(embedding, blocks, projection, position)
    state = transformer_initial_state(blocks, B, max_length, memory, enc)
    out = greedy_search(step, state, start, end_id=0, max_length=max_length)
    tokens = np_(out["tokens"])
    # Uncached reference: run the whole prefix and take the argmax. The
    # prefix is padded to one fixed shape (so it compiles once); the causal
    # mask keeps the padding out of the logits at position t.
    reference = jit(full_logits)
    ids = np.zeros((B, max_length), "int32")
    ids[:, 0] = start
    want = np.zeros((B, max_length), "int64")
    for t in range(max_length):
        want[:, t] = np_(reference(ids, memory, enc))[:, t].argmax(-1)
        if t + 1 < max_length:
            ids[:, t + 1] = want[:, t]
    lengths = np_(out["lengths"])
    for b in range(B):
        np.testing.assert_array_equal(tokens[b, : lengths[b]], want[b, : lengths[b]])
    alignments = np_(out["alignments"])
    assert alignments.shape == (B, max_length, S)
    assert (alignments[1][:, ~enc[1]] == 0).all()
    np.testing.assert_allclose(alignments[0, 0].sum(), 1.0, rtol=1e-5)
    # The same search compiled with XLA.
    compiled = jit(
        lambda m, k: greedy_search(
            step,
            transformer_initial_state(blocks, B, max_length, m, k),
            start,
            end_id=0,
            max_length=max_length,
        )["tokens"]
    )
    np.testing.assert_array_equal(np_(compiled(memory, enc)), tokens)


def test_beam_search_runs_on_tiled_state():
    _, memory = arrays(2)
    _, enc = masks()
    embedding, blocks, projection, position, full_logits = seq2seq(num_blocks=1)
    start = np.array([1, 1, 1], "int32")
    full_logits(start[:, None], memory, enc)
    step = transformer_step_fn(embedding, blocks, projection, position)
    state = transformer_initial_state(blocks, B, 5, memory, enc)
    out = beam_search(
        step, tile_beams(state, 3), start, end_id=0, max_length=5, beam_width=3
    )
    assert np_(out["tokens"]).shape[0] == B
    assert np.isfinite(np_(out["scores"])).all()
    # Beam width 1 is greedy search.
    greedy = greedy_search(step, state, start, end_id=0, max_length=5)
    one = beam_search(step, state, start, end_id=0, max_length=5, beam_width=1)
    np.testing.assert_array_equal(
        np_(one["tokens"]).reshape(B, -1), np_(greedy["tokens"])
    )


@pytest.mark.parametrize("rotary", [None, {"max_wavelength": 20}])
def test_decoder_only_step_function(rotary):
    embedding = keras.layers.Embedding(V, D)
    block = decoder(rotary=rotary)
    dense = keras.layers.Dense(V)
    start = np.array([1, 2, 3], "int32")
    x = embedding(start[:, None])
    block(x)
    step = transformer_step_fn(embedding, [block], dense)
    state = transformer_initial_state([block], B, 4)
    out = greedy_search(step, state, start, end_id=0, max_length=4)
    assert "alignments" not in out
    ids = start[:, None]
    for _ in range(4):
        logits = np_(dense(block(embedding(ids))))[:, -1]
        ids = np.concatenate([ids, logits.argmax(-1)[:, None]], axis=1)
    lengths = np_(out["lengths"])
    for b in range(B):
        np.testing.assert_array_equal(
            np_(out["tokens"])[b, : lengths[b]], ids[b, 1 : 1 + lengths[b]]
        )


# -- contract clauses that fit -------------------------------------------------------
KINDS = ["encoder", "decoder", "decoder_only"]


def make(kind, **kw):
    return encoder(**kw) if kind == "encoder" else decoder(**kw)


def feed(kind, scale=1.0):
    x, memory = arrays(scale=scale)
    dec, enc = masks()
    if kind == "encoder":
        return {"inputs": x, "padding_mask": dec}
    if kind == "decoder_only":
        return {"decoder_sequence": x, "decoder_padding_mask": dec}
    return {
        "decoder_sequence": x,
        "encoder_sequence": memory,
        "decoder_padding_mask": dec,
        "encoder_padding_mask": enc,
    }


def call(kind, layer, f, **kw):
    return layer(**f, **kw)


def model_for(kind, layer):
    inputs = {
        k: keras.Input(shape=v.shape[1:], name=k, dtype=v.dtype.name)
        for k, v in feed(kind).items()
    }
    return keras.Model(inputs, {"output": call(kind, layer, inputs)})


@pytest.mark.parametrize("kind", KINDS)
def test_config_round_trip(kind):
    layer = make(kind, norm_first=True, dropout=0.1, activation="gelu", key_dim=3)
    f = feed(kind)
    out = np_(call(kind, layer, f))
    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    call(kind, clone, f)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(np_(call(kind, clone, f)), out)
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    assert type(keras.saving.deserialize_keras_object(serialized)) is type(layer)


@pytest.mark.parametrize("kind", KINDS)
def test_rotary_config_round_trip(kind):
    layer = make(kind, rotary={"max_wavelength": 100, "interleaved": False})
    f = feed(kind)
    out = np_(call(kind, layer, f))
    config = layer.get_config()
    want = {"max_wavelength": 100, "scaling_factor": 1.0, "interleaved": False}
    assert config["rotary"] == want
    assert layer.self_attention.rotary == want
    if kind == "decoder":
        assert layer.cross_attention.rotary is None
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    call(kind, clone, f)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(np_(call(kind, clone, f)), out)


@pytest.mark.parametrize("rotary", [None, True])
@pytest.mark.parametrize("kind", KINDS)
def test_keras_file_round_trip(kind, rotary, tmp_path):
    model = model_for(kind, make(kind, rotary=rotary))
    f = feed(kind)
    expected = model.predict(f, verbose=0)["output"]
    path = os.path.join(tmp_path, f"{kind}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects
    np.testing.assert_array_equal(loaded.predict(f, verbose=0)["output"], expected)


# One fresh TensorFlow process, 8 to 20 s on two cores: make test-slow.
@pytest.mark.slow
@pytest.mark.tf_only
def test_saved_model_loads_without_the_library(tmp_path):
    """Both blocks exported, then served in one fresh process without the library."""
    models = {k: (model_for(k, make(k)), feed(k)) for k in ("encoder", "decoder")}
    contract.assert_served_without_library(models, tmp_path, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("kind", KINDS)
def test_mixed_precision(kind, policy):
    compute = policy.split("_")[1]
    f = feed(kind)
    reference = make(kind)
    want = np_(call(kind, reference, f))
    layer = make(kind, dtype=policy)
    call(kind, layer, f)
    layer.set_weights(reference.get_weights())
    assert all(w.dtype == "float32" for w in layer.weights)
    out = call(kind, layer, f)
    assert keras.backend.standardize_dtype(out.dtype) == compute
    tol = 3e-2 if compute == "float16" else 1.5e-1
    np.testing.assert_allclose(np_(keras.ops.cast(out, "float32")), want, atol=tol)
    big = np_(keras.ops.cast(call(kind, layer, feed(kind, scale=300.0)), "float32"))
    assert np.isfinite(big).all(), f"overflow under {policy}"


@pytest.mark.parametrize("kind", KINDS)
def test_jit_training(kind):
    layer = make(kind, dropout=0.1)
    f = {
        k: (v.astype("int32") if v.dtype == bool else v) for k, v in feed(kind).items()
    }
    inputs = {
        k: keras.Input(shape=v.shape[1:], name=k, dtype=v.dtype.name)
        for k, v in f.items()
    }
    out = keras.layers.Dense(1)(call(kind, layer, inputs))
    model = keras.Model(inputs, out)
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    before = [np_(w) for w in layer.trainable_weights]
    history = model.fit(f, np.ones((B, T, 1)), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    after = [np_(w) for w in layer.trainable_weights]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


# -- bad input ---------------------------------------------------------------------
def test_bad_input():
    err = contract.assert_clear_error
    x, memory = arrays()
    dec, _ = masks()
    enc_cls, dec_cls = al.TransformerEncoderBlock, al.TransformerDecoderBlock
    err(enc_cls, "inputs", lambda: encoder()(x[0]))
    err(enc_cls, "inputs", lambda: encoder()(x.astype("int32")))
    err(enc_cls, "padding_mask", lambda: encoder()(x, padding_mask=dec[:, :-1]))
    err(enc_cls, "key_dim", lambda: encoder()(x[..., :7]))
    err(enc_cls, "num_heads", lambda: encoder(num_heads=0))
    err(enc_cls, "dropout", lambda: encoder(dropout=1.0))
    err(enc_cls, "rotary", lambda: encoder(rotary="yes"))
    err(dec_cls, "rotary", lambda: decoder(rotary={"max_wavelength": 0}))
    err(enc_cls, "key_dim", lambda: encoder(key_dim=3, rotary=True))
    err(dec_cls, "key_dim", lambda: decoder(num_heads=8, rotary=True)(x))  # 8 / 8
    rotary = decoder(rotary=True)
    rotary(x, memory)
    assert rotary.cross_attention.rotary is None  # cross-attention never rotates
    err(dec_cls, "decoder_sequence", lambda: decoder()(x[0]))
    err(dec_cls, "encoder_sequence", lambda: decoder()(x, memory[0]))
    only = decoder()
    only(x)
    err(dec_cls, "encoder_sequence", lambda: only(x, memory))
    cross = decoder()
    cross(x, memory)
    err(dec_cls, "encoder_sequence", lambda: cross(x))
    cache = cross.self_attention.empty_cache(B, T)
    err(
        dec_cls,
        "self_attention_cache_update_index",
        lambda: cross(x, memory, self_attention_cache=cache),
    )
    err(dec_cls, "decoder_padding_mask", lambda: cross(x, memory, dec[:, :-1]))
    with pytest.raises(ValueError, match="built"):
        transformer_step_fn(keras.layers.Embedding(3, D), [decoder()], None)
