"""Greedy search, beam search (GNMT penalties) and sampling on toy step functions.

The toy step functions read the next-token log-probabilities from a fixed
transition table (a bigram model), so every expected number is computed by
hand from the table.
"""

import keras
import numpy as np
import pytest
from keras import ops

import attention_layers as al
from attention_layers.decoding import (
    beam_search,
    gnmt_coverage_penalty,
    gnmt_length_penalty,
    greedy_search,
    rnn_step_fn,
    sample,
    tile_beams,
)
from attention_layers.recurrent import AttentionDecoder, AttentionRNNCell

START, END, A, B, C = 0, 1, 2, 3, 4


def table(rows):
    probs = np.asarray(rows, "float64") + 1e-6  # no exact zero
    probs /= probs.sum(-1, keepdims=True)
    return np.log(probs).astype("float32")


# From START, A is locally best (0.5) but A ends badly; START B END is best.
LOGP = table(
    [
        [0.0, 0.0, 0.5, 0.4, 0.1],  # START
        [0.0, 1.0, 0.0, 0.0, 0.0],  # END
        [0.0, 0.3, 0.26, 0.24, 0.2],  # A
        [0.0, 0.9, 0.05, 0.03, 0.02],  # B
        [0.0, 0.6, 0.2, 0.1, 0.1],  # C
    ]
)
# For the penalties: [END] beats [A END] on log-probability alone.
LOGP2 = table(
    [
        [0.0, 0.5, 0.5, 0.0, 0.0],  # START
        [0.0, 1.0, 0.0, 0.0, 0.0],  # END
        [0.0, 0.8, 0.2, 0.0, 0.0],  # A
        [0.0, 1.0, 0.0, 0.0, 0.0],
        [0.0, 1.0, 0.0, 0.0, 0.0],
    ]
)


def bigram_step(logp, alignment=None):
    def step_fn(ids, state):
        align = None if alignment is None else ops.take(alignment, ids, axis=0)
        return ops.take(logp, ids, axis=0), state, align

    return step_fn


def history_step(logp, length):
    """A step whose alignment is the token history (ids + 1) so far."""

    def step_fn(ids, state):
        t = state["t"]
        at_t = ops.expand_dims(ops.arange(length), 0) == ops.expand_dims(t, 1)
        history = ops.where(
            at_t, ops.cast(ops.expand_dims(ids, 1) + 1, "float32"), state["history"]
        )
        new_state = {"t": t + 1, "history": history}
        return ops.take(logp, ids, axis=0), new_state, history

    return step_fn


def history_state(n, length):
    return {"t": np.zeros((n,), "int32"), "history": np.zeros((n, length), "float32")}


def seq_logp(logp, start, seq):
    prev, total = start, 0.0
    for token in seq:
        total += float(logp[prev, token])
        prev = token
    return total


def npy(out):
    return {k: np.asarray(v) for k, v in out.items()}


def test_beam_finds_the_best_sequence_greedy_misses():
    starts = np.array([C, START])
    greedy = npy(greedy_search(bigram_step(LOGP), (), starts, END, 4))
    beam = npy(beam_search(bigram_step(LOGP), (), starts, END, 4, beam_width=2))
    # Greedy takes A first and ends with probability 0.5 * 0.3.
    assert greedy["tokens"].tolist() == [[END, END, END, END], [A, END, END, END]]
    assert greedy["lengths"].tolist() == [1, 2]
    np.testing.assert_allclose(
        greedy["scores"],
        [seq_logp(LOGP, C, [END]), seq_logp(LOGP, START, [A, END])],
        rtol=1e-5,
    )
    np.testing.assert_allclose(greedy["scores"][1], np.log(0.15), rtol=1e-4)
    # Beam search keeps B (0.4) and finds START B END, 0.4 * 0.9 = 0.36.
    assert beam["tokens"].shape == (2, 2, 4)
    assert beam["tokens"][1].tolist() == [[B, END, END, END], [A, END, END, END]]
    assert beam["lengths"][1].tolist() == [2, 2]
    np.testing.assert_allclose(beam["log_probs"][1], np.log([0.36, 0.15]), rtol=1e-4)
    np.testing.assert_allclose(beam["scores"], beam["log_probs"], rtol=1e-6)
    assert beam["tokens"][0, 0].tolist() == [END] * 4
    assert beam["scores"][1, 0] > greedy["scores"][1]


def test_beam_width_one_is_greedy():
    starts = np.array([C, START, A])
    greedy = npy(greedy_search(bigram_step(LOGP), (), starts, END, 5))
    beam = npy(beam_search(bigram_step(LOGP), (), starts, END, 5, beam_width=1))
    np.testing.assert_array_equal(beam["tokens"][:, 0], greedy["tokens"])
    np.testing.assert_array_equal(beam["lengths"][:, 0], greedy["lengths"])
    np.testing.assert_allclose(beam["scores"][:, 0], greedy["scores"], rtol=1e-6)


@pytest.mark.parametrize("min_length", [0, 1, 2])
def test_min_length_holds_the_end_back_and_keeps_the_model_scores(min_length):
    """From START, END and A are equally likely; A then ends with 0.8, or
    goes on with A at 0.2. Before min_length tokens END cannot be chosen."""
    starts = np.array([START])
    tokens = {0: [END], 1: [A, END], 2: [A, A, END]}[min_length]
    expected = seq_logp(LOGP2, START, tokens)
    padded = tokens + [END] * (4 - len(tokens))
    greedy = npy(greedy_search(bigram_step(LOGP2), (), starts, END, 4, min_length))
    assert greedy["tokens"].tolist() == [padded]
    assert greedy["lengths"].tolist() == [len(tokens)]
    # The score is the model's log-probability, not renormalised.
    np.testing.assert_allclose(greedy["scores"], [expected], rtol=1e-5)
    beam = npy(
        beam_search(
            bigram_step(LOGP2), (), starts, END, 4, 2, min_length=ops.array(min_length)
        )
    )
    assert beam["tokens"][0, 0].tolist() == padded
    np.testing.assert_allclose(beam["log_probs"][0, 0], expected, rtol=1e-5)
    assert (beam["lengths"][0] > min_length).all()
    sampled = npy(
        sample(bigram_step(LOGP2), (), starts, END, 4, top_k=1, seed=0,
               min_length=min_length)
    )  # fmt: skip
    if min_length:
        assert sampled["tokens"].tolist() == [padded]
    else:  # END and A tie at the first step: top-1 keeps both
        assert sampled["tokens"][0, 0] in (END, A)


def test_min_length_out_of_range_is_refused():
    for fn in (greedy_search, beam_search):
        extra = {"beam_width": 2} if fn is beam_search else {}
        with pytest.raises(ValueError, match=r"min_length.*\[0, max_length=4\]"):
            fn(bigram_step(LOGP), (), np.array([START]), END, 4, min_length=5, **extra)


@pytest.mark.parametrize("width", [1, 2, 3])
def test_num_beams_at_run_time_equals_that_static_width(width):
    """beam_width=4 buffers with num_beams=w give beam search of width w."""
    starts = np.array([C, START, A])
    step = history_step(LOGP, 6)
    static = npy(beam_search(step, history_state(3 * width, 6), starts, END, 6, width))
    dynamic = npy(
        beam_search(
            step, history_state(12, 6), starts, END, 6, 4, num_beams=np.int32(width)
        )
    )
    for key in ("tokens", "lengths", "alignments"):
        np.testing.assert_array_equal(dynamic[key][:, :width], static[key])
    np.testing.assert_allclose(
        dynamic["scores"][:, :width], static["scores"], rtol=1e-6
    )
    assert (dynamic["scores"][:, width:] < -1e8).all()


def test_length_penalty_changes_the_ranking_by_the_formula():
    step = bigram_step(LOGP2)
    start = np.array([START])
    plain = npy(beam_search(step, (), start, END, 3, beam_width=2))
    assert plain["tokens"][0, :, :2].tolist() == [[END, END], [A, END]]
    np.testing.assert_allclose(plain["scores"][0], np.log([0.5, 0.4]), rtol=1e-4)
    # alpha = 2: lp(1) = 1, lp(2) = (7 / 6)^2, so
    # [END]: log 0.5 = -0.6931 and [A END]: log 0.4 / 1.3611 = -0.6732.
    alpha = ops.convert_to_tensor(2.0)  # a tensor, as at serving time
    ranked = npy(beam_search(step, (), start, END, 3, 2, length_penalty=alpha))
    assert ranked["tokens"][0, :, :2].tolist() == [[A, END], [END, END]]
    np.testing.assert_allclose(ranked["scores"][0], [-0.6732, -0.6931], atol=1e-4)
    np.testing.assert_allclose(ranked["log_probs"][0], np.log([0.4, 0.5]), rtol=1e-4)
    assert ranked["lengths"][0].tolist() == [2, 1]
    np.testing.assert_allclose(
        np.asarray(gnmt_length_penalty(np.array([1, 2]), 2.0)),
        [1.0, (7 / 6) ** 2],
        rtol=1e-6,
    )


def test_coverage_penalty_changes_the_ranking_by_the_formula():
    # Every step attends [0.5, 0.5] over two real source words; the third
    # source position is padding (never attended) and is left out.
    attend = np.tile(np.array([[0.5, 0.5, 0.0]], "float32"), (5, 1))
    step = bigram_step(LOGP2, attend)
    start = np.array([START])
    plain = npy(beam_search(step, (), start, END, 3, beam_width=2))
    assert plain["tokens"][0, :, :2].tolist() == [[END, END], [A, END]]
    np.testing.assert_allclose(plain["scores"][0], np.log([0.5, 0.4]), rtol=1e-4)
    # beta = 1: [END] covers [0.5, 0.5]: cp = 2 log 0.5 = -1.3863, score
    # -0.6931 - 1.3863 = -2.0794; [A END] covers [1, 1]: cp = 0, score -0.9163.
    ranked = npy(beam_search(step, (), start, END, 3, 2, coverage_penalty=1.0))
    assert ranked["tokens"][0, :, :2].tolist() == [[A, END], [END, END]]
    np.testing.assert_allclose(ranked["scores"][0], [-0.9163, -2.0794], atol=1e-4)
    np.testing.assert_allclose(
        float(gnmt_coverage_penalty(np.array([0.5, 0.5, 0.0]), 1.0)),
        2 * np.log(0.5),
        rtol=1e-6,
    )
    # Both penalties: score = log P / lp + cp. [END] (-2.0794) now loses to
    # [A A END]: log(0.5 * 0.2 * 0.8) / (8 / 6)^2 + 0 = -1.4207.
    both = npy(beam_search(step, (), start, END, 3, 2, 2.0, 1.0))
    assert both["tokens"][0].tolist() == [[A, END, END], [A, A, END]]
    np.testing.assert_allclose(
        both["scores"][0],
        [np.log(0.4) / (7 / 6) ** 2, np.log(0.08) / (8 / 6) ** 2],
        atol=1e-4,
    )


def test_penalties_of_zero_as_numbers_or_tensors_agree():
    # A Python 0 leaves the penalty out of the graph; a tensor 0 computes it.
    width, length = 3, 4
    starts = np.array([START, C])
    step = history_step(LOGP, length)

    def search(alpha, beta):
        state = history_state(2 * width, length)
        return npy(beam_search(step, state, starts, END, length, width, alpha, beta))

    plain = search(0.0, 0)
    zero = ops.convert_to_tensor(0.0)
    computed = search(zero, zero)
    for key in plain:
        np.testing.assert_allclose(plain[key], computed[key], rtol=1e-6, err_msg=key)


def test_coverage_penalty_without_alignments_is_an_error():
    with pytest.raises(ValueError, match="coverage_penalty"):
        beam_search(bigram_step(LOGP), (), np.array([0]), END, 3, 2, 0.0, 0.5)


def expected_history(start, tokens, length, width):
    """The alignment of output position t: [start, y_0 .. y_{t-1}] + 1."""
    out = np.zeros((len(tokens), width), "float32")
    prev = [start] + list(tokens)
    for t in range(length):
        out[t, : t + 1] = np.array(prev[: t + 1]) + 1
    return out


@pytest.mark.parametrize("width", [2, 3])
def test_alignments_are_reordered_with_the_beams(width):
    length = 4
    starts = np.array([START, C])
    out = npy(
        beam_search(
            history_step(LOGP, length),
            history_state(2 * width, length),
            starts,
            END,
            length,
            beam_width=width,
        )
    )
    assert out["alignments"].shape == (2, width, length, length)
    for b in range(2):
        for k in range(width):
            expected = expected_history(
                starts[b], out["tokens"][b, k], out["lengths"][b, k], length
            )
            np.testing.assert_array_equal(out["alignments"][b, k], expected)
    # Width 3 at step 1 keeps START B END (parent beam 1) first, then two
    # children of beam 0: the beams were reordered.
    if width == 3:
        assert out["tokens"][0, :, :3].tolist() == [
            [B, END, END],
            [A, END, END],
            [A, A, END],
        ]
    greedy = npy(
        greedy_search(
            history_step(LOGP, length), history_state(2, length), starts, END, length
        )
    )
    for b in range(2):
        expected = expected_history(
            starts[b], greedy["tokens"][b], greedy["lengths"][b], length
        )
        np.testing.assert_array_equal(greedy["alignments"][b], expected)


def test_sampling_top_k_one_is_greedy():
    starts = np.array([C, START, A, B])
    greedy = npy(greedy_search(bigram_step(LOGP), (), starts, END, 5))
    sampled = npy(sample(bigram_step(LOGP), (), starts, END, 5, top_k=1, seed=3))
    for key in ("tokens", "lengths"):
        np.testing.assert_array_equal(sampled[key], greedy[key])
    np.testing.assert_allclose(sampled["scores"], greedy["scores"], rtol=1e-6)


def test_sampling_frequencies_follow_the_tempered_softmax():
    n = 4000
    starts = np.full((n,), START)
    out = npy(sample(bigram_step(LOGP), (), starts, END, 1, temperature=2.0, seed=1))
    freq = np.bincount(out["tokens"][:, 0], minlength=5) / n
    tempered = np.exp(LOGP[START] / 2.0)
    np.testing.assert_allclose(freq, tempered / tempered.sum(), atol=0.03)
    # Reproducible with the same seed, different with another.
    again = npy(sample(bigram_step(LOGP), (), starts, END, 1, temperature=2.0, seed=1))
    np.testing.assert_array_equal(again["tokens"], out["tokens"])
    # Scores are the model's log-probabilities, not the tempered ones.
    np.testing.assert_allclose(
        out["scores"], LOGP[START][out["tokens"][:, 0]], rtol=1e-6
    )


def test_sampling_top_k_and_nucleus_filter():
    n = 2000
    starts = np.full((n,), START)
    gen = keras.random.SeedGenerator(5)
    top2 = npy(sample(bigram_step(LOGP), (), starts, END, 1, top_k=2, seed=gen))
    freq = np.bincount(top2["tokens"][:, 0], minlength=5) / n
    np.testing.assert_allclose(freq, [0, 0, 5 / 9, 4 / 9, 0], atol=0.04)
    # Nucleus 0.8 over (0.5, 0.4, 0.1): A and B (0.5 < 0.8 before B).
    nucleus = npy(sample(bigram_step(LOGP), (), starts, END, 1, top_p=0.8, seed=gen))
    freq = np.bincount(nucleus["tokens"][:, 0], minlength=5) / n
    np.testing.assert_allclose(freq, [0, 0, 5 / 9, 4 / 9, 0], atol=0.04)
    narrow = npy(sample(bigram_step(LOGP), (), starts, END, 1, top_p=0.3, seed=gen))
    assert (narrow["tokens"][:, 0] == A).all()


@pytest.mark.tf_only
def test_xla_compiled_equals_eager():
    import tensorflow as tf

    length = 4
    starts = np.array([START, C, A])
    step = history_step(LOGP, length)

    @tf.function(jit_compile=True)
    def compiled_greedy(starts):
        return greedy_search(step, history_state(3, length), starts, END, length)

    @tf.function(jit_compile=True)
    def compiled_beam(starts, alpha, beta):
        state = history_state(6, length)
        return beam_search(bigram_step(LOGP), state, starts, END, length, 2, alpha, 0.0)

    eager = npy(greedy_search(step, history_state(3, length), starts, END, length))
    jitted = npy(compiled_greedy(tf.constant(starts, tf.int32)))
    for key in eager:
        np.testing.assert_allclose(jitted[key], eager[key], rtol=1e-6)
    eager = npy(beam_search(bigram_step(LOGP), (), starts, END, length, 2, 1.0))
    jitted = npy(compiled_beam(tf.constant(starts, tf.int32), 1.0, 0.0))
    for key in eager:
        np.testing.assert_allclose(jitted[key], eager[key], rtol=1e-6)


VOCAB = 7


def make_rnn():
    rng = np.random.default_rng(7)
    memory = rng.normal(size=(2, 5, 8)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    embedding = keras.layers.Embedding(VOCAB, 6)
    cell = AttentionRNNCell(
        keras.layers.GRUCell(8), al.BahdanauAttention(units=4), output_units=6
    )
    decoder = AttentionDecoder(cell)
    decoder.build((2, 1, 6), memory.shape)
    projection = keras.layers.Dense(VOCAB)
    projection.build((None, 6))
    return embedding, decoder, projection, memory, mask


def test_rnn_greedy_equals_a_python_loop():
    embedding, decoder, projection, memory, mask = make_rnn()
    length = 6
    starts = np.array([1, 2], "int32")
    # Free-running argmax loop, step by step with the cell.
    states, ids, free, free_scores = decoder.initial_states(2), starts, [], []
    for _ in range(length):
        out, states, _ = decoder.cell(embedding(ids), states, memory, memory_mask=mask)
        logp = ops.convert_to_numpy(ops.log_softmax(projection(out), axis=-1))
        ids = logp.argmax(-1).astype("int32")
        free.append(ids)
        free_scores.append(logp[np.arange(2), ids])
    free, free_scores = np.stack(free, 1), np.stack(free_scores, 1)
    end_id = int(free[0, 1])  # row 0 ends at its second token
    expected = np.full_like(free, end_id)
    expected_scores = np.zeros(2)
    for b in range(2):
        stop = (list(free[b]) + [end_id]).index(end_id)
        n = min(stop + 1, length)
        expected[b, :n] = free[b, :n]
        expected_scores[b] = free_scores[b, :n].sum()

    step = rnn_step_fn(embedding, decoder.cell, projection, memory, mask)
    greedy = npy(greedy_search(step, decoder.initial_states(2), starts, end_id, length))
    np.testing.assert_array_equal(greedy["tokens"], expected)
    np.testing.assert_allclose(greedy["scores"], expected_scores, rtol=1e-5)
    assert greedy["lengths"][0] <= 2
    # Source padding never receives attention.
    assert (greedy["alignments"][0, :, 3:] == 0).all()

    # Beam search with tiled memory and state: the hypotheses are sorted and
    # their alignments sum to 1 up to the end, 0 after.
    width = 3
    beam_step = rnn_step_fn(
        embedding,
        decoder.cell,
        projection,
        tile_beams(memory, width),
        tile_beams(mask, width),
    )
    state = tile_beams(decoder.initial_states(2), width)
    beam = npy(beam_search(beam_step, state, starts, end_id, length, width, 0.6, 0.2))
    assert beam["tokens"].shape == (2, width, length)
    assert (np.diff(beam["scores"], axis=1) <= 1e-6).all()
    sums = beam["alignments"].sum(-1)
    live = np.arange(length) < beam["lengths"][..., None]
    np.testing.assert_allclose(sums, live.astype("float32"), atol=1e-5)


@pytest.mark.tf_only
def test_beam_search_in_a_saved_model_signature(tmp_path):
    """Unknown batch size, penalties given at serving time, reloaded."""
    import tensorflow as tf

    embedding, decoder, projection, memory, _ = make_rnn()
    width = 3

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.layers = [embedding, decoder, projection]

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 5, 8]),
                tf.TensorSpec([None], tf.int32),
                tf.TensorSpec([], tf.float32),
            ]
        )
        def translate(self, memory, starts, alpha):
            step = rnn_step_fn(
                embedding, decoder.cell, projection, tile_beams(memory, width)
            )
            state = tile_beams(decoder.initial_states(tf.shape(starts)[0]), width)
            return beam_search(step, state, starts, 3, 6, width, alpha, 0.1)

    module = Module()
    starts = tf.constant([1, 2])
    expected = npy(module.translate(memory, starts, 0.5))
    tf.saved_model.save(module, str(tmp_path))
    restored = tf.saved_model.load(str(tmp_path))
    got = npy(restored.translate(memory, starts, 0.5))
    assert got["tokens"].shape == (2, width, 6)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-6)
