"""Coverage (See et al. 2017): the score term, the decoder state, the loss."""

import keras
import numpy as np
import pytest
from keras import ops

import attention_layers as al
from attention_layers.additive import additive_scores
from attention_layers.decoding import (
    beam_search,
    greedy_search,
    rnn_step_fn,
    tile_beams,
)

RNG = np.random.default_rng(7)
MEMORY = RNG.normal(size=(2, 5, 6)).astype("float32")
MEMORY_MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)


def np_(x):
    return keras.ops.convert_to_numpy(x)


def softmax(x, mask):
    x = np.where(mask, x, -np.inf)
    x = np.exp(x - x.max(-1, keepdims=True))
    return np.where(mask, x / x.sum(-1, keepdims=True), 0.0)


def coverage_cell(input_feeding=True, units=8, dtype=None, scale_w_c=None):
    return al.AttentionRNNCell(
        keras.layers.GRUCell(units, dtype=dtype),
        al.BahdanauAttention(units=4, use_coverage=True, dtype=dtype),
        output_units=7,
        input_feeding=input_feeding,
        dtype=dtype,
    )


# -- the score ----------------------------------------------------------------


def test_score_by_hand():
    """e_ij = v^T tanh(W1 s_i + W2 h_j + w_c c_ij + b), on a tiny example."""
    layer = al.BahdanauAttention(units=2, use_coverage=True)
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]], "float32")  # [1, 2, 2]
    value = np.array([[[1.0], [2.0], [-1.0]]], "float32")  # [1, 3, 1]
    layer.build(query.shape, value.shape)
    w1 = np.array([[0.5, -1.0], [1.0, 0.5]], "float32")
    w2 = np.array([[0.3, 0.7]], "float32")
    v = np.array([1.0, -2.0], "float32")
    w_c = np.array([-1.5, 0.5], "float32")
    b = np.array([0.1, -0.2], "float32")
    layer.query_dense.kernel.assign(w1)
    layer.key_dense.kernel.assign(w2)
    layer.v.assign(v)
    layer.w_c.assign(w_c)
    layer.b.assign(b)
    coverage = np.array([[[0.0, 1.0, 0.5], [2.0, 0.0, 9.0]]], "float32")
    value_mask = np.array([[True, True, False]])
    context, weights = layer(
        query,
        value,
        value_mask=value_mask,
        coverage=coverage,
        return_attention_scores=True,
    )
    e = np.zeros((2, 3))
    for i in range(2):
        for j in range(3):
            hidden = query[0, i] @ w1 + value[0, j] @ w2 + w_c * coverage[0, i, j] + b
            e[i, j] = v @ np.tanh(hidden)
    a = softmax(e, value_mask[0])
    np.testing.assert_allclose(np_(weights)[0], a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np_(context)[0], a @ value[0], rtol=1e-5, atol=1e-6)
    # The coverage changes the weights; at a masked position it does not
    # matter, even NaN.
    plain = np_(
        layer(query, value, value_mask=value_mask, return_attention_scores=True)[1]
    )
    assert np.abs(plain - np_(weights)).max() > 1e-3
    bad = coverage.copy()
    bad[0, :, 2] = np.nan
    again = layer(
        query, value, value_mask=value_mask, coverage=bad, return_attention_scores=True
    )
    np.testing.assert_array_equal(np_(again[1]), np_(weights))
    # A rank-2 query takes a [B, Tv] coverage: one row of the rank-3 call.
    step = layer(
        query[:, 1],
        value,
        value_mask=value_mask,
        coverage=coverage[:, 1],
        return_attention_scores=True,
    )
    np.testing.assert_allclose(np_(step[1]), np_(weights)[:, 1], rtol=1e-6, atol=1e-7)


def test_zero_coverage_is_the_plain_score_with_a_bias():
    query = RNG.normal(size=(2, 3, 4)).astype("float32")
    plain = al.BahdanauAttention(units=5)
    covered = al.BahdanauAttention(units=5, use_coverage=True)
    out = plain(query, MEMORY, return_attention_scores=True)[1]
    covered.build(query.shape, MEMORY.shape)
    covered.query_dense.kernel.assign(plain.query_dense.kernel)
    covered.key_dense.kernel.assign(plain.key_dense.kernel)
    covered.v.assign(plain.v)
    got = covered(query, MEMORY, return_attention_scores=True)[1]  # b = 0, c = 0
    np.testing.assert_allclose(np_(got), np_(out), rtol=1e-6, atol=1e-7)
    zeros = np.zeros((2, 3, 5), "float32")
    got = covered(query, MEMORY, coverage=zeros, return_attention_scores=True)[1]
    np.testing.assert_allclose(np_(got), np_(out), rtol=1e-6, atol=1e-7)


def test_normalize_shares_its_bias():
    layer = al.BahdanauAttention(units=3, normalize=True, use_coverage=True)
    layer.build((2, 4), MEMORY.shape)
    names = sorted(w.path.split("/")[-1] for w in layer.weights)
    assert names == ["b", "g", "kernel", "kernel", "v", "w_c"]


def test_blocked_scores_equal_one_block_with_gradients():
    q = RNG.normal(size=(2, 7, 3)).astype("float32")
    k = RNG.normal(size=(2, 5, 3)).astype("float32")
    c = RNG.uniform(size=(2, 7, 5)).astype("float32")
    v, w = (RNG.normal(size=3).astype("float32") for _ in range(2))
    one = np_(additive_scores(q, k, v, coverage=c, coverage_weight=w))
    blocked = np_(
        additive_scores(q, k, v, coverage=c, coverage_weight=w, block_elements=30)
    )
    np.testing.assert_allclose(blocked, one, rtol=1e-6, atol=1e-6)
    expected = np.einsum(
        "bqvu,u->bqv", np.tanh(q[:, :, None] + k[:, None] + c[..., None] * w), v
    )
    np.testing.assert_allclose(one, expected, rtol=1e-5, atol=1e-6)
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf

    def grads(budget):
        tensors = [tf.constant(x) for x in (q, k, v, c, w)]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            s = additive_scores(
                *tensors[:3],
                coverage=tensors[3],
                coverage_weight=tensors[4],
                block_elements=budget,
            )
            loss = tf.reduce_sum(s * tf.sin(s))
        return [g.numpy() for g in tape.gradient(loss, tensors)]

    for a, b in zip(grads(None), grads(30), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    # Lengths unknown at trace time: the one-block path, same numbers.
    spec = tf.TensorSpec([None, None, None], "float32")
    dynamic = tf.function(
        lambda q, k, c: additive_scores(
            q, k, v, coverage=c, coverage_weight=w, block_elements=30
        ),
        input_signature=[spec, spec, spec],
    )
    np.testing.assert_allclose(dynamic(q, k, c).numpy(), one, rtol=1e-6, atol=1e-6)


def test_coverage_errors():
    query = RNG.normal(size=(2, 3, 4)).astype("float32")
    with pytest.raises(ValueError, match=r"`coverage`.*use_coverage=True"):
        al.BahdanauAttention(units=3)(query, MEMORY, coverage=np.zeros((2, 3, 5)))
    layer = al.BahdanauAttention(units=3, use_coverage=True)
    with pytest.raises(ValueError, match=r"BahdanauAttention.*`coverage`.*\(2, 3, 5\)"):
        layer(query, MEMORY, coverage=np.zeros((2, 3, 4), "float32"))
    with pytest.raises(ValueError, match=r"`coverage`.*\(2, 5\)"):
        layer(query[:, 0], MEMORY, coverage=np.zeros((2, 3, 5), "float32"))
    with pytest.raises(ValueError, match=r"`coverage`.*floating"):
        layer(query, MEMORY, coverage=np.zeros((2, 3, 5), "int32"))


def test_config_round_trip_and_old_configs():
    layer = al.BahdanauAttention(units=3, use_coverage=True)
    config = layer.get_config()
    assert config["use_coverage"] is True
    assert al.BahdanauAttention.from_config(config).use_coverage
    old = al.BahdanauAttention(units=3).get_config()
    del old["use_coverage"]
    assert not al.BahdanauAttention.from_config(old).use_coverage
    loss = al.CoverageLoss(weight=0.5)
    assert al.CoverageLoss.from_config(loss.get_config()).weight == 0.5


# -- the decoder state --------------------------------------------------------


@pytest.mark.parametrize("input_feeding", [True, False])
def test_decoder_carries_the_coverage_of_previous_steps(input_feeding):
    cell = coverage_cell(input_feeding)
    decoder = al.AttentionDecoder(cell)
    target = RNG.normal(size=(2, 4, 3)).astype("float32")
    query_mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)
    outputs, alignments, states = decoder(
        target,
        MEMORY,
        query_mask=query_mask,
        value_mask=MEMORY_MASK,
        return_attention_scores=True,
        return_state=True,
    )
    assert cell.state_size[-1] is None
    alignments = np_(alignments)
    # Step by step: the attention of step t sees c^t = sum_{t' < t} a^{t'}.
    step_states = decoder.initial_states(2, memory=MEMORY)
    assert tuple(step_states[-1].shape) == (2, 5)
    expected = np.zeros((2, 5))
    attention = cell.attention
    for t in range(2):  # both rows unmasked
        np.testing.assert_allclose(np_(step_states[-1]), expected, atol=1e-6)
        out, step_states, weights = cell(
            target[:, t], step_states, MEMORY, memory_mask=MEMORY_MASK
        )
        # The weights are the attention's with that coverage.
        z = np_(step_states[0])
        _, direct = attention(
            z,
            MEMORY,
            value_mask=MEMORY_MASK,
            coverage=expected.astype("float32"),
            return_attention_scores=True,
        )
        np.testing.assert_allclose(np_(weights), np_(direct), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np_(weights), alignments[:, t], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np_(out), np_(outputs)[:, t], rtol=1e-5, atol=1e-5)
        expected = expected + np_(weights)
    # The final coverage sums the unmasked steps (masked ones keep it).
    final = np_(states[-1])
    assert states[-1].dtype == "float32"
    np.testing.assert_allclose(final, alignments.sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(final[0], alignments[0, :2].sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(final.sum(-1), [2.0, 4.0], rtol=1e-5)
    assert (final[1, 3:] == 0).all()  # padding never covered


def test_initial_state_needs_the_memory():
    cell = coverage_cell()
    cell.build((2, 3), None, MEMORY.shape)
    with pytest.raises(ValueError, match=r"AttentionRNNCell.*`memory`.*coverage"):
        cell.get_initial_state(2)
    states = cell.get_initial_state(2, memory=5)
    assert [tuple(s.shape) for s in states] == [(2, 8), (2, 7), (2, 5)]
    decoder = al.AttentionDecoder(cell)
    with pytest.raises(ValueError, match="`memory`"):
        decoder.initial_states(2)
    assert tuple(decoder.initial_states(2, memory=MEMORY)[-1].shape) == (2, 5)


def test_symbolic_outputs_include_the_coverage():
    decoder = al.AttentionDecoder(coverage_cell())
    target = keras.Input((None, 3))
    memory = keras.Input((5, 6))
    outputs, alignments, states = decoder(
        target, memory, return_attention_scores=True, return_state=True
    )
    assert tuple(states[-1].shape) == (None, 5)
    assert states[-1].dtype == "float32"
    assert len(states) == 3


# -- decoding -----------------------------------------------------------------

VOCAB, START, END, LENGTH = 7, 1, 0, 6


def decoding_parts():
    keras.utils.set_random_seed(1)
    embedding = keras.layers.Embedding(VOCAB, 3)
    projection = keras.layers.Dense(VOCAB)
    decoder = al.AttentionDecoder(coverage_cell())
    target = embedding(np.zeros((2, LENGTH), "int32"))
    outputs = decoder(target, MEMORY, value_mask=MEMORY_MASK)
    projection(outputs)
    attention = decoder.cell.attention
    attention.w_c.assign(4.0 * attention.w_c)  # coverage matters
    # The end token rarely wins: long hypotheses.
    projection.bias.assign(np.where(np.arange(VOCAB) == END, -2.0, 0.0))
    return embedding, decoder, projection


def teacher_forced(embedding, decoder, projection, tokens, lengths, memory, mask):
    """Alignments and logits of ``tokens`` [N, L] fed back shifted right."""
    n = tokens.shape[0]
    inputs = np.concatenate([np.full((n, 1), START), tokens[:, :-1]], 1)
    query_mask = np.arange(tokens.shape[1]) < lengths[:, None]
    outputs, alignments = decoder(
        embedding(inputs.astype("int32")),
        memory,
        query_mask=query_mask,
        value_mask=mask,
        return_attention_scores=True,
    )
    return np_(alignments), np_(projection(outputs)), query_mask


def test_greedy_equals_teacher_forcing_of_its_output():
    embedding, decoder, projection = decoding_parts()
    step_fn = rnn_step_fn(embedding, decoder.cell, projection, MEMORY, MEMORY_MASK)
    out = greedy_search(
        step_fn,
        decoder.initial_states(2, memory=MEMORY),
        np.full((2,), START),
        end_id=END,
        max_length=LENGTH,
    )
    tokens, lengths = np_(out["tokens"]), np_(out["lengths"])
    assert lengths.max() > 2
    alignments, logits, query_mask = teacher_forced(
        embedding, decoder, projection, tokens, lengths, MEMORY, MEMORY_MASK
    )
    np.testing.assert_allclose(alignments, np_(out["alignments"]), atol=1e-5)
    np.testing.assert_array_equal(np.where(query_mask, logits.argmax(-1), END), tokens)


def test_beam_hypotheses_equal_teacher_forcing_of_each():
    """Each hypothesis' alignments depend on its own coverage: a coverage state
    not reordered with the beams would give other alignments."""
    k = 3
    embedding, decoder, projection = decoding_parts()
    memory, mask = tile_beams(MEMORY, k), tile_beams(MEMORY_MASK, k)
    step_fn = rnn_step_fn(embedding, decoder.cell, projection, memory, mask)
    out = beam_search(
        step_fn,
        tile_beams(decoder.initial_states(2, memory=MEMORY), k),
        np.full((2,), START),
        end_id=END,
        max_length=LENGTH,
        beam_width=k,
    )
    tokens = np_(out["tokens"]).reshape(2 * k, LENGTH)
    lengths = np_(out["lengths"]).reshape(2 * k)
    beam_alignments = np_(out["alignments"]).reshape(2 * k, LENGTH, 5)
    assert lengths.max() > 2
    for b in range(2):  # distinct hypotheses of each source
        assert len({tuple(t) for t in tokens[b * k : (b + 1) * k]}) == k
    alignments, logits, _ = teacher_forced(
        embedding, decoder, projection, tokens, lengths, np_(memory), np_(mask)
    )
    np.testing.assert_allclose(alignments, beam_alignments, atol=1e-5)
    # Log-probabilities too.
    log_probs = np_(ops.log_softmax(logits, axis=-1))
    picked = np.take_along_axis(log_probs, tokens[..., None], -1)[..., 0]
    steps = np.arange(LENGTH) < lengths[:, None]
    np.testing.assert_allclose(
        (picked * steps).sum(1), np_(out["log_probs"]).reshape(-1), rtol=1e-4, atol=1e-4
    )
    # The control: without the coverage term the alignments are others.
    attention = decoder.cell.attention
    w_c = np_(attention.w_c)
    attention.w_c.assign(np.zeros_like(w_c))
    without, _, _ = teacher_forced(
        embedding, decoder, projection, tokens, lengths, np_(memory), np_(mask)
    )
    attention.w_c.assign(w_c)
    assert np.abs(without - beam_alignments).max() > 1e-2


# -- the loss -----------------------------------------------------------------


def np_coverage_loss(a, mask=None):
    b, t, _ = a.shape
    mask = np.ones((b, t), bool) if mask is None else mask
    out = np.zeros(b)
    for i in range(b):
        c = np.zeros(a.shape[2])
        total, steps = 0.0, 0
        for s in range(t):
            if not mask[i, s]:
                continue
            total += np.minimum(a[i, s], c).sum()
            c = c + a[i, s]
            steps += 1
        out[i] = total / max(steps, 1)
    return out


def test_coverage_loss_by_hand():
    a = np.array(
        [
            [[0.5, 0.5, 0.0], [0.2, 0.8, 0.0], [0.1, 0.1, 0.8]],
            [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.3, 0.3, 0.4]],
        ],
        "float32",
    )
    # Row 0: c^1 = [.5, .5, 0]: .2 + .5; c^2 = [.7, 1.3, 0]: .1 + .1; / 3.
    np.testing.assert_allclose(np_(al.coverage_loss(a))[0], 0.9 / 3, rtol=1e-6)
    np.testing.assert_allclose(np_(al.coverage_loss(a)), np_coverage_loss(a), rtol=1e-6)
    mask = np.array([[True, True, False], [False, False, False]])
    got = np_(al.coverage_loss(a, mask))
    np.testing.assert_allclose(got, [0.7 / 2, 0.0], rtol=1e-6)
    np.testing.assert_allclose(got, np_coverage_loss(a, mask), rtol=1e-6)
    random = RNG.dirichlet(np.ones(4), size=(3, 6)).astype("float32")
    mask = RNG.uniform(size=(3, 6)) > 0.3
    np.testing.assert_allclose(
        np_(al.coverage_loss(random, mask)), np_coverage_loss(random, mask), rtol=1e-5
    )
    with pytest.raises(ValueError, match="alignments"):
        al.coverage_loss(a[0])
    with pytest.raises(ValueError, match=r"CoverageLoss.*`weight`"):
        al.CoverageLoss(weight=-1.0)


def test_coverage_loss_layer_adds_the_weighted_mean():
    a = RNG.dirichlet(np.ones(4), size=(3, 5)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)
    layer = al.CoverageLoss(weight=0.5)
    out = layer(a, mask)
    np.testing.assert_array_equal(np_(out), a)
    (loss,) = layer.losses
    np.testing.assert_allclose(
        float(loss), 0.5 * np_coverage_loss(a, mask).mean(), rtol=1e-5
    )


def coverage_model(dtype=None):
    target = keras.Input((4, 3), name="target")
    memory = keras.Input((5, 6), name="memory")
    target_mask = keras.Input((4,), dtype="bool", name="target_mask")
    outputs, alignments = al.AttentionDecoder(coverage_cell(dtype=dtype))(
        target, memory, query_mask=target_mask, return_attention_scores=True
    )
    alignments = al.CoverageLoss(weight=1.0)(alignments, target_mask)
    logits = keras.layers.Dense(3)(outputs)
    return keras.Model(
        [target, memory, target_mask], {"logits": logits, "alignments": alignments}
    )


def feed(n=8):
    rng = np.random.default_rng(0)
    mask = np.ones((n, 4), bool)
    mask[::2, 3] = False
    return [
        rng.normal(size=(n, 4, 3)).astype("float32"),
        rng.normal(size=(n, 5, 6)).astype("float32"),
        mask,
    ]


def test_keras_file_round_trip(tmp_path):
    model = coverage_model()
    x = feed()
    expected = model.predict(x, verbose=0)
    path = str(tmp_path / "coverage.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    got = restored.predict(x, verbose=0)
    for name in ("logits", "alignments"):
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)
    restored(x)
    model(x)
    np.testing.assert_allclose(
        float(restored.losses[0]), float(model.losses[0]), rtol=1e-5
    )


def test_mixed_float16():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = coverage_model()
        out = model(feed())
        assert out["logits"].dtype == "float16"
        assert model.losses[0].dtype == "float32"
        assert np.isfinite(float(model.losses[0]))
        a = np_(out["alignments"]).astype("float32")
        np.testing.assert_allclose(a.sum(-1)[1::2], 1.0, atol=2e-3)
        cell = coverage_cell()
        dec = al.AttentionDecoder(cell)
        _, _, states = dec(
            feed()[0], feed()[1], return_attention_scores=True, return_state=True
        )
        assert states[-1].dtype == "float32"
        assert al.coverage_loss(a.astype("float16")).dtype == "float32"
    finally:
        keras.config.set_dtype_policy("float32")


def test_jit_fit_lowers_the_coverage_loss():
    keras.utils.set_random_seed(0)
    model = coverage_model()
    model.compile(
        keras.optimizers.Adam(0.05),
        loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        jit_compile=True,
    )
    x = feed(16)
    y = {"logits": np.random.default_rng(1).integers(0, 3, size=(16, 4))}

    def coverage_value():
        model(x)
        return float(model.losses[0])

    before = coverage_value()
    history = model.fit(x, y, epochs=15, batch_size=8, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.8 * losses[0], losses
    assert coverage_value() < 0.7 * before
