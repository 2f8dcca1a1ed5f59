"""The extractive export: a passage and a question in, the answer's span out.

``serving_default`` takes ``context`` ``[B]`` and ``question`` ``[B]``
strings and returns

* ``answer`` ``[B]`` string: the passage's text from ``start`` to ``end``,
  as written (case and inner spacing kept);
* ``start`` and ``end`` ``[B]`` int32: character offsets (Unicode code
  points, ``end`` exclusive) of the answer in the passage, so that
  ``context[start:end] == answer`` in Python;
* ``score`` ``[B]`` float32: the span's probability, ``p1(i) * p2(j)``.

The span is `attention_layers.best_span`'s: ``end >= start`` and at most
``model.max_span_length`` tokens, among the passage's first
``tokenizer.max_context_tokens`` tokens. A passage or a question without a
token gets answer ``""``, ``start = end = 0`` and score 0; an empty batch
gives empty outputs. Inputs that are not string vectors, hold invalid UTF-8
or differ in batch size are refused with ``InvalidArgument`` naming the input.
"""

from __future__ import annotations

import tensorflow as tf

from pipelines.core.serving import StringPairModule


def _chars_before(strings: tf.Tensor, byte_offsets: tf.Tensor) -> tf.Tensor:
    """Code points in the first ``byte_offsets`` bytes of each string."""
    head = tf.strings.substr(strings, tf.zeros_like(byte_offsets), byte_offsets)
    return tf.strings.length(head, unit="UTF8_CHAR")


class SpanAnswerer(StringPairModule):
    """The exported module of a trained `pipelines.extractive.model.SpanQA`."""

    input_names = ("context", "question")

    def __init__(self, model, preprocessors, config, samples):
        super().__init__(model.trainer, name="span_answerer")
        self.scorer = model.attention
        self.tokenizer = preprocessors.tokenizer
        self.max_context = config.tokenizer.max_context_tokens
        self.max_question = config.tokenizer.max_question_tokens
        self.max_span = config.model.max_span_length
        self.samples = samples  # [(context, question)]

    def inputs(self, context, question) -> tuple[dict, dict]:
        """The model's features of checked inputs, and the passage tokens'
        byte offsets (``begins``, ``ends``: dense ``[B, T]``)."""
        encoded = self.tokenizer.encode(
            context, question, self.max_context, self.max_question
        )
        features = {
            key: _at_least_one(encoded[key].to_tensor(0))
            for key in ("context", "match", "question")
        }
        offsets = {
            key: _at_least_one(encoded[key].to_tensor(0)) for key in ("begins", "ends")
        }
        return features, offsets

    def answer(self, context, question):
        import attention_layers as al

        context, question = self.checked_inputs(context, question)
        features, offsets = self.inputs(context, question)
        logits = self.trainer(features, training=False)
        start_logits = tf.cast(logits["start"], tf.float32)
        end_logits = tf.cast(logits["end"], tf.float32)
        mask = features["context"] != 0
        first, last, score = al.best_span(
            start_logits, end_logits, self.max_span, mask=mask
        )
        normaliser = tf.reduce_logsumexp(start_logits, 1) + tf.reduce_logsumexp(
            end_logits, 1
        )
        answerable = tf.reduce_any(mask, 1) & tf.reduce_any(
            features["question"] != 0, 1
        )
        begins = tf.gather(offsets["begins"], first, batch_dims=1)
        ends = tf.gather(offsets["ends"], last, batch_dims=1)
        begins = tf.where(answerable, begins, 0)
        ends = tf.where(answerable, ends, 0)
        return {
            "answer": tf.strings.substr(context, begins, ends - begins),
            "start": _chars_before(context, begins),
            "end": _chars_before(context, ends),
            "score": tf.where(answerable, tf.exp(score - normaliser), 0.0),
        }


def _at_least_one(values: tf.Tensor) -> tf.Tensor:
    """``[B, T]`` padded with one zero column where ``T`` is 0 (the model, the
    span search and the offsets it gathers from need a position)."""
    width = tf.maximum(tf.shape(values)[1], 1)
    return tf.pad(values, [[0, 0], [0, 1]])[:, :width]
