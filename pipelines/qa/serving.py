"""The question-answering export: a story and a question in, the answer out.

``serving_default`` takes ``story`` ``[B]`` (one sentence per line: each
non-empty line is one memory, as in training) and ``question`` ``[B]``
strings, and returns

* ``answer`` ``[B]`` string: the most probable of the answers seen in
  training;
* ``score`` ``[B]`` float32: its probability among those answers;
* ``attention`` ``[B, hops, S]`` float32: every hop's attention over the
  story's ``S`` sentences (the non-empty ones, in order; a sentence before
  the last ``model.max_memories`` is not read and gets 0);
* ``sentences`` ``[B, S]`` string: those sentences (``""`` pads).

A story without a word, or a question without one, is answered ``""`` with
score 0 and zero attention; an empty batch gives empty outputs. Inputs that
are not string vectors, hold invalid UTF-8, or differ in batch size are
refused with ``InvalidArgument`` naming the input.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from pipelines.core.serving import (
    ServingModule,
    checked_same_batch,
    checked_strings,
)


def split_sentences(story: tf.Tensor) -> tf.RaggedTensor:
    """``[B]`` stories to ragged ``[B, None]`` non-empty, stripped lines.

    A line is one memory, as in training (a story's sentences are its lines);
    ``predict`` puts each sentence of free text on its own line.
    """
    sentences = tf.strings.strip(tf.strings.split(story, "\n"))
    return tf.ragged.boolean_mask(sentences, sentences != "")


def _at_least_one(ids: tf.Tensor, axes: list[int]) -> tf.Tensor:
    """Pad ``axes`` of ``ids`` with one zero slot where they are empty."""
    pads = [[0, 1] if axis in axes else [0, 0] for axis in range(ids.shape.rank)]
    sizes = [
        tf.maximum(tf.shape(ids)[axis], 1) if axis in axes else -1
        for axis in range(ids.shape.rank)
    ]
    return tf.slice(tf.pad(ids, pads), [0] * ids.shape.rank, tf.stack(sizes))


class StoryAnswerer(ServingModule):
    """The exported module of a trained `pipelines.qa.model.MemoryQA`."""

    def __init__(self, model, preprocessors, config, samples):
        super().__init__(model.trainer, name="story_answerer")
        self.scorer = model.scorer
        self.tokenizer = preprocessors.tokenizer
        self.answers = tf.constant(preprocessors.answers, tf.string)
        self.answer_ids = tf.constant(preprocessors.answer_ids, tf.int32)
        self.hops = config.model.hops
        self.max_memories = config.model.max_memories
        self.max_words = config.tokenizer.max_words
        self.samples = samples  # [(story, question)]

    def _word_ids(self, strings: tf.Tensor) -> tf.RaggedTensor:
        return self.tokenizer.tokenize(strings)[:, : self.max_words]

    def answer(self, story, question):
        story, question = checked_same_batch(
            ("story", checked_strings("story", story)),
            ("question", checked_strings("question", question)),
        )
        sentences = split_sentences(story)
        count = sentences.row_lengths()
        kept = tf.minimum(count, self.max_memories)
        skipped = count - kept  # the oldest sentences, not read
        first = sentences.row_starts() + skipped
        rows = tf.ragged.range(first, first + kept)
        read = tf.gather(sentences.flat_values, rows.flat_values)
        words = tf.RaggedTensor.from_row_lengths(self._word_ids(read), kept)
        story_ids = _at_least_one(words.to_tensor(0), [1, 2])
        question_ids = _at_least_one(self._word_ids(question).to_tensor(0), [1])
        logits, attention = self.scorer([story_ids, question_ids])
        candidates = tf.gather(tf.cast(logits, tf.float32), self.answer_ids, axis=1)
        probabilities = tf.nn.softmax(candidates)
        best = tf.argmax(probabilities, axis=1, output_type=tf.int32)
        answerable = tf.reduce_any(story_ids != 0, axis=[1, 2]) & tf.reduce_any(
            question_ids != 0, axis=1
        )
        # Attention over every sentence of the story: position j of row b is
        # read memory j - skipped[b] (0 where that is not a read memory).
        attention = tf.cast(attention, tf.float32)
        width = tf.reduce_max(tf.concat([count, [0]], 0))
        position = tf.range(width)[None, :] - skipped[:, None]
        inside = (position >= 0) & (position < kept[:, None])
        position = tf.clip_by_value(
            position, 0, tf.cast(tf.shape(attention)[2] - 1, tf.int64)
        )
        spread = tf.gather(attention, position, axis=2, batch_dims=1)
        spread = tf.where(inside[:, None, :] & answerable[:, None, None], spread, 0.0)
        return {
            "answer": tf.where(answerable, tf.gather(self.answers, best), ""),
            "score": tf.where(answerable, tf.reduce_max(probabilities, axis=1), 0.0),
            "attention": spread,
            "sentences": sentences.to_tensor(""),
        }

    def signatures(self) -> dict:
        specs = [
            tf.TensorSpec(None, tf.string, name="story"),
            tf.TensorSpec(None, tf.string, name="question"),
        ]
        return {"serving_default": tf.function(self.answer, input_signature=specs)}

    def warmup_requests(self) -> list[dict]:
        return [
            {
                "story": np.array([s for s, _ in self.samples], dtype=object),
                "question": np.array([q for _, q in self.samples], dtype=object),
            }
        ]
