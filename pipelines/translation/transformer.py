"""The Transformer encoder-decoder (Vaswani et al. 2017) of the translation pipeline.

Pre-norm blocks from `attention_layers` (``TransformerEncoderBlock``,
``TransformerDecoderBlock``), sinusoidal positions, a final layer norm on
both sides; decoding runs one token at a time through the decoder's KV
caches (`attention_layers.decoding.transformer_step_fn`). Sizes come from
`ModelConfig`: ``embedding_dim`` is the model width, ``num_layers``,
``num_heads``, ``intermediate_dim``, ``dropout``.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

import attention_layers as al
from attention_layers.decoding import transformer_initial_state, transformer_step_fn
from pipelines.core.text import PAD
from pipelines.translation.config import ModelConfig


class TransformerSeq2Seq:
    def __init__(
        self,
        config: ModelConfig,
        source_vocab: int,
        target_vocab: int,
        max_target_length: int,
    ):
        self.config = config
        self.max_target_length = max_target_length
        width = config.embedding_dim

        def block(kind, i):
            side = "encoder" if kind is al.TransformerEncoderBlock else "decoder"
            return kind(
                num_heads=config.num_heads,
                intermediate_dim=config.intermediate_dim,
                dropout=config.dropout,
                norm_first=True,
                name=f"{side}_{i}",
            )

        self.source_embedding = keras.layers.Embedding(
            source_vocab, width, name="source_embedding"
        )
        self.target_embedding = keras.layers.Embedding(
            target_vocab, width, name="target_embedding"
        )
        self.positions = al.SinusoidalPositionEncoding(name="positions")
        self.encoder_blocks = [
            block(al.TransformerEncoderBlock, i) for i in range(config.num_layers)
        ]
        self.decoder_blocks = [
            block(al.TransformerDecoderBlock, i) for i in range(config.num_layers)
        ]
        self.encoder_norm = keras.layers.LayerNormalization(name="encoder_norm")
        self.decoder_norm = keras.layers.LayerNormalization(name="decoder_norm")
        self.projection = keras.layers.Dense(target_vocab, name="logits")

        source = keras.Input((None,), dtype="int32", name="source")
        target_in = keras.Input((None,), dtype="int32", name="target_in")
        memory = self._encode(source)
        x = self._embed(self.target_embedding, target_in)
        for layer in self.decoder_blocks:
            x = layer(
                x,
                memory,
                decoder_padding_mask=ops.not_equal(target_in, PAD),
                encoder_padding_mask=ops.not_equal(source, PAD),
            )
        logits = self.projection(self.decoder_norm(x))
        self.trainer = keras.Model(
            {"source": source, "target_in": target_in}, logits, name="transformer"
        )

    def _embed(self, embedding, ids):
        x = embedding(ids)
        return x + ops.cast(self.positions(x), x.dtype)

    def _encode(self, source, training=None):
        x = self._embed(self.source_embedding, source)
        mask = ops.not_equal(source, PAD)
        for layer in self.encoder_blocks:
            x = layer(x, padding_mask=mask, training=training)
        return self.encoder_norm(x)

    def encode(self, source_ids) -> dict[str, Any]:
        return {
            "memory": self._encode(source_ids, training=False),
            "mask": ops.not_equal(source_ids, PAD),
        }

    def initial_state(self, encoded: dict[str, Any]):
        batch = ops.shape(encoded["memory"])[0]
        return transformer_initial_state(
            self.decoder_blocks,
            batch,
            self.max_target_length,
            encoded["memory"],
            encoded["mask"],
        )

    def step_fn(self, encoded: dict[str, Any]):
        """The cached step; the memory travels in the state, not in ``encoded``."""

        def project(x):
            return self.projection(self.decoder_norm(x))

        return transformer_step_fn(
            self.target_embedding, self.decoder_blocks, project, self.positions
        )
