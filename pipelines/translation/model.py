"""Encoder-decoder models for translation, chosen by `ModelConfig`.

* ``rnn`` + an attention (``bahdanau``, ``luong_dot|general|concat``,
  ``local_p``): a bidirectional GRU encoder and an `AttentionDecoder` (GRU
  cell, the attention, input feeding optional) started from the encoder's
  final states (Bahdanau et al. 2015; Luong et al. 2015);
  `pipelines.core.seq2seq.RNNSeq2Seq`, which question answering uses too.
* ``transformer``: pre-norm Transformer blocks with KV-cached decoding
  (`pipelines.translation.transformer`).
* ``rnn`` + ``none``: the fixed-vector encoder-decoder (Cho et al. 2014): the
  decoder sees the encoder's final state only, as its initial state and as an
  extra input at every step. The baseline the attention papers argue against.

Every model exposes the same three things: ``trainer`` (teacher-forced
``{"source", "target_in"} -> logits``), ``encode(source_ids)`` and
``step_fn(encoded)`` for `attention_layers.decoding`.
"""

from __future__ import annotations

from pipelines.core.seq2seq import RNNSeq2Seq
from pipelines.translation.config import ModelConfig


def build_model(
    config: ModelConfig, source_vocab: int, target_vocab: int, max_target_length: int
):
    """The model named by ``config.architecture`` (``rnn`` or ``transformer``).

    ``max_target_length`` is the most tokens decoding writes (the length of
    the Transformer's self-attention caches).
    """
    if config.architecture == "rnn":
        return RNNSeq2Seq(config, source_vocab, target_vocab)
    from pipelines.translation.transformer import TransformerSeq2Seq

    return TransformerSeq2Seq(config, source_vocab, target_vocab, max_target_length)
