"""What a user can get wrong: each gets a clear error or a documented result.

Found by a user project written from the docs alone: weights that start
equal, sizes given as ``True``, a policy that did not reach the sublayers,
and decoding states that silently decode the wrong thing.
"""

import keras
import numpy as np
import pytest

import attention_layers as al
from attention_layers.decoding import (
    beam_search,
    greedy_search,
    rnn_step_fn,
    tile_beams,
    transformer_initial_state,
    transformer_step_fn,
)
from tests.contract import assert_clear_error

RNG = np.random.default_rng(3)


def numpy(variable):
    return keras.ops.convert_to_numpy(variable.value)


# -- initial weights -------------------------------------------------------------------


def test_bahdanau_and_hard_kernels_of_one_shape_start_different():
    x = RNG.normal(size=(2, 3, 8)).astype("float32")
    for layer in (al.BahdanauAttention(units=8), al.HardAttention(units=8)):
        layer(x, x)
        w1, w2 = numpy(layer.query_dense.kernel), numpy(layer.key_dense.kernel)
        assert w1.shape == w2.shape == (8, 8)
        assert not np.array_equal(w1, w2), type(layer).__name__


@pytest.mark.parametrize("score_mode", ["general", "concat"])
def test_local_p_weights_of_one_shape_start_different(score_mode):
    x = RNG.normal(size=(2, 5, 4)).astype("float32")
    layer = al.LocalAttention("predictive", window=2, score_mode=score_mode, units=4)
    layer(x, x)
    if score_mode == "general":  # W_a [Dk, Dq] and W_p [Dq, units]
        a, b = numpy(layer.W_a.kernel), numpy(layer.W_p)
    else:
        a, b = numpy(layer.v_a), numpy(layer.v_p)
    assert a.shape == b.shape and not np.array_equal(a, b)


def test_a_seeded_initializer_gives_reproducible_distinct_kernels():
    x = RNG.normal(size=(2, 3, 8)).astype("float32")
    runs = []
    for _ in range(2):
        layer = al.BahdanauAttention(
            units=8, kernel_initializer=keras.initializers.GlorotUniform(seed=5)
        )
        layer(x, x)
        runs.append((numpy(layer.query_dense.kernel), numpy(layer.key_dense.kernel)))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])  # reproducible
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    assert not np.array_equal(runs[0][0], runs[0][1])  # W1 != W2


# -- sizes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda v: al.BahdanauAttention(units=v), "units"),
        (lambda v: al.LuongAttention("general", units=v), "units"),
        (lambda v: al.LocalAttention("predictive", units=v), "units"),
        (lambda v: al.LocalAttention("monotonic", window=v), "window"),
        (lambda v: al.MultiHeadAttention(2, 4, value_dim=v), "value_dim"),
        (lambda v: al.MultiHeadAttention(num_heads=v, key_dim=4), "num_heads"),
        (lambda v: al.MultiHeadAttention(2, 4, output_shape=v), "output_shape"),
        (lambda v: al.AttentionPooling(units=v), "units"),
        (lambda v: al.PositionEmbedding(sequence_length=v), "sequence_length"),
        (lambda v: al.TransformerDecoderBlock(num_heads=2, intermediate_dim=v),
         "intermediate_dim"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("value", [True, 0, -2, 2.0, "8"])
def test_sizes_must_be_positive_integers(make, argument, value):
    with pytest.raises(ValueError) as error:
        make(value)
    message = str(error.value)
    assert f"`{argument}" in message and "a positive integer" in message
    assert f"received {value!r}" in message


def test_numpy_integers_are_sizes_too():
    assert al.BahdanauAttention(units=np.int64(4)).units == 4


@pytest.mark.parametrize("make", [al.LuongAttention, al.LocalAttention])
def test_scale_is_a_deprecated_alias_of_use_scale(make):
    """``use_scale`` is Keras' name for the learned score scale; ``scale``, the
    former name, still works (with a warning) and old configs still load."""
    with pytest.warns(DeprecationWarning, match="use `use_scale`"):
        layer = make(score_mode="general", scale=True)
    assert layer.use_scale is True
    config = layer.get_config()
    assert "scale" not in config and config["use_scale"] is True
    old = {**config, "scale": config.pop("use_scale")}
    with pytest.warns(DeprecationWarning):
        restored = make.from_config(old)
    x = RNG.normal(size=(2, 3, 4)).astype("float32")
    restored(x, x)
    assert "g" in [w.name for w in restored.weights]


def test_attention_must_be_a_layer_not_its_name():
    assert_clear_error(
        al.AttentionRNNCell,
        "attention",
        lambda: al.AttentionRNNCell(keras.layers.GRUCell(4), "bahdanau"),
    )


# -- dtype policy ----------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_the_decoder_policy_reaches_the_cell_and_the_attention(policy):
    cell = al.AttentionRNNCell(
        keras.layers.GRUCell(4), al.BahdanauAttention(units=4), output_units=4
    )
    decoder = al.AttentionDecoder(cell, dtype=policy)
    target = RNG.normal(size=(2, 3, 5)).astype("float32")
    memory = RNG.normal(size=(2, 4, 6)).astype("float32")
    outputs = decoder(target, memory)
    for layer in (decoder, cell, cell.cell, cell.attention, cell.attention.query_dense):
        assert layer.dtype_policy.name == policy, layer.name
    compute = policy.removeprefix("mixed_")
    assert keras.backend.standardize_dtype(outputs.dtype) == compute


def test_a_sublayer_policy_set_on_purpose_is_kept():
    attention = al.BahdanauAttention(units=4, dtype="float32")
    cell = al.AttentionRNNCell(keras.layers.GRUCell(4), attention, output_units=4)
    al.AttentionDecoder(cell, dtype="mixed_bfloat16")
    assert cell.cell.dtype_policy.name == "mixed_bfloat16"
    assert attention.dtype_policy.name == "float32"


# -- decoding --------------------------------------------------------------------------


def test_a_cache_index_past_the_end_is_refused():
    layer = al.MultiHeadAttention(num_heads=2, key_dim=4)
    x = RNG.normal(size=(2, 1, 8)).astype("float32")
    cache = layer.empty_cache(2, 3)
    out, cache = layer(x, x, cache=cache, cache_update_index=2, use_causal_mask=True)
    for index in (3, -1):
        assert_clear_error(
            al.MultiHeadAttention,
            "cache_update_index",
            lambda i=index: layer(x, x, cache=cache, cache_update_index=i),
        )
    two = RNG.normal(size=(2, 2, 8)).astype("float32")  # 2 tokens from index 2
    assert_clear_error(
        al.MultiHeadAttention,
        "cache_update_index",
        lambda: layer(two, two, cache=cache, cache_update_index=2),
    )


def _transformer(batch=2):
    memory = RNG.normal(size=(batch, 5, 8)).astype("float32")
    block = al.TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    embedding, projection = keras.layers.Embedding(7, 8), keras.layers.Dense(7)
    block(embedding(np.zeros((batch, 1), "int32")), memory)
    step = transformer_step_fn(embedding, [block], projection)
    return block, step, memory


def test_a_transformer_state_shorter_than_the_decoding_is_refused():
    block, step, memory = _transformer()
    state = transformer_initial_state([block], 2, 3, memory)
    starts = np.array([1, 1])
    with pytest.raises(ValueError, match="caches hold 3 positions, fewer than max"):
        greedy_search(step, state, starts, end_id=2, max_length=4)
    with pytest.raises(ValueError, match="caches hold 3 positions"):
        beam_search(step, tile_beams(state, 2), starts, 2, 4, beam_width=2)
    # A state as long as the decoding passes: tests/test_transformer.py.


@pytest.mark.parametrize("batch", [1, 2])
def test_beam_search_refuses_a_state_not_tiled_over_the_beams(batch):
    memory = RNG.normal(size=(batch, 4, 6)).astype("float32")
    cell = al.AttentionRNNCell(
        keras.layers.GRUCell(4), al.BahdanauAttention(units=4), output_units=4
    )
    decoder = al.AttentionDecoder(cell)
    decoder(RNG.normal(size=(batch, 2, 5)).astype("float32"), memory)
    embedding, projection = keras.layers.Embedding(7, 5), keras.layers.Dense(7)
    step = rnn_step_fn(embedding, cell, projection, tile_beams(memory, 3))
    starts = np.ones((batch,), "int32")
    with pytest.raises(ValueError, match=f"must have {batch * 3} rows.*tile_beams"):
        beam_search(step, decoder.initial_states(batch), starts, 2, 4, beam_width=3)
    # A tiled state passes: tests/test_decoding.py.
