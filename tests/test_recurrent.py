"""AttentionRNNCell and AttentionDecoder: the step formula and the sequence loop."""

import keras
import numpy as np
import pytest

import attention_layers as al
from attention_layers.recurrent import AttentionDecoder, AttentionRNNCell

RNG = np.random.default_rng(3)
TARGET = RNG.normal(size=(2, 4, 5)).astype("float32")
MEMORY = RNG.normal(size=(2, 6, 8)).astype("float32")
MEMORY_MASK = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)


def make_decoder(cell_cls=keras.layers.GRUCell, **kwargs):
    cell = AttentionRNNCell(cell_cls(8), al.BahdanauAttention(units=4), **kwargs)
    return AttentionDecoder(cell)


@pytest.mark.parametrize("cell_cls", [keras.layers.GRUCell, keras.layers.LSTMCell])
@pytest.mark.parametrize("input_feeding", [True, False])
def test_decoder_equals_cell_loop(cell_cls, input_feeding):
    decoder = make_decoder(cell_cls, output_units=7, input_feeding=input_feeding)
    outputs, alignments = decoder(
        TARGET, MEMORY, value_mask=MEMORY_MASK, return_attention_scores=True
    )
    states = decoder.initial_states(2)
    for t in range(TARGET.shape[1]):
        out, states, weights = decoder.cell(
            TARGET[:, t], states, MEMORY, memory_mask=MEMORY_MASK
        )
        np.testing.assert_allclose(outputs[:, t], out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(alignments[:, t], weights, rtol=1e-5, atol=1e-6)
    # Padding of the source never receives weight.
    assert (np.asarray(alignments)[0, :, 4:] == 0).all()


@pytest.mark.parametrize(
    "attention",
    [
        lambda: al.LuongAttention("general"),
        lambda: al.LuongAttention("concat", units=4),
        lambda: al.LocalAttention(mode="predictive", window=2, units=4),
    ],
    ids=["luong_general", "luong_concat", "local_p"],
)
def test_without_input_feeding_attention_over_all_steps_equals_the_loop(attention):
    """No input feeding: the attention runs once over all steps, as the cell would."""
    cell = AttentionRNNCell(
        keras.layers.GRUCell(8), attention(), output_units=7, input_feeding=False
    )
    decoder = AttentionDecoder(cell)
    query_mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    h0 = RNG.normal(size=(2, 8)).astype("float32")
    outputs, alignments, final = decoder(
        TARGET,
        MEMORY,
        query_mask=query_mask,
        value_mask=MEMORY_MASK,
        initial_state=[h0],
        return_attention_scores=True,
        return_state=True,
    )
    states = decoder.initial_states(2, [h0])
    for t in range(TARGET.shape[1]):
        out, new, weights = cell(TARGET[:, t], states, MEMORY, memory_mask=MEMORY_MASK)
        keep = query_mask[:, t : t + 1]
        states = [np.where(keep, n, o) for n, o in zip(new, states, strict=True)]
        np.testing.assert_allclose(
            outputs[:, t], np.where(keep, out, 0), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            alignments[:, t], np.where(keep, weights, 0), rtol=1e-5, atol=1e-6
        )
    np.testing.assert_allclose(final[0], states[0], rtol=1e-5, atol=1e-6)


def test_step_formula_by_hand():
    """o_i = tanh(W_o [z_i; c_i]) with z_i the GRU state and c_i Bahdanau's context."""
    cell = AttentionRNNCell(
        keras.layers.GRUCell(8), al.BahdanauAttention(units=4), output_units=7
    )
    cell.build((2, 5), None, MEMORY.shape)
    states = cell.get_initial_state(2)
    out, new_states, weights = cell(TARGET[:, 0], states, MEMORY)
    # Recompute each piece with the sublayers, by the formula.
    gru = keras.layers.GRUCell(8)
    gru.build((2, 5 + 7))
    gru.set_weights(cell.cell.get_weights())
    z, _ = gru(
        np.concatenate([TARGET[:, 0], np.zeros((2, 7), "float32")], -1),
        [np.zeros((2, 8), "float32")],
    )
    context, w = cell.attention(z, MEMORY, return_attention_scores=True)
    kernel = cell.output_dense.kernel.numpy()
    expected = np.tanh(
        np.concatenate([np.asarray(z), np.asarray(context)], -1) @ kernel
    )
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights, w, rtol=1e-6)
    np.testing.assert_allclose(new_states[-1], out)  # input feeding carries o_i


def test_masked_target_steps_keep_the_state():
    decoder = make_decoder(output_units=7)
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)
    outputs, alignments, states = decoder(
        TARGET,
        MEMORY,
        query_mask=mask,
        return_attention_scores=True,
        return_state=True,
    )
    _, _, states2 = decoder(
        TARGET[:, :2], MEMORY, return_attention_scores=True, return_state=True
    )
    np.testing.assert_allclose(states[0][0], states2[0][0], rtol=1e-6)
    assert (np.asarray(outputs)[0, 2:] == 0).all()
    assert (np.asarray(alignments)[0, 2:] == 0).all()


@pytest.mark.parametrize("input_feeding", [True, False])
def test_a_step_from_a_masking_embedding_decodes_without_warnings(input_feeding):
    # Decoding embeds one token per step with the training Embedding
    # (mask_zero=True); the wrapped cell must not be handed that mask.
    import warnings

    from attention_layers.decoding import greedy_search, rnn_step_fn

    cell = AttentionRNNCell(
        keras.layers.GRUCell(8),
        al.BahdanauAttention(units=4),
        input_feeding=input_feeding,
    )
    cell.build((2, 5), None, MEMORY.shape)
    embedding = keras.layers.Embedding(6, 5, mask_zero=True)
    step = rnn_step_fn(embedding, cell, keras.layers.Dense(6), MEMORY, MEMORY_MASK)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = greedy_search(
            step, cell.get_initial_state(2), np.array([1, 0]), end_id=2, max_length=3
        )
    assert tuple(out["tokens"].shape) == (2, 3)


def test_initial_state_and_errors():
    decoder = make_decoder(output_units=7)
    h0 = RNG.normal(size=(2, 8)).astype("float32")
    a = decoder(TARGET, MEMORY, initial_state=[h0])
    b = decoder(TARGET, MEMORY)
    assert not np.allclose(a, b)
    with pytest.raises(ValueError, match="initial_state"):
        decoder(TARGET, MEMORY, initial_state=[h0, h0])
    with pytest.raises(ValueError, match="`value`"):
        decoder(TARGET, MEMORY[0])
    with pytest.raises(ValueError, match="`cell`"):
        AttentionDecoder(keras.layers.GRUCell(4))


def test_trains_and_round_trips_as_keras_file(tmp_path):
    src = keras.Input((None,), dtype="int32")
    tgt = keras.Input((None,), dtype="int32")
    memory = keras.layers.Embedding(20, 8, mask_zero=True)(src)
    target = keras.layers.Embedding(20, 5, mask_zero=True)(tgt)
    outputs = AttentionDecoder(
        AttentionRNNCell(
            keras.layers.GRUCell(8), al.LuongAttention("general"), output_units=8
        ),
        learn_initial_state=True,
    )(target, memory)
    model = keras.Model([src, tgt], keras.layers.Dense(20)(outputs))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = [RNG.integers(1, 20, size=(8, 6)), RNG.integers(1, 20, size=(8, 4))]
    x[0][:, 4:] = 0
    model.fit(x, RNG.integers(0, 20, size=(8, 4)), epochs=1, verbose=0)
    path = tmp_path / "decoder.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(
        model.predict(x, verbose=0), loaded.predict(x, verbose=0), rtol=1e-6
    )
