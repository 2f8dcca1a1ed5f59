"""The pointer-generator network with coverage (See et al. 2017), as a model.

One vocabulary serves both sides (the copy mechanism puts source words into
the output distribution, so they must share ids), with one embedding. The
encoder is a bidirectional GRU; the decoder an `AttentionDecoder` around a
GRU cell with `BahdanauAttention`, whose output is ``[s_t; h*_t]`` (the
state and the context), read out by ``V'(V [s_t; h*_t] + b) + b'`` as in the
paper. Three variants, chosen by the arguments:

* ``pointer=False``: the attention baseline, logits over the vocabulary;
* ``pointer=True``: a `PointerGenerator` mixes the vocabulary distribution
  with the attention over the source, log-probabilities over the
  vocabulary extended by the source's own words
  (`attention_layers.extended_source_ids`);
* ``coverage=True`` (with the pointer): the attention sees the coverage
  vector, and `PhasedCoverageLoss` adds ``weight * sum_i min(a_i^t, c_i^t)``
  to the training loss (`attention_layers.coverage_loss`) with a weight that
  `set_coverage_weight` changes between training phases: See et al. train
  the pointer-generator first and add the coverage loss for a short final
  phase.

``trainer`` maps ``{"source", "source_ext", "target_in"}`` (vocabulary ids,
extended ids, the decoder input with copies as ``[UNK]``) to the teacher-
forced outputs; ``encode`` and ``step_fn`` drive `attention_layers.decoding`.
The step returns the attention with ``p_gen`` appended as a last column
(``[N, S + 1]``): the decoders keep alignments per hypothesis, reordered
with the beams, so ``p_gen`` follows its hypothesis the same way; split it
off with `split_p_gen`.

Example:

>>> import numpy as np
>>> model = PointerSeq2Seq(vocab_size=12, embedding_dim=4, units=4,
...                        attention_units=4, pointer=True, coverage=True)
>>> source = np.array([[5, 1, 6]])        # word 1 is [UNK]: an OOV word
>>> source_ext = np.array([[5, 13, 6]])   # ... copied as extended id V + 1
>>> target_in = np.array([[2, 1]])        # [START], then the copy fed as [UNK]
>>> out = model.trainer({"source": source, "source_ext": source_ext,
...                      "target_in": target_in})
>>> tuple(out.shape)  # log-probabilities over V + S
(1, 2, 15)
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

import attention_layers as al
from pipelines.core.text import PAD, UNK


class PhasedCoverageLoss(keras.layers.Layer):
    """`attention_layers.CoverageLoss` with a weight that can change in training.

    The weight is a non-trainable variable (saved with the weights, so a
    resumed run has the phase's weight); the loss is added in training only,
    so the validation loss stays the cross-entropy that phases compare.
    Returns the alignments unchanged.
    """

    def __init__(self, weight=0.0, **kwargs):
        super().__init__(**kwargs)
        self.initial_weight = float(weight)
        self.supports_masking = True  # the target mask passes on

    def build(self, alignments_shape, mask_shape=None):
        self.weight = self.add_weight(
            shape=(),
            initializer=keras.initializers.Constant(self.initial_weight),
            trainable=False,
            name="weight",
        )

    def call(self, alignments, mask=None, training=None):
        if training:
            loss = ops.mean(al.coverage_loss(alignments, mask))
            self.add_loss(ops.cast(self.weight, "float32") * loss)
        return alignments

    def compute_output_shape(self, alignments_shape, mask_shape=None):
        return alignments_shape

    def get_config(self):
        return {**super().get_config(), "weight": self.initial_weight}


class Unmasked(keras.layers.Layer):
    """Passes its input on without a Keras mask: the loss (`SequenceNLL`)
    masks the padding itself, per summary, instead of Keras' mean over the
    batch's tokens."""

    def call(self, inputs, mask=None):
        return ops.copy(inputs)  # a new tensor: the input's mask stays behind

    def compute_mask(self, inputs, mask=None):
        return None


def split_p_gen(alignments):
    """``(attention [..., S], p_gen [...])`` of the step outputs of `step_fn`."""
    return alignments[..., :-1], alignments[..., -1]


class PointerSeq2Seq:
    """BiGRU encoder, attention GRU decoder, optional pointer and coverage."""

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        units: int,
        attention_units: int,
        pointer: bool = True,
        coverage: bool = False,
        coverage_weight: float = 0.0,
        dropout: float = 0.0,
    ):
        if coverage and not pointer:
            raise ValueError(
                "PointerSeq2Seq: coverage=True needs pointer=True (the paper's "
                "coverage model is the pointer-generator with coverage)."
            )
        self.vocab_size = int(vocab_size)
        self.pointer = pointer
        self.coverage = coverage
        source = keras.Input((None,), dtype="int32", name="source")
        source_ext = keras.Input((None,), dtype="int32", name="source_ext")
        target_in = keras.Input((None,), dtype="int32", name="target_in")
        self.embedding = keras.layers.Embedding(
            vocab_size, embedding_dim, mask_zero=True, name="embedding"
        )
        self.encoder_rnn = keras.layers.Bidirectional(
            keras.layers.GRU(
                units, return_sequences=True, return_state=True, dropout=dropout
            ),
            name="encoder",
        )
        self.bridge = keras.layers.Dense(2 * units, activation="tanh", name="bridge")
        self.decoder = al.AttentionDecoder(
            al.AttentionRNNCell(
                keras.layers.GRUCell(2 * units),
                al.BahdanauAttention(attention_units, use_coverage=coverage),
                output_units=None,  # the output is [s_t; h*_t]
                input_feeding=False,
            ),
            name="decoder",
        )
        self.hidden = keras.layers.Dense(2 * units, name="readout")  # V [s; h*] + b
        self.projection = keras.layers.Dense(vocab_size, name="logits")  # V'(.) + b'
        self.copy = al.PointerGenerator(vocab_size, name="pointer") if pointer else None

        memory, state = self._encode(source)
        embedded = self.embedding(target_in)
        outputs, alignments = self.decoder(
            embedded,
            memory,
            query_mask=ops.not_equal(target_in, PAD),
            value_mask=ops.not_equal(source, PAD),
            initial_state=[state],
            return_attention_scores=True,
        )
        self.coverage_loss = None
        if coverage:
            self.coverage_loss = PhasedCoverageLoss(coverage_weight, name="coverage")
            alignments = self.coverage_loss(
                alignments, mask=ops.not_equal(target_in, PAD)
            )
        logits = self.projection(self.hidden(outputs))
        if pointer:
            output = self.copy(
                logits,
                alignments,
                source_ext,
                ops.concatenate([outputs, ops.cast(embedded, outputs.dtype)], -1),
                source_mask=ops.not_equal(source, PAD),
            )
        else:
            output = logits
        self.trainer = keras.Model(
            {"source": source, "source_ext": source_ext, "target_in": target_in},
            Unmasked(name="unmasked")(output),
            name="pointer_generator" if pointer else "attention_baseline",
        )

    def set_coverage_weight(self, weight: float) -> None:
        """The coverage loss weight from now on (a model with coverage only)."""
        if self.coverage_loss is None:
            raise ValueError("PointerSeq2Seq: this model has no coverage.")
        self.coverage_loss.weight.assign(float(weight))

    def _encode(self, source, training=None):
        memory, forward, backward = self.encoder_rnn(
            self.embedding(source), training=training
        )
        return memory, self.bridge(ops.concatenate([forward, backward], -1))

    def encode(self, source_ids, source_ext) -> dict[str, Any]:
        """What decoding needs: memory, its mask, extended ids, first state."""
        memory, state = self._encode(source_ids, training=False)
        return {
            "memory": memory,
            "mask": ops.not_equal(source_ids, PAD),
            "source_ext": ops.cast(source_ext, "int32"),
            "state": state,
        }

    def initial_state(self, encoded: dict[str, Any]):
        batch = ops.shape(encoded["state"])[0]
        return self.decoder.initial_states(
            batch, [encoded["state"]], memory=encoded["memory"]
        )

    def step_fn(self, encoded: dict[str, Any]):
        """``step(ids, state) -> (scores, state, [attention; p_gen])``.

        Chosen extended ids past the vocabulary (copies) are fed back as
        ``[UNK]``. The baseline's ``p_gen`` column is 1 (it only generates).
        """
        cell = self.decoder.cell
        memory, mask = encoded["memory"], encoded["mask"]

        def step(ids, state):
            ids = al.copy_step_inputs(ids, self.vocab_size, UNK)
            x = self.embedding(ids)
            output, new_state, weights = cell(x, list(state), memory, memory_mask=mask)
            logits = self.projection(self.hidden(output))
            if self.pointer:
                scores, p_gen = self.copy(
                    logits,
                    weights,
                    encoded["source_ext"],
                    ops.concatenate([output, ops.cast(x, output.dtype)], -1),
                    source_mask=mask,
                    return_p_gen=True,
                )
            else:
                scores, p_gen = logits, ops.ones_like(weights[:, 0])
            alignment = ops.concatenate(
                [ops.cast(weights, "float32"), ops.expand_dims(p_gen, 1)], -1
            )
            return scores, list(new_state), alignment

        return step
