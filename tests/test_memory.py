"""MemoryNetwork (end-to-end memory networks) and the attention supervision loss.

The contract clauses that fit a layer fed word ids (not float query/value
tensors) run through `MemoryCase`: config and ``.keras`` round trips,
distinct initial weights, the SavedModel served without the library and
mixed precision. Masks, XLA training and bad input have tests of their own
here, since the generic clauses feed float queries and values. Clauses that
cannot apply: the implicit Keras mask (the inputs are ids, not embeddings
carrying a mask: the layer derives its masks from id 0), the causal mask and
dropout (the layer has neither). The MirroredStrategy clause is not run.
"""

import json
from functools import partial

import keras
import numpy as np
import pytest

import attention_layers as al
from attention_layers.memory import position_encoding, temporal_weights
from tests import contract

V, D, M, W = 9, 4, 3, 4


def np_(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


# -- the forward pass by hand --------------------------------------------------
def np_position_encoding(mask, d, formula="paper"):
    """``l_kj`` word by word (j: real words only): the paper's
    ``(1 - j/J) - (k/d)(1 - 2j/J)``, or the reference code's
    ``1 + 4 (k - (d+1)/2)(j - (J+1)/2) / (d J)``."""
    out = np.zeros((len(mask), d))
    length = max(int(np.sum(mask)), 1)  # J
    j = 0
    for pos, real in enumerate(mask):
        if not real:
            continue
        j += 1
        for k in range(1, d + 1):
            if formula == "paper":
                value = (1 - j / length) - (k / d) * (1 - 2 * j / length)
            else:
                value = 1 + 4 * (k - (d + 1) / 2) * (j - (length + 1) / 2) / (
                    d * length
                )
            out[pos, k - 1] = value
    return out


def np_time_weight(ids, d):
    """The reference code's weight of a sentence's temporal row: its time
    word is word ``J`` of ``J = n + 1``, ``n`` the sentence's real words."""
    length = int(np.sum(ids != 0)) + 1  # J; the time word is j = J
    j = length
    return np.array(
        [
            1 + 4 * (k - (d + 1) / 2) * (j - (length + 1) / 2) / (d * length)
            for k in range(1, d + 1)
        ]
    )


def np_encode(table, ids, pe):
    """``pe``: True or "paper", "reference", or False (a bag of words)."""
    mask = ids != 0
    if pe:
        formula = "paper" if pe is True else pe
        weights = np_position_encoding(mask, table.shape[1], formula)
    else:
        weights = mask[:, None]
    return (table[ids] * weights).sum(0)


def np_forward(
    w,
    story,
    question,
    hops,
    pe=True,
    te=True,
    tying="adjacent",
    linear=False,
    time_weight=True,
):
    """Logits ``[B, V]`` and attention ``[B, hops, M]``, one example at a time.

    ``linear``: the linear start, ``p_i = u . m_i`` on real memories.
    ``time_weight=False`` leaves out the reference code's weight of the
    temporal rows (to show that it matters). With
    ``w["U"]``, ``w["b"]``, ``w["V"]``: the residual readout
    ``u + V relu(U u + b)``."""
    logits, attention = [], []
    for x, q in zip(story, question, strict=True):
        real = (x != 0).any(-1)
        recency = [int(real[i + 1 :].sum()) for i in range(len(x))]

        def memory(t, x=x, recency=recency):
            vectors = np.stack([np_encode(w["E"][t], s, pe) for s in x])
            if te:
                rows = w["T"][t][recency]
                if (
                    pe == "reference" and time_weight
                ):  # the code's time word: word n+1 of n+1
                    rows = rows * np.stack(
                        [np_time_weight(s, rows.shape[1]) for s in x]
                    )
                vectors = vectors + rows
            return vectors

        u = np_encode(w["B"] if tying == "layerwise" else w["E"][0], q, pe)
        ps = []
        for k in range(hops):
            a, c = (k, k + 1) if tying == "adjacent" else (0, 1)
            m, cv = memory(a), memory(c)
            s = m @ u
            if linear:
                p = np.where(real, s, 0.0)
            else:
                e = np.where(real, np.exp(s - s[real].max()), 0.0)
                p = e / e.sum()
            u = (u if tying == "adjacent" else u @ w["H"]) + p @ cv
            ps.append(p)
        if "U" in w:
            u = u + np.maximum(u @ w["U"] + w["b"], 0.0) @ w["V"]
        logits.append(u @ w["E"][-1].T if tying == "adjacent" else u @ w["W"])
        attention.append(ps)
    return np.array(logits), np.array(attention)


def random_weights(layer, seed=1):
    """Set every weight of a built layer to fresh random values; return them."""
    rng = np.random.default_rng(seed)

    def draw(shape):
        return rng.normal(scale=0.5, size=shape).astype("float32")

    w = {"E": [], "T": []}
    for table in layer.embeddings:
        w["E"].append(draw((V, D)))
        table.embeddings.assign(w["E"][-1])
    for t in layer.temporal:
        w["T"].append(draw(tuple(t.shape)))
        t.assign(w["T"][-1])
    if layer.weight_tying == "layerwise":
        w["B"], w["H"], w["W"] = draw((V, D)), draw((D, D)), draw((D, V))
        layer.question_embedding.embeddings.assign(w["B"])
        layer.hop_map.kernel.assign(w["H"])
        layer.answer.kernel.assign(w["W"])
    if layer.readout_units:
        h = layer.readout_units
        w["U"], w["b"], w["V"] = draw((D, h)), draw((h,)), draw((h, D))
        layer.readout_hidden.kernel.assign(w["U"])
        layer.readout_hidden.bias.assign(w["b"])
        layer.readout_output.kernel.assign(w["V"])
    return w


STORY = np.array(
    [
        [[1, 2, 3, 0], [4, 5, 0, 0], [0, 0, 0, 0]],  # padded words, a padded sentence
        [[2, 0, 0, 0], [0, 0, 0, 0], [3, 6, 1, 2]],  # a padded sentence between
    ],
    "int32",
)
QUESTION = np.array([[6, 1, 0], [5, 4, 2]], "int32")


@pytest.mark.parametrize(
    "pe,te,tying,readout",
    [
        (True, True, "adjacent", 0),
        ("reference", True, "adjacent", 0),
        (False, True, "adjacent", 0),
        (True, False, "adjacent", 0),
        (True, True, "layerwise", 0),
        (True, True, "adjacent", 5),
        (True, True, "layerwise", 3),
    ],
)
def test_two_hops_by_hand(pe, te, tying, readout):
    layer = al.MemoryNetwork(
        V,
        D,
        max_memories=M,
        max_words=W,
        hops=2,
        position_encoding=pe,
        temporal_encoding=te,
        weight_tying=tying,
        readout_units=readout,
    )
    layer(STORY, QUESTION)
    w = random_weights(layer)
    logits, attention = layer(STORY, QUESTION, return_attention=True)
    want_logits, want_attention = np_forward(w, STORY, QUESTION, 2, pe, te, tying)
    np.testing.assert_allclose(np_(attention), want_attention, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np_(logits), want_logits, rtol=1e-5, atol=1e-5)
    assert np_(attention)[0, :, 2].tolist() == [0.0, 0.0]
    assert np_(attention)[1, :, 1].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("tying", ["adjacent", "layerwise"])
def test_linear_start_by_hand_then_the_softmax_back(tying):
    """Section 4.2: the hops' softmax is removed, then put back."""
    layer = al.MemoryNetwork(
        V, D, max_memories=M, max_words=W, hops=2, weight_tying=tying,
        linear_start=True,
    )  # fmt: skip
    layer(STORY, QUESTION)
    w = random_weights(layer)
    assert [v.name for v in layer.non_trainable_weights] == ["linear"]
    logits, attention = layer(STORY, QUESTION, return_attention=True)
    want_logits, want_attention = np_forward(
        w, STORY, QUESTION, 2, tying=tying, linear=True
    )
    np.testing.assert_allclose(np_(attention), want_attention, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np_(logits), want_logits, rtol=1e-4, atol=1e-4)
    assert np_(attention)[0, :, 2].tolist() == [0.0, 0.0]  # padding stays 0
    layer.set_linear_start(False)
    logits, attention = layer(STORY, QUESTION, return_attention=True)
    want_logits, want_attention = np_forward(w, STORY, QUESTION, 2, tying=tying)
    np.testing.assert_allclose(np_(attention), want_attention, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np_(logits), want_logits, rtol=1e-5, atol=1e-5)


def test_linear_start_switch_is_saved_and_checked(tmp_path):
    layer = al.MemoryNetwork(V, D, M, W, hops=2, linear_start=True)
    layer(STORY, QUESTION)
    layer.set_linear_start(False)
    inputs = [keras.Input((M, W), dtype="int32"), keras.Input((None,), dtype="int32")]
    model = keras.Model(inputs, layer(*inputs))
    model.save_weights(tmp_path / "m.weights.h5")
    other = al.MemoryNetwork.from_config(layer.get_config())
    assert other.linear_start is True
    copy = keras.Model(inputs, other(*inputs))
    assert float(np_(other.linear)) == 1.0  # a new layer starts linear
    copy.load_weights(tmp_path / "m.weights.h5")
    assert float(np_(other.linear)) == 0.0
    np.testing.assert_allclose(
        np_(copy([STORY, QUESTION])), np_(model([STORY, QUESTION])), rtol=1e-6
    )
    plain = al.MemoryNetwork(V, D, M, W)
    with pytest.raises(ValueError, match="linear_start=True"):
        plain.set_linear_start(True)
    with pytest.raises(ValueError, match="linear_start"):
        al.MemoryNetwork(V, D, M, W, linear_start="yes")


def test_temporal_noise_inserts_empty_memories_in_training_only():
    """Section 4.1's random noise: each real memory is followed by an empty
    one with probability r, so it sits 1 or 2 rows after the next real one."""
    layer = al.MemoryNetwork(V, D, 40, W, hops=1, temporal_noise=0.25, seed=3)
    plain = al.MemoryNetwork(V, D, 40, W, hops=1)
    layer(STORY, QUESTION)
    plain(STORY, QUESTION)
    for a, b in zip(layer.weights, plain.weights, strict=True):
        b.assign(a)
    np.testing.assert_array_equal(
        np_(layer(STORY, QUESTION)), np_(plain(STORY, QUESTION))
    )  # inference: no noise
    mask = np.zeros((400, 30), bool)
    mask[:, :24] = True
    mask[:, 10] = False  # a padded memory among the real ones
    real = np.flatnonzero(mask[0])
    rows = np_(layer._recency(mask, training=True))[:, real]
    exact = np_(layer._recency(mask, training=False))[:, real]
    np.testing.assert_array_equal(exact[0], np.arange(len(real))[::-1])
    assert (rows >= exact).all() and set(np.unique(rows[:, -1])) == {0, 1}
    steps = rows[:, :-1] - rows[:, 1:]  # 1 + an inserted empty memory
    assert set(np.unique(steps)) == {1, 2}
    assert abs((steps == 2).mean() - 0.25) < 0.02
    small = al.MemoryNetwork(V, D, 5, W, hops=1, temporal_noise=0.5, seed=1)
    assert np_(small._recency(mask, training=True)).max() == 4  # clipped
    for bad in (1.0, -0.1, "0.1", True):
        with pytest.raises(ValueError, match="temporal_noise"):
            al.MemoryNetwork(V, D, M, W, temporal_noise=bad)
    with pytest.raises(ValueError, match="without the temporal encoding"):
        al.MemoryNetwork(V, D, M, W, temporal_encoding=False, temporal_noise=0.1)


def test_position_encoding_formula_by_hand():
    # J = 3 real words, d = 2: l_kj = (1 - j/3) - (k/2)(1 - 2j/3).
    want = [[0.5, 1 / 3], [0.5, 2 / 3], [0.5, 1.0]]
    got = np_(position_encoding(np.array([True, True, True]), 2))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # Padding (here between words and at the end) shifts nothing and gets 0.
    got = np_(position_encoding(np.array([[1, 0, 1, 1, 0]]), 2))
    np.testing.assert_allclose(got[0], [want[0], [0, 0], want[1], want[2], [0, 0]])
    # A sentence of padding only: zeros, not NaN.
    assert (np_(position_encoding(np.zeros((2, 3), bool), 4)) == 0).all()
    np.testing.assert_allclose(
        np_(position_encoding(np.ones((7,), bool), 5)),
        np_position_encoding(np.ones(7, bool), 5),
        rtol=1e-5,
        atol=1e-6,
    )


def test_reference_position_encoding_by_hand():
    # J = 3, d = 2: l_kj = 1 + 4 (k - 3/2)(j - 2) / 6, the authors' code's.
    want = [[4 / 3, 2 / 3], [1.0, 1.0], [2 / 3, 4 / 3]]
    got = np_(position_encoding(np.array([True, True, True]), 2, formula="reference"))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    got = np_(position_encoding(np.array([[0, 1, 1, 0, 1]]), 2, formula="reference"))
    np.testing.assert_allclose(got[0], [[0, 0], want[0], want[1], [0, 0], want[2]])
    assert (
        np_(position_encoding(np.zeros((2, 3), bool), 4, "float32", "reference")) == 0
    ).all()
    # About twice the paper's: the same up to the half-index offsets.
    paper = np_position_encoding(np.ones(40, bool), 30)
    reference = np_(position_encoding(np.ones((40,), bool), 30, formula="reference"))
    np.testing.assert_allclose(
        reference,
        np_position_encoding(np.ones(40, bool), 30, "reference"),
        rtol=1e-5,
        atol=1e-6,
    )
    assert np.abs(reference - 2 * paper).max() < 0.1
    with pytest.raises(ValueError, match="`formula` must be one of"):
        position_encoding(np.ones(3, bool), 2, formula="matlab")


def test_temporal_weights_by_hand():
    # n = 2 real words, d = 2: the time word is word 3 of 3,
    # 1 + 4 (k - 3/2)(3 - 2) / 6: 2/3 and 4/3; n = 1: 3/4 and 5/4.
    got = np_(temporal_weights(np.array([[0, 1, 1, 0], [1, 0, 0, 0]]), 2))
    np.testing.assert_allclose(got, [[2 / 3, 4 / 3], [0.75, 1.25]], rtol=1e-6)
    ids = np.array([3, 1, 4, 1, 5, 0, 0])
    np.testing.assert_allclose(
        np_(temporal_weights(ids != 0, 20)), np_time_weight(ids, 20), rtol=1e-6
    )


def test_reference_weighs_the_temporal_rows():
    layer = al.MemoryNetwork(V, D, M, W, hops=2, position_encoding="reference")
    layer(STORY, QUESTION)
    w = random_weights(layer)
    logits, attention = layer(STORY, QUESTION, return_attention=True)
    want_logits, want_attention = np_forward(w, STORY, QUESTION, 2, pe="reference")
    np.testing.assert_allclose(np_(logits), want_logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np_(attention), want_attention, rtol=1e-4, atol=1e-5)
    # Not the unweighted rows: the same weights read without the time weight.
    unweighted_logits, _ = np_forward(
        {**w, "T": [t * 0 for t in w["T"]]}, STORY, QUESTION, 2, pe="reference"
    )
    plain_logits, _ = np_forward(
        w, STORY, QUESTION, 2, pe="reference", time_weight=False
    )
    assert not np.allclose(np_(logits), plain_logits, atol=1e-3)
    assert not np.allclose(np_(logits), unweighted_logits, atol=1e-3)


def test_position_encoding_argument_and_config():
    paper = al.MemoryNetwork(V, D, M, W, position_encoding=True)
    assert paper.position_encoding == "paper"
    assert paper.get_config()["position_encoding"] == "paper"
    reference = al.MemoryNetwork(V, D, M, W, position_encoding="reference")
    config = json.loads(json.dumps(reference.get_config()))
    assert al.MemoryNetwork.from_config(config).position_encoding == "reference"
    bag = al.MemoryNetwork(V, D, M, W, position_encoding=False)
    assert bag.get_config()["position_encoding"] is False
    # A config saved before the formulas (True) loads as the paper's.
    old = {**config, "position_encoding": True}
    assert al.MemoryNetwork.from_config(old).position_encoding == "paper"
    # The two formulas give different answers from the same weights.
    outputs = []
    for layer in (paper, reference):
        layer(STORY, QUESTION)
        random_weights(layer)
        outputs.append(np_(layer(STORY, QUESTION)))
    assert not np.allclose(outputs[0], outputs[1])


# -- weight tying ---------------------------------------------------------------
def test_adjacent_tying_shares_the_tables():
    hops = 3
    layer = al.MemoryNetwork(V, D, max_memories=M, max_words=W, hops=hops)
    layer(STORY, QUESTION)
    # K + 1 word tables and K + 1 temporal tables, nothing else.
    assert len(layer.trainable_weights) == 2 * (hops + 1)
    assert len({id(v) for v in layer.trainable_weights}) == 2 * (hops + 1)
    for k in range(hops - 1):
        assert layer.input_embedding(k + 1) is layer.output_embedding(k)  # A^{k+1}=C^k
    assert layer.question_embedding is layer.input_embedding(0)  # B = A^1
    assert len({id(layer.input_embedding(k)) for k in range(hops)}) == hops
    # W^T = C^K: a zero last table gives zero logits.
    layer.output_embedding(hops - 1).embeddings.assign(np.zeros((V, D), "float32"))
    assert (np_(layer(STORY, QUESTION)) == 0).all()
    no_time = al.MemoryNetwork(
        V, D, max_memories=M, max_words=W, hops=hops, temporal_encoding=False
    )
    no_time(STORY, QUESTION)
    assert len(no_time.trainable_weights) == hops + 1


def test_layerwise_tying_shares_across_hops():
    layer = al.MemoryNetwork(
        V, D, max_memories=M, max_words=W, hops=3, weight_tying="layerwise"
    )
    layer(STORY, QUESTION)
    # A, C, T_A, T_C, B, H, W.
    assert len(layer.trainable_weights) == 7
    assert layer.input_embedding(0) is layer.input_embedding(2)
    assert layer.output_embedding(0) is layer.output_embedding(2)
    assert layer.input_embedding(0) is not layer.output_embedding(0)
    assert layer.question_embedding is not layer.input_embedding(0)


def test_gradients_reach_every_weight():
    for tying, readout in (("adjacent", 0), ("layerwise", 0), ("adjacent", 3)):
        layer = al.MemoryNetwork(
            V, D, max_memories=M, max_words=W, hops=2, weight_tying=tying,
            readout_units=readout,
        )  # fmt: skip
        x = keras.Input((M, W), dtype="int32")
        q = keras.Input((3,), dtype="int32")
        model = keras.Model([x, q], layer(x, q))
        model.compile(
            keras.optimizers.SGD(0.5),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        before = [np_(v) for v in layer.trainable_weights]
        # Two steps: the readout's hidden layer gets gradients once V (zeros
        # at first) has moved.
        model.fit([STORY, QUESTION], np.array([3, 4]), epochs=2, verbose=0)
        for v, b in zip(layer.trainable_weights, before, strict=True):
            assert not np.array_equal(np_(v), b), v.path


def test_the_readout_starts_as_the_papers():
    """``V`` starts at zero: a new residual readout gives the linear one's
    logits, with the same tables."""
    for tying in ("adjacent", "layerwise"):
        plain = al.MemoryNetwork(V, D, M, W, hops=2, weight_tying=tying)
        deep = al.MemoryNetwork(V, D, M, W, hops=2, weight_tying=tying, readout_units=4)
        plain(STORY, QUESTION), deep(STORY, QUESTION)
        shared = [v for v in deep.weights if "readout" not in v.path]
        for v, twin in zip(shared, plain.weights, strict=True):
            v.assign(twin)
        np.testing.assert_allclose(
            np_(deep(STORY, QUESTION)), np_(plain(STORY, QUESTION)), rtol=1e-6
        )
        assert np_(deep.readout_hidden.kernel).std() > 0


# -- masks --------------------------------------------------------------------------
def outputs(layer, story, question=QUESTION, **kw):
    logits, attention = layer(story, question, return_attention=True, **kw)
    return np_(logits), np_(attention)


def built_layer(**kw):
    layer = al.MemoryNetwork(V, D, max_memories=5, max_words=6, hops=2, **kw)
    layer(STORY, QUESTION)
    random_weights(layer)
    return layer


@pytest.mark.parametrize("tying", ["adjacent", "layerwise"])
def test_padded_words_and_sentences_change_nothing(tying):
    layer = built_layer(weight_tying=tying)
    logits, attention = outputs(layer, STORY)
    # Padding words at the end of every sentence and of the question.
    wider = np.pad(STORY, [[0, 0], [0, 0], [0, 2]])
    got = outputs(layer, wider, np.pad(QUESTION, [[0, 0], [0, 2]]))
    np.testing.assert_allclose(got[0], logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], attention, rtol=1e-5, atol=1e-6)
    # Padding words between the words of a sentence.
    spread = np.zeros((2, M, 6), "int32")
    spread[:, :, [0, 2, 3, 5]] = STORY
    got = outputs(layer, spread)
    np.testing.assert_allclose(got[0], logits, rtol=1e-5, atol=1e-6)
    # Padded sentences in front and at the end (5 memories in all).
    taller = np.concatenate(
        [np.zeros((2, 1, W), "int32"), STORY, np.zeros((2, 1, W), "int32")], 1
    )
    got = outputs(layer, taller)
    np.testing.assert_allclose(got[0], logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1][:, :, 1:-1], attention, rtol=1e-5, atol=1e-6)
    assert (got[1][:, :, [0, -1]] == 0).all()


def test_story_mask_equals_deleting_the_sentence():
    layer = built_layer()
    mask = np.array([[True, False, False], [True, False, True]])
    logits, attention = outputs(layer, STORY, story_mask=mask)
    deleted = STORY.copy()
    deleted[0] = STORY[0][[0, 2, 1]]  # move the hidden sentence to the end...
    deleted[0, 2] = 0  # ...and pad it out
    want = outputs(layer, deleted)
    np.testing.assert_allclose(logits, want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(attention, want[1], rtol=1e-5, atol=1e-6)
    assert (attention[0, :, 1:] == 0).all()
    # The default mask is "some word is not padding".
    default = outputs(layer, STORY, story_mask=(STORY != 0).any(-1))
    np.testing.assert_array_equal(default[0], outputs(layer, STORY)[0])


def test_fully_padded_story_is_nan_free():
    layer = built_layer()
    empty = np.zeros_like(STORY)
    logits, attention = outputs(layer, empty)
    assert np.isfinite(logits).all()
    assert (attention == 0).all()
    # o = 0 at every hop: the answer is W u^1.
    u1 = np_(layer._encode(layer.question_embedding, QUESTION, QUESTION != 0))
    want = u1 @ np_(layer.output_embedding(1).embeddings).T
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-6)
    # A story mask that hides everything, and its gradients: finite.
    x = keras.Input((M, W), dtype="int32")
    q = keras.Input((3,), dtype="int32")
    sm = keras.Input((M,), dtype="bool")
    model = keras.Model([x, q, sm], layer(x, q, story_mask=sm))
    model.compile(
        keras.optimizers.SGD(0.1),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(
        [STORY, QUESTION, np.zeros((2, M), bool)], np.array([1, 2]), verbose=0
    )
    assert np.isfinite(history.history["loss"]).all()
    assert all(np.isfinite(np_(v)).all() for v in layer.weights)


# -- the supervision loss -----------------------------------------------------
def test_supervision_loss_by_hand():
    attention = np.array(
        [
            [[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]],
            [[0.1, 0.8, 0.1], [0.3, 0.3, 0.4]],
            [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]],
        ],
        "float32",
    )
    supporting = np.array([[1, 0, 1], [0, 1, 0], [0, 0, 0]])
    hop0 = [-(0.5 * np.log(0.2) + 0.5 * np.log(0.5)), -np.log(0.8), 0.0]
    # Hop 1 of example 0: the supporting fact 2 got 0 (floored at 1e-30).
    hop1 = [-0.5 * np.log(1e-30), -np.log(0.3), 0.0]
    loss = al.memory_supervision_loss
    np.testing.assert_allclose(
        np_(loss(attention, supporting)), (np.add(hop0, hop1)) / 2, rtol=1e-5
    )
    np.testing.assert_allclose(np_(loss(attention, supporting, [0])), hop0, rtol=1e-5)
    np.testing.assert_allclose(np_(loss(attention, supporting, 0)), hop0, rtol=1e-5)
    np.testing.assert_allclose(np_(loss(attention, supporting, -1)), hop1, rtol=1e-5)
    np.testing.assert_allclose(
        np_(loss(attention, supporting.astype(bool), [1, 0])),
        (np.add(hop0, hop1)) / 2,
        rtol=1e-5,
    )
    # All the attention on the only supporting fact: 0.
    assert float(np_(loss(np.eye(3)[None, :1], np.eye(3)[:1]))[0]) == 0.0
    # The layer adds weight * the batch mean and returns the attention.
    layer = al.MemorySupervisionLoss(weight=0.5, hops=[0])
    out = layer(attention, supporting)
    np.testing.assert_array_equal(np_(out), attention)
    np.testing.assert_allclose(
        float(np_(layer.losses[0])), 0.5 * np.mean(hop0), rtol=1e-5
    )
    config = json.loads(json.dumps(layer.get_config()))
    assert config["weight"] == 0.5 and config["hops"] == [0]
    clone = al.MemorySupervisionLoss.from_config(config)
    assert clone.get_config() == layer.get_config()


# The last table only reaches the answer, which this model does not train.
@pytest.mark.filterwarnings("ignore:Gradients do not exist")
def test_supervision_loss_of_a_saturated_attention_trains_finitely():
    """Scores far apart: the attention on the supporting fact underflows to 0,
    and the loss and its gradients stay finite."""
    layer = built_layer()
    for table in layer.embeddings:
        table.embeddings.assign(
            np.random.default_rng(0).normal(scale=30.0, size=(V, D)).astype("float32")
        )
    x = keras.Input((M, W), dtype="int32")
    q = keras.Input((3,), dtype="int32")
    sup = keras.Input((M,), dtype="bool")
    logits, attention = layer(x, q, return_attention=True)
    attention = al.MemorySupervisionLoss()(attention, sup)
    model = keras.Model([x, q, sup], {"answer": logits, "attention": attention})
    model.compile(keras.optimizers.SGD(0.01))  # the supervision loss only
    supporting = np.array([[False, True, False], [True, False, False]])
    out = model.predict([STORY, QUESTION, supporting], verbose=0)
    on_fact = out["attention"].transpose(1, 0, 2)[:, supporting]  # [K, B]
    assert (on_fact < 1e-6).any()  # underflowed
    history = model.fit([STORY, QUESTION, supporting], verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert 10 < history.history["loss"][0] < 100
    assert all(np.isfinite(np_(v)).all() for v in layer.weights)


def test_supervision_loss_errors():
    attention = np.full((2, 2, 3), 1 / 3, "float32")
    supporting = np.eye(3)[:2]

    def fn_error(argument, fn):
        try:
            fn()
        except ValueError as e:
            msg = str(e)
        else:
            raise AssertionError(f"no ValueError for `{argument}`")
        for part in ("memory_supervision_loss", f"`{argument}`", "expected"):
            assert part in msg and "received" in msg, msg

    loss = al.memory_supervision_loss
    fn_error("attention", lambda: loss(attention[0], supporting))
    fn_error("supporting", lambda: loss(attention, supporting[0]))
    fn_error("supporting", lambda: loss(attention, supporting[:, :2]))
    for hops in (2, -3, [0, 5], [], "a", True, [0.5]):
        fn_error("hops", lambda h=hops: loss(attention, supporting, h))
    err = contract.assert_clear_error
    cls = al.MemorySupervisionLoss
    err(cls, "weight", lambda: cls(weight=-1.0))
    err(cls, "hops", lambda: cls(hops="first"))
    err(cls, "hops", lambda: cls(hops=[3])(attention, supporting))
    err(cls, "attention", lambda: cls()(attention[0], supporting))
    err(cls, "supporting", lambda: cls()(attention, supporting[0]))


# -- a tiny bAbI-style task ---------------------------------------------------------
NAMES = ["mary", "john", "sandra", "daniel"]
PLACES = ["kitchen", "garden", "office", "hallway"]
WORDS = ["<pad>", "moved", "to", "the", "where", "is", *NAMES, *PLACES]
ID = {w: i for i, w in enumerate(WORDS)}
FACTS, FACT_WORDS = 4, 5


def babi(n, seed=0):
    """Stories of 2-4 facts "<name> moved to the <place>" (distinct people),
    the question "where is <name>", the answer the place's id, and the
    supporting fact. Shorter stories end in padded sentences."""
    rng = np.random.default_rng(seed)
    story = np.zeros((n, FACTS, FACT_WORDS), "int32")
    question = np.zeros((n, 3), "int32")
    answer = np.zeros((n,), "int32")
    supporting = np.zeros((n, FACTS), bool)
    for b in range(n):
        count = rng.integers(2, FACTS + 1)
        people = rng.permutation(len(NAMES))[:count]
        places = rng.integers(0, len(PLACES), size=count)
        for i, (person, place) in enumerate(zip(people, places, strict=True)):
            words = [NAMES[person], "moved", "to", "the", PLACES[place]]
            story[b, i] = [ID[w] for w in words]
        asked = rng.integers(0, count)
        question[b] = [ID["where"], ID["is"], ID[NAMES[people[asked]]]]
        answer[b] = ID[PLACES[places[asked]]]
        supporting[b, asked] = True
    return story, question, answer, supporting


def babi_model(supervision_weight=1.0, jit_compile="auto", hops=2, dim=20):
    story = keras.Input((FACTS, FACT_WORDS), dtype="int32", name="story")
    question = keras.Input((3,), dtype="int32", name="question")
    supporting = keras.Input((FACTS,), dtype="bool", name="supporting")
    logits, attention = al.MemoryNetwork(
        len(WORDS), dim, max_memories=FACTS, max_words=FACT_WORDS, hops=hops
    )(story, question, return_attention=True)
    attention = al.MemorySupervisionLoss(supervision_weight, hops=[0])(
        attention, supporting
    )
    model = keras.Model(
        [story, question, supporting], {"answer": logits, "attention": attention}
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.02),
        loss={"answer": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        jit_compile=jit_compile,
    )
    return model


def test_babi_task_learns_to_answer_and_to_attend():
    story, question, answer, supporting = babi(640)
    model = babi_model()
    model.fit(
        [story, question, supporting],
        {"answer": answer},
        batch_size=32,
        epochs=12,
        verbose=0,
    )
    story, question, answer, supporting = babi(200, seed=1)
    out = model.predict([story, question, supporting], batch_size=200, verbose=0)
    accuracy = np.mean(out["answer"].argmax(-1) == answer)
    assert accuracy > 0.8, accuracy  # chance: 1 / 4
    on_fact = out["attention"][:, 0][supporting]  # hop 1 on the supporting fact
    assert on_fact.mean() > 0.7, on_fact.mean()


def test_jit_compiled_fit_lowers_the_loss():
    story, question, answer, supporting = babi(128)
    model = babi_model(jit_compile=True, dim=12)
    history = model.fit(
        [story, question, supporting],
        {"answer": answer},
        batch_size=32,
        epochs=4,
        verbose=0,
    )
    losses = history.history["loss"]
    assert np.isfinite(losses).all(), losses
    assert losses[-1] < 0.8 * losses[0], losses


# -- contract clauses -------------------------------------------------------------
class MemoryCase(contract.Case):
    """The layer as a `contract.Case`: ``output`` is the answer logits,
    ``weights`` the attention of every hop (``return_attention_scores`` asks
    for it); the inputs are word ids."""

    def arrays(self, seed=0, scale=1.0):
        rng = np.random.default_rng(seed)
        story = rng.integers(1, V, size=(contract.BATCH, M, W)).astype("int32")
        story[:, :, -1] = 0  # padded words
        story[1, 2] = 0  # a padded sentence
        question = rng.integers(0, V, size=(contract.BATCH, W)).astype("int32")
        return {"story": story, "question": question}

    def masks(self):
        mask = np.ones((contract.BATCH, M), bool)
        mask[0, 0] = False
        mask[1, 2] = False
        return {"story_mask": mask}

    def call(self, layer, arrays, masks=None, return_attention_scores=False, **kw):
        return layer(
            **arrays, **(masks or {}), return_attention=return_attention_scores, **kw
        )

    def functional_model(self, layer, with_masks=True):
        feed = self.feed(with_masks)
        inputs = {
            k: keras.Input(shape=v.shape[1:], name=k, dtype=v.dtype.name)
            for k, v in feed.items()
        }
        logits, attention = layer(**inputs, return_attention=True)
        return keras.Model(inputs, {"output": logits, "weights": attention})


def memory_network(**kwargs):
    return al.MemoryNetwork(V, D, max_memories=M, max_words=W, hops=2, **kwargs)


CASES = {
    "adjacent": MemoryCase("memory_adjacent", memory_network),
    "layerwise": MemoryCase(
        "memory_layerwise", partial(memory_network, weight_tying="layerwise")
    ),
    "readout": MemoryCase("memory_readout", partial(memory_network, readout_units=5)),
}
TYINGS = list(CASES)  # the two tyings, and the residual readout


@pytest.mark.parametrize("case", TYINGS)
def test_config_round_trip(case):
    contract.check_config(CASES[case])
    tying, readout = ("adjacent", 6) if case == "readout" else (case, 0)
    layer = al.MemoryNetwork(
        V, D, 3, 4, hops=4, position_encoding=False, weight_tying=tying,
        readout_units=readout, name="mem",
    )  # fmt: skip
    config = json.loads(json.dumps(layer.get_config()))
    assert config["hops"] == 4 and config["weight_tying"] == tying
    assert config["readout_units"] == readout
    assert config["max_memories"] == 3 and config["max_words"] == 4
    assert al.MemoryNetwork.from_config(config).get_config() == layer.get_config()


@pytest.mark.parametrize("tying", TYINGS)
def test_keras_file_round_trip(tying, tmp_path):
    contract.check_keras_file(CASES[tying], str(tmp_path))


@pytest.mark.parametrize("tying", TYINGS)
def test_initial_weights_are_distinct(tying):
    contract.check_distinct_initial_weights(CASES[tying])


# One fresh TensorFlow process, 8 to 20 s on two cores: make test-slow.
@pytest.mark.slow
@pytest.mark.tf_only
def test_saved_model_loads_without_the_library(tmp_path):
    contract.check_saved_model(CASES["adjacent"], str(tmp_path))


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy):
    contract.check_mixed_precision(CASES["adjacent"], policy)
    contract.check_mixed_precision(CASES["readout"], policy)
    layer = memory_network(dtype=policy)
    story = CASES["adjacent"].arrays()["story"]
    question = CASES["adjacent"].arrays()["question"]
    layer(story, question)
    # Large embeddings: the float32 scores and softmax stay finite and normalised.
    for table in layer.embeddings:
        table.embeddings.assign(np.full((V, D), 30.0, "float32"))
    _, attention = layer(story, question, return_attention=True)
    attention = np_(attention).astype("float32")
    assert np.isfinite(attention).all()
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=2e-2)


def test_bad_input_raises_clear_errors():
    err = contract.assert_clear_error
    cls = al.MemoryNetwork

    def call(story=STORY, question=QUESTION, **kw):
        return lambda: memory_network()(story, question, **kw)

    err(cls, "story", call(story=STORY.astype("float32")))
    err(cls, "question", call(question=QUESTION.astype("float32")))
    err(cls, "story", call(story=STORY[0]))  # rank 2
    err(cls, "story", call(story=STORY[..., None]))  # rank 4
    err(cls, "question", call(question=QUESTION[0]))
    err(cls, "story", call(story=np.ones((2, M + 1, W), "int32")))  # > max_memories
    err(cls, "story", call(story=np.ones((2, M, W + 1), "int32")))  # > max_words
    err(cls, "question", call(question=np.ones((2, W + 1), "int32")))
    err(cls, "question", call(question=QUESTION[:1]))  # batch
    err(cls, "story_mask", call(story_mask=np.ones((2, M + 1), bool)))
    err(cls, "story", call(story=np.full_like(STORY, V)))  # id out of range
    err(cls, "question", call(question=-np.ones_like(QUESTION)))
    # A built layer checks every call.
    layer = memory_network()
    layer(STORY, QUESTION)
    err(cls, "story", lambda: layer(np.ones((2, M + 1, W), "int32"), QUESTION))
    for kwargs, argument in [
        ({"vocab_size": 0}, "vocab_size"),
        ({"embed_dim": 2.5}, "embed_dim"),
        ({"max_memories": None}, "max_memories"),
        ({"max_words": 0}, "max_words"),
        ({"hops": 0}, "hops"),
        ({"hops": True}, "hops"),
        ({"weight_tying": "rnn"}, "weight_tying"),
        ({"position_encoding": "yes"}, "position_encoding"),
        ({"position_encoding": 1}, "position_encoding"),
        ({"temporal_encoding": 1}, "temporal_encoding"),
        ({"readout_units": -1}, "readout_units"),
        ({"readout_units": 2.5}, "readout_units"),
        ({"readout_units": True}, "readout_units"),
    ]:
        args = {"vocab_size": V, "embed_dim": D, "max_memories": M, "max_words": W}
        err(cls, argument, lambda kw=kwargs, a=args: cls(**{**a, **kw}))
