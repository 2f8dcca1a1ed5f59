"""The captioner: a CNN over the image, an attention RNN decoder over its grid.

Show, Attend and Tell (Xu et al. 2015) with a small CNN trained from scratch
(`ModelConfig`): the image becomes a grid of feature vectors with 2-D
sinusoidal positions (`attention_layers.SinusoidalPositionEncoding2D`),
flattened into the memory of an `attention_layers.AttentionDecoder` (GRU,
Bahdanau attention, the context gate ``beta_i``). The GRU starts from the
grid's mean. In training the doubly stochastic penalty
(`attention_layers.doubly_stochastic_loss`) is added to the cross-entropy.

Like the translation models it exposes ``trainer`` (teacher-forced
``{"image", "target_in"} -> logits``), ``encode(images)``,
``initial_state(encoded)`` and ``step_fn(encoded)`` for
`attention_layers.decoding`, plus ``grid`` (the grid's rows and columns).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

import attention_layers as al
from attention_layers.decoding import rnn_step_fn
from pipelines.core.text import PAD

# The grid is a few dozen cells wide: wavelengths up to 2 pi 100 tell them apart.
GRID_WAVELENGTH = 100


class TrainingPenalty(keras.layers.Layer):
    """Adds ``weight * mean_b doubly_stochastic_loss(alignments, target_mask)`` to the
    losses in training only (the validation loss stays the cross-entropy the
    early stopping compares) and returns the logits unchanged."""

    def __init__(self, weight: float, **kwargs):
        super().__init__(**kwargs)
        self.weight = float(weight)

    def call(self, logits, alignments, target_mask, training=None):
        if training and self.weight:
            penalty = al.doubly_stochastic_loss(alignments, target_mask)
            self.add_loss(self.weight * ops.mean(penalty))
        return ops.copy(logits)

    def compute_mask(self, inputs, mask=None):
        return None  # the loss skips PAD targets itself (ignore_class)

    def compute_output_shape(self, logits_shape, *_, **__):
        return logits_shape

    def get_config(self):
        return {**super().get_config(), "weight": self.weight}


class Captioner:
    """CNN encoder, attention decoder; see the module docstring."""

    def __init__(self, config, image, vocab_size: int):
        m = config  # ModelConfig
        self.config = m
        self.grid = (image.height // 2**m.pools, image.width // 2**m.pools)
        images = keras.Input((image.height, image.width, image.channels), name="image")
        target_in = keras.Input((None,), dtype="int32", name="target_in")
        self.cnn = [
            layer
            for stage in range(m.pools + 1)
            for layer in self._stage(m.filters * 2**stage, stage, last=stage == m.pools)
        ]
        self.to_memory = keras.layers.Dense(m.units, name="grid_projection")
        self.positions = al.SinusoidalPositionEncoding2D(
            max_wavelength=GRID_WAVELENGTH, name="grid_positions"
        )
        self.bridge = keras.layers.Dense(m.units, activation="tanh", name="bridge")
        self.embedding = keras.layers.Embedding(
            vocab_size, m.embedding_dim, mask_zero=True, name="word_embedding"
        )
        self.decoder = al.AttentionDecoder(
            al.AttentionRNNCell(
                keras.layers.GRUCell(m.units),
                al.BahdanauAttention(m.attention_units),
                output_units=m.units,
                input_feeding=m.input_feeding,
                context_gate=m.context_gate,
            ),
            name="decoder",
        )
        self.dropout = keras.layers.Dropout(m.dropout, name="dropout")
        self.projection = keras.layers.Dense(vocab_size, name="logits")
        memory, state = self._encode(images)
        outputs, alignments = self.decoder(
            self.embedding(target_in),
            memory,
            initial_state=[state],
            return_attention_scores=True,
        )
        logits = self.projection(self.dropout(outputs))
        logits = TrainingPenalty(m.doubly_stochastic, name="doubly_stochastic")(
            logits, alignments, ops.not_equal(target_in, PAD)
        )
        self.trainer = keras.Model(
            {"image": images, "target_in": target_in}, logits, name="show_attend_tell"
        )

    @staticmethod
    def _stage(filters: int, stage: int, last: bool) -> list:
        convolutions = [
            keras.layers.Conv2D(filters, 3, padding="same", activation="relu",
                                name=f"conv_{stage}_{i}")
            for i in range(2)
        ]  # fmt: skip
        return (
            convolutions
            if last
            else convolutions + [keras.layers.MaxPool2D(name=f"pool_{stage}")]
        )

    def _encode(self, images, training=None):
        x = images
        for layer in self.cnn:
            x = layer(x)
        x = self.to_memory(x)
        x = x + self.positions(x)
        memory = ops.reshape(x, (-1, self.grid[0] * self.grid[1], self.config.units))
        state = self.bridge(ops.mean(memory, axis=1))
        return memory, state

    def encode(self, images) -> dict[str, Any]:
        """The grid as memory ``[B, H' * W', units]``, its mask, the first state."""
        memory, state = self._encode(images, training=False)
        mask = ops.ones(ops.shape(memory)[:2], dtype="bool")
        return {"memory": memory, "mask": mask, "state": state}

    def initial_state(self, encoded: dict[str, Any]):
        batch = ops.shape(encoded["state"])[0]
        return self.decoder.initial_states(batch, [encoded["state"]])

    def step_fn(self, encoded: dict[str, Any]):
        """``step_fn(ids, state) -> (logits, state, alignment)``; see decoding."""
        return rnn_step_fn(
            self.embedding,
            self.decoder.cell,
            self.projection,
            encoded["memory"],
            encoded["mask"],
        )
