"""The Transformer encoder-decoder with the copy layer, for summarization.

The pre-norm blocks of `attention_layers` (as in the translation pipeline's
Transformer) over one shared vocabulary and embedding; the copy
distribution is the last decoder block's cross-attention averaged over its
heads (See et al.'s attention ``a^t``), and `PointerGenerator`'s ``p_gen``
sees ``[h_t; h*_t; x_t]``: the decoder output, the context (the attention's
mean of the memory) and the input embedding. ``pointer=False`` is the
Transformer over the vocabulary alone. No coverage: that is the RNN's
(`pipelines.summarization.model.PointerSeq2Seq`).

The interface is `PointerSeq2Seq`'s: ``trainer`` maps ``{"source",
"source_ext", "target_in"}`` to the teacher-forced outputs, ``encode``,
``initial_state`` and ``step_fn`` drive `attention_layers.decoding` through
the decoder's KV caches, and the step's alignment is ``[attention; p_gen]``.

Example:

>>> import numpy as np
>>> model = TransformerPointer(vocab_size=12, width=8, num_layers=1,
...                            num_heads=2, intermediate_dim=16, max_length=4)
>>> out = model.trainer({"source": np.array([[5, 1, 6]]),
...                      "source_ext": np.array([[5, 13, 6]]),
...                      "target_in": np.array([[2, 1]])})
>>> tuple(out.shape)  # log-probabilities over V + S
(1, 2, 15)
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

import attention_layers as al
from attention_layers.decoding import transformer_initial_state, transformer_step_fn
from pipelines.core.text import PAD, UNK
from pipelines.summarization.model import Unmasked


class TransformerPointer:
    """Transformer encoder-decoder; optional pointer over the cross-attention."""

    coverage = False

    def __init__(
        self,
        vocab_size: int,
        width: int,
        num_layers: int,
        num_heads: int,
        intermediate_dim: int,
        max_length: int,
        pointer: bool = True,
        dropout: float = 0.0,
    ):
        self.vocab_size = int(vocab_size)
        self.max_length = int(max_length)
        self.pointer = pointer

        def block(kind, side, i):
            return kind(
                num_heads=num_heads,
                intermediate_dim=intermediate_dim,
                dropout=dropout,
                norm_first=True,
                name=f"{side}_{i}",
            )

        self.embedding = keras.layers.Embedding(vocab_size, width, name="embedding")
        self.positions = al.SinusoidalPositionEncoding(name="positions")
        self.encoder_blocks = [
            block(al.TransformerEncoderBlock, "encoder", i) for i in range(num_layers)
        ]
        self.decoder_blocks = [
            block(al.TransformerDecoderBlock, "decoder", i) for i in range(num_layers)
        ]
        self.encoder_norm = keras.layers.LayerNormalization(name="encoder_norm")
        self.decoder_norm = keras.layers.LayerNormalization(name="decoder_norm")
        self.projection = keras.layers.Dense(vocab_size, name="logits")
        self.copy = al.PointerGenerator(vocab_size, name="pointer") if pointer else None

        source = keras.Input((None,), dtype="int32", name="source")
        source_ext = keras.Input((None,), dtype="int32", name="source_ext")
        target_in = keras.Input((None,), dtype="int32", name="target_in")
        source_mask = ops.not_equal(source, PAD)
        memory = self._encode(source)
        embedded = self.embedding(target_in)
        x = embedded + ops.cast(self.positions(embedded), embedded.dtype)
        for i, layer in enumerate(self.decoder_blocks):
            last = i == len(self.decoder_blocks) - 1
            out = layer(
                x,
                memory,
                decoder_padding_mask=ops.not_equal(target_in, PAD),
                encoder_padding_mask=source_mask,
                return_attention_scores=last,
            )
            x, scores = out if last else (out, None)
        hidden = self.decoder_norm(x)
        output = self._output(
            hidden, scores["alignment"], memory, embedded, source_ext, source_mask
        )
        self.trainer = keras.Model(
            {"source": source, "source_ext": source_ext, "target_in": target_in},
            Unmasked(name="unmasked")(output),
            name="transformer_pointer" if pointer else "transformer",
        )

    def _encode(self, source, training=None):
        x = self.embedding(source)
        x = x + ops.cast(self.positions(x), x.dtype)
        mask = ops.not_equal(source, PAD)
        for layer in self.encoder_blocks:
            x = layer(x, padding_mask=mask, training=training)
        return self.encoder_norm(x)

    def _output(self, hidden, attention, memory, embedded, source_ext, mask, p=False):
        """Logits (no pointer) or the copy layer's log-probabilities."""
        logits = self.projection(hidden)
        if not self.pointer:
            return (logits, ops.ones_like(attention[..., 0])) if p else logits
        attention = ops.cast(attention, memory.dtype)
        if len(attention.shape) == 2:  # one step: [N, S] over [N, S, W]
            context = ops.einsum("ns,nsw->nw", attention, memory)
        else:  # teacher forcing: [B, T, S] over [B, S, W]
            context = ops.einsum("bts,bsw->btw", attention, memory)
        features = ops.concatenate(
            [hidden, context, ops.cast(embedded, hidden.dtype)], -1
        )
        return self.copy(
            logits, attention, source_ext, features, source_mask=mask, return_p_gen=p
        )

    def set_coverage_weight(self, weight: float) -> None:
        raise ValueError("TransformerPointer: this model has no coverage.")

    def encode(self, source_ids, source_ext) -> dict[str, Any]:
        """Memory, its mask and the extended ids of the source."""
        return {
            "memory": self._encode(source_ids, training=False),
            "mask": ops.not_equal(source_ids, PAD),
            "source_ext": ops.cast(source_ext, "int32"),
        }

    def initial_state(self, encoded: dict[str, Any]):
        batch = ops.shape(encoded["memory"])[0]
        return transformer_initial_state(
            self.decoder_blocks,
            batch,
            self.max_length,
            encoded["memory"],
            encoded["mask"],
        )

    def step_fn(self, encoded: dict[str, Any]):
        """``step(ids, state) -> (scores, state, [attention; p_gen])`` through
        the KV caches; copies (ids ``>= V``) are fed back as ``[UNK]``."""
        inner = transformer_step_fn(
            self.embedding, self.decoder_blocks, lambda x: x, self.positions
        )
        memory, mask = encoded["memory"], encoded["mask"]

        def step(ids, state):
            ids = al.copy_step_inputs(ids, self.vocab_size, UNK)
            x, new_state, attention = inner(ids, state)
            scores, p_gen = self._output(
                self.decoder_norm(x),
                attention,
                memory,
                self.embedding(ids),
                encoded["source_ext"],
                mask,
                p=True,
            )
            alignment = ops.concatenate(
                [ops.cast(attention, "float32"), ops.expand_dims(p_gen, 1)], -1
            )
            return scores, new_state, alignment

        return step
