"""Show, Attend and Tell's pieces: the context gate and the doubly stochastic loss.

Each is checked against the formula of Xu et al. (2015), computed here with
numpy from the layer's own weights.
"""

import keras
import numpy as np
import pytest

import attention_layers as al
from attention_layers.recurrent import AttentionDecoder, AttentionRNNCell

RNG = np.random.default_rng(11)
TARGET = RNG.normal(size=(2, 4, 5)).astype("float32")
GRID = RNG.normal(size=(2, 6, 8)).astype("float32")  # a 2x3 grid, flattened
TARGET_MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)


def np_(x):
    return keras.ops.convert_to_numpy(x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def gated_cell(input_feeding=True):
    return AttentionRNNCell(
        keras.layers.GRUCell(8),
        al.BahdanauAttention(units=4),
        output_units=7,
        input_feeding=input_feeding,
        context_gate=True,
    )


def test_gated_step_by_hand():
    """o_i = tanh(W_o [z_i; beta_i c_i]), beta_i = sigmoid(w_beta . z_i + b_beta)."""
    cell = gated_cell()
    cell.build((2, 5), None, GRID.shape)
    # A bias that moves the gate off 0.5, so a gate left out would show.
    kernel, _ = cell.gate_dense.get_weights()
    cell.gate_dense.set_weights([kernel, np.array([-1.5], "float32")])
    states = cell.get_initial_state(2)
    out, new_states, weights = cell(TARGET[:, 0], states, GRID)
    z, _ = cell.cell(np.concatenate([TARGET[:, 0], np.zeros((2, 7), "float32")], -1),
                     [np.zeros((2, 8), "float32")])  # fmt: skip
    z = np_(z)
    context, expected_weights = cell.attention(z, GRID, return_attention_scores=True)
    w_beta, b_beta = cell.gate_dense.get_weights()
    beta = sigmoid(z @ w_beta + b_beta)  # [B, 1]
    assert np.all((beta > 0.0) & (beta < 0.5))
    w_o = np_(cell.output_dense.kernel)
    expected = np.tanh(np.concatenate([z, beta * np_(context)], -1) @ w_o)
    np.testing.assert_allclose(np_(out), expected, rtol=1e-5, atol=1e-6)
    # The returned weights are the attention's, not scaled by the gate.
    np.testing.assert_allclose(np_(weights), np_(expected_weights), rtol=1e-6)
    np.testing.assert_allclose(np_(weights).sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np_(new_states[-1]), expected, rtol=1e-5, atol=1e-6)


def test_gated_decoder_without_feeding_equals_the_step_loop():
    """Without input feeding the decoder gates all steps at once, as the cell would."""
    cell = gated_cell(input_feeding=False)
    decoder = AttentionDecoder(cell)
    outputs, alignments = decoder(
        TARGET, GRID, query_mask=TARGET_MASK, return_attention_scores=True
    )
    states = decoder.initial_states(2)
    for t in range(TARGET.shape[1]):
        out, new, weights = cell(TARGET[:, t], states, GRID)
        keep = TARGET_MASK[:, t : t + 1]
        states = [np.where(keep, n, o) for n, o in zip(new, states, strict=True)]
        np.testing.assert_allclose(
            np_(outputs[:, t]), np.where(keep, out, 0), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            np_(alignments[:, t]), np.where(keep, weights, 0), rtol=1e-5, atol=1e-6
        )


def test_gate_config_round_trip_and_old_configs(tmp_path):
    cell = gated_cell()
    config = cell.get_config()
    assert config["context_gate"] is True
    assert AttentionRNNCell.from_config(config).context_gate
    old = dict(config, cell=keras.layers.GRUCell(8), attention=al.BahdanauAttention(4))
    del old["context_gate"]  # a config saved before the gate existed
    assert not AttentionRNNCell.from_config(old).context_gate
    with pytest.raises(ValueError, match=r"AttentionRNNCell.*`context_gate`"):
        AttentionRNNCell(
            keras.layers.GRUCell(8), al.BahdanauAttention(4), context_gate="yes"
        )
    # A model with the gate keeps its numbers through a .keras file.
    target = keras.Input((4, 5))
    grid = keras.Input((6, 8))
    model = keras.Model([target, grid], AttentionDecoder(gated_cell())(target, grid))
    path = tmp_path / "gated.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(
        np_(loaded([TARGET, GRID])), np_(model([TARGET, GRID])), rtol=1e-6
    )


def np_doubly_stochastic(a, mask=None, memory_mask=None):
    """sum_i (1 - sum_t a_ti)^2 with a loop over the steps, as eq. 14 reads."""
    batch, steps, positions = a.shape
    out = np.zeros(batch)
    for b in range(batch):
        totals = np.zeros(positions)
        for t in range(steps):
            if mask is None or mask[b, t]:
                totals += a[b, t]
        penalty = (1.0 - totals) ** 2
        if memory_mask is not None:
            penalty = penalty[memory_mask[b]]
        out[b] = penalty.sum()
    return out


def test_doubly_stochastic_loss_by_hand():
    a = np.array([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]]], "float32")
    # Sums over the steps: 0.5, 1.5, 0.0 -> 0.25 + 0.25 + 1.0
    np.testing.assert_allclose(np_(al.doubly_stochastic_loss(a)), [1.5])
    # Each position attended once in all: no penalty.
    np.testing.assert_allclose(np_(al.doubly_stochastic_loss(np.eye(3)[None])), [0.0])
    random = RNG.dirichlet(np.ones(6), size=(3, 5)).astype("float32")
    mask = RNG.uniform(size=(3, 5)) > 0.3
    memory_mask = RNG.uniform(size=(3, 6)) > 0.2
    for kwargs in ({}, {"mask": mask}, {"memory_mask": memory_mask},
                   {"mask": mask, "memory_mask": memory_mask}):  # fmt: skip
        np.testing.assert_allclose(
            np_(al.doubly_stochastic_loss(random, **kwargs)),
            np_doubly_stochastic(random, **kwargs),
            rtol=1e-5,
        )
    # NaN under masked steps or positions never reaches the loss.
    poisoned = random.copy()
    poisoned[~mask] = np.nan
    assert np.isfinite(np_(al.doubly_stochastic_loss(poisoned, mask))).all()


def test_doubly_stochastic_loss_refuses_bad_shapes():
    a = np.full((2, 3, 4), 0.25, "float32")
    with pytest.raises(ValueError, match="`alignments` expected a rank-3"):
        al.doubly_stochastic_loss(a[0])
    with pytest.raises(ValueError, match="`mask` expected a rank-2"):
        al.doubly_stochastic_loss(a, mask=np.ones((2, 3, 1), bool))
    with pytest.raises(ValueError, match="`memory_mask` expected a rank-2"):
        al.doubly_stochastic_loss(a, memory_mask=np.ones((4,), bool))
    with pytest.raises(ValueError, match=r"DoublyStochasticLoss.*`weight`"):
        al.DoublyStochasticLoss(weight=-1.0)
    with pytest.raises(ValueError, match=r"DoublyStochasticLoss.*`alignments`"):
        al.DoublyStochasticLoss()(a[0])


def test_doubly_stochastic_layer_adds_the_weighted_mean():
    a = RNG.dirichlet(np.ones(6), size=(3, 5)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)
    layer = al.DoublyStochasticLoss(weight=0.5)
    np.testing.assert_array_equal(np_(layer(a, mask)), a)
    (loss,) = layer.losses
    expected = 0.5 * np_doubly_stochastic(a, mask).mean()
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    clone = al.DoublyStochasticLoss.from_config(layer.get_config())
    assert clone.weight == 0.5


@pytest.mark.slow  # a training run
def test_penalty_spreads_the_attention_over_the_grid():
    """Trained on the penalty alone, a decoder's attention summed over its
    steps moves towards 1 at every grid position."""
    keras.utils.set_random_seed(0)
    target = keras.Input((6, 5))
    grid = keras.Input((6, 8))
    outputs, alignments = AttentionDecoder(gated_cell())(
        target, grid, return_attention_scores=True
    )
    alignments = al.DoublyStochasticLoss(weight=1.0)(alignments)
    model = keras.Model([target, grid], {"out": outputs, "alignments": alignments})
    model.compile(keras.optimizers.Adam(0.05))  # the penalty is the only loss
    x = [RNG.normal(size=(16, 6, 5)).astype("float32"),
         RNG.normal(size=(16, 6, 8)).astype("float32")]  # fmt: skip
    before = np_doubly_stochastic(np_(model(x)["alignments"])).mean()
    model.fit(x, None, epochs=30, batch_size=16, verbose=0)
    after = np_doubly_stochastic(np_(model(x)["alignments"])).mean()
    assert after < 0.5 * before, (before, after)
