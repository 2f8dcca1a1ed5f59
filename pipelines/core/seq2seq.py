"""The recurrent encoder-decoder with attention that more than one task builds.

`RNNSeq2Seq` is the recurrent model that text-to-text tasks choose with
their ``model.type``: a bidirectional GRU encoder and a GRU
decoder with an attention of `attention_layers` (or none: the fixed-vector
baseline). Its settings are those of `Seq2SeqConfig`; a task's own model
section with the same fields serves as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import keras
from keras import ops

import attention_layers as al
from attention_layers.decoding import rnn_step_fn
from pipelines.core.text import PAD


@dataclass
class Seq2SeqConfig:
    """What `RNNSeq2Seq` reads of a model section."""

    attention: Literal[
        "bahdanau", "luong_dot", "luong_general", "luong_concat", "local_p", "none"
    ] = "bahdanau"
    embedding_dim: int = 64
    units: int = 128  # encoder GRU per direction; the decoder has twice as many
    attention_units: int = 128
    input_feeding: bool = True
    local_window: int = 8  # D of local-p
    dropout: float = 0.0


def make_attention(config: Seq2SeqConfig) -> keras.layers.Layer:
    kind = config.attention
    if kind == "bahdanau":
        return al.BahdanauAttention(config.attention_units, name="attention")
    if kind.startswith("luong_"):
        mode = kind.split("_", 1)[1]
        units = config.attention_units if mode == "concat" else None
        return al.LuongAttention(score_mode=mode, units=units, name="attention")
    if kind == "local_p":
        return al.LocalAttention(
            mode="predictive",
            window=config.local_window,
            score_mode="general",
            units=config.attention_units,
            name="attention",
        )
    raise ValueError(f"model: no attention layer for {kind!r}.")


class RNNSeq2Seq:
    """BiGRU encoder and a GRU decoder, with or without attention."""

    def __init__(self, config: Seq2SeqConfig, source_vocab: int, target_vocab: int):
        self.config = config
        units = config.units
        self.attention = config.attention != "none"
        source = keras.Input((None,), dtype="int32", name="source")
        target_in = keras.Input((None,), dtype="int32", name="target_in")
        self.source_embedding = keras.layers.Embedding(
            source_vocab, config.embedding_dim, mask_zero=True, name="source_embedding"
        )
        self.target_embedding = keras.layers.Embedding(
            target_vocab, config.embedding_dim, mask_zero=True, name="target_embedding"
        )
        self.encoder_rnn = keras.layers.Bidirectional(
            keras.layers.GRU(
                units, return_sequences=True, return_state=True, dropout=config.dropout
            ),
            name="encoder",
        )
        self.bridge = keras.layers.Dense(2 * units, activation="tanh", name="bridge")
        self.projection = keras.layers.Dense(target_vocab, name="logits")
        memory, state = self._encode(source)
        embedded = self.target_embedding(target_in)
        if self.attention:
            self.decoder = al.AttentionDecoder(
                al.AttentionRNNCell(
                    keras.layers.GRUCell(2 * units),
                    make_attention(config),
                    output_units=2 * units,
                    input_feeding=config.input_feeding,
                ),
                name="decoder",
            )
            outputs = self.decoder(embedded, memory, initial_state=[state])
        else:
            self.decoder_cell = keras.layers.GRUCell(2 * units, name="decoder_cell")
            self.decoder = keras.layers.RNN(
                self.decoder_cell, return_sequences=True, name="decoder"
            )
            self.readout = keras.layers.Dense(2 * units, activation="tanh", name="out")
            # [B, 1, D] * [B, T, 1]: the fixed vector at every target step.
            context = ops.expand_dims(state, 1) * ops.ones_like(embedded[..., :1])
            mask = ops.not_equal(target_in, PAD)
            outputs = self.decoder(
                ops.concatenate([embedded, context], -1),
                initial_state=[state],
                mask=mask,
            )
            outputs = self.readout(ops.concatenate([outputs, context], -1))
        logits = self.projection(outputs)
        self.trainer = keras.Model(
            {"source": source, "target_in": target_in}, logits, name="seq2seq"
        )

    def _encode(self, source, training=None):
        embedded = self.source_embedding(source)
        memory, forward, backward = self.encoder_rnn(embedded, training=training)
        state = self.bridge(ops.concatenate([forward, backward], -1))
        return memory, state

    def encode(self, source_ids) -> dict[str, Any]:
        """Encoder outputs for decoding: memory, its mask and the first state."""
        memory, state = self._encode(source_ids, training=False)
        return {
            "memory": memory,
            "mask": ops.not_equal(source_ids, PAD),
            "state": state,
        }

    def initial_state(self, encoded: dict[str, Any]):
        if self.attention:
            batch = ops.shape(encoded["state"])[0]
            return self.decoder.initial_states(batch, [encoded["state"]])
        return [encoded["state"], encoded["state"]]  # [GRU state, fixed context]

    def step_fn(self, encoded: dict[str, Any]):
        """``step_fn(ids, state) -> (logits, state, alignment)``; see decoding."""
        if self.attention:
            return rnn_step_fn(
                self.target_embedding,
                self.decoder.cell,
                self.projection,
                encoded["memory"],
                encoded["mask"],
            )

        def step(ids, state):
            hidden, context = state
            inputs = ops.concatenate([self.target_embedding(ids), context], -1)
            output, new = self.decoder_cell(inputs, [hidden])
            new = new[0] if isinstance(new, (list, tuple)) else new
            readout = self.readout(ops.concatenate([output, context], -1))
            return self.projection(readout), [new, context], None

        return step
