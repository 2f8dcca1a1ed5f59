"""The question-answering export: a story and a question in, the answer out.

``serving_default`` takes ``story`` ``[B]`` (its sentences, each one memory
as in training, split in the graph as ``predict`` splits them: at line
breaks and after ``.``, ``!`` or ``?``) and ``question`` ``[B]`` strings,
and returns

* ``answer`` ``[B]`` string: the most probable of the answers seen in
  training;
* ``score`` ``[B]`` float32: its probability among those answers;
* ``attention`` ``[B, hops, S]`` float32: every hop's attention over the
  story's ``S`` sentences (the non-empty ones, in order; a sentence before
  the last ``model.max_memories`` is not read and gets 0);
* ``sentences`` ``[B, S]`` string: those sentences (``""`` pads).

With ``model.architecture="encoder_decoder"`` the answer is written word by
word (a list's items joined by ``,``); ``score`` is the probability of the
whole answer; ``attention`` is ``[B, max_answer_words + 1, S]``, one row per
decoding step (each word, then ``[END]``; rows after it are 0), each the
step's attention over the words summed per sentence (the question's words
take the rest); and ``steps`` ``[B, max_answer_words + 1]`` string names
each row (the word written, ``[END]``, ``""`` after).

A story without a word, or a question without one, is answered ``""`` with
score 0 and zero attention; an empty batch gives empty outputs. Inputs that
are not string vectors, hold invalid UTF-8, or differ in batch size are
refused with ``InvalidArgument`` naming the input.
"""

from __future__ import annotations

import tensorflow as tf

from pipelines.core.serving import StringPairModule

SENTENCE_END = r"([.!?])\s+"  # a sentence ends at . ! or ? before a space


def split_sentences(story: tf.Tensor) -> tf.RaggedTensor:
    """``[B]`` stories to ragged ``[B, None]`` non-empty, stripped sentences.

    A sentence ends at a line break, or at ``.``, ``!`` or ``?`` followed by
    white space: a story on one line reads as the same memories as one
    sentence per line, exactly as training files and ``predict`` are split
    (`pipelines.qa.babi.split_story`).

    >>> [s.decode() for s in split_sentences(tf.constant(
    ...     ["Mary moved. John went to the hallway.\\n\\n Bill left!"]))[0].numpy()]
    ['Mary moved.', 'John went to the hallway.', 'Bill left!']
    """
    lines = tf.strings.regex_replace(story, SENTENCE_END, "\\1\n")
    sentences = tf.strings.strip(tf.strings.split(lines, "\n"))
    return tf.ragged.boolean_mask(sentences, sentences != "")


def _at_least_one(ids: tf.Tensor, axes: list[int]) -> tf.Tensor:
    """Pad ``axes`` of ``ids`` with one zero slot where they are empty."""
    pads = [[0, 1] if axis in axes else [0, 0] for axis in range(ids.shape.rank)]
    sizes = [
        tf.maximum(tf.shape(ids)[axis], 1) if axis in axes else -1
        for axis in range(ids.shape.rank)
    ]
    return tf.slice(tf.pad(ids, pads), [0] * ids.shape.rank, tf.stack(sizes))


def attention_rows(config) -> int:
    """The second axis of the ``attention`` output: the memory network's hops,
    or the encoder-decoder's decoding steps (answer words and ``[END]``)."""
    if config.model.architecture == "encoder_decoder":
        return config.model.max_answer_words + 1
    return config.model.hops


def step_labels(out: dict) -> list[list[str]]:
    """Names of the ``attention`` rows worth showing, per answer: every hop of
    the memory network; the steps the encoder-decoder wrote (its export's
    ``steps`` output), each with its word.

    >>> import numpy as np
    >>> out = {"answer": [b"x"], "attention": np.zeros((1, 3, 2)),
    ...        "steps": np.array([[b"garden", b"[END]", b""]])}
    >>> step_labels(out)
    [['step 1 (garden)', 'step 2 ([END])']]
    """
    rows = out["attention"].shape[1]
    if "steps" not in out:
        return [[f"hop {k + 1}" for k in range(rows)]] * len(out["answer"])
    return [
        [f"step {k + 1} ({w.decode('utf-8')})" for k, w in enumerate(steps) if w]
        for steps in out["steps"]
    ]


def sentence_of_words(words: tf.RaggedTensor) -> tf.RaggedTensor:
    """``[B, (K), (W)]`` word ids -> ``[B, (K * W)]``: each word's sentence
    index within its story, in the order of ``words.merge_dims(1, 2)``."""
    sentences = words.values  # [sum K, (W)]
    within = tf.range(sentences.nrows()) - tf.gather(
        words.row_starts(), words.value_rowids()
    )
    return words.with_flat_values(
        tf.gather(within, sentences.value_rowids())
    ).merge_dims(1, 2)


class StoryAnswerer(StringPairModule):
    """The exported module of a trained `pipelines.qa.model.MemoryQA` or
    `pipelines.qa.model.GenerativeQA`."""

    input_names = ("story", "question")

    def __init__(self, model, preprocessors, config, samples):
        super().__init__(model.trainer, name="story_answerer")
        self.model = model
        self.generative = config.model.architecture == "encoder_decoder"
        self.tokenizer = preprocessors.tokenizer
        if self.generative:
            from pipelines.core.text import RESERVED

            words = RESERVED + preprocessors.answer_words
            self.answer_vocab = tf.constant(words, tf.string)
        else:
            self.answers = tf.constant(preprocessors.answers, tf.string)
            self.answer_ids = tf.constant(preprocessors.answer_ids, tf.int32)
        self.rows = attention_rows(config)
        self.max_memories = config.model.max_memories
        self.max_words = config.tokenizer.max_words
        self.samples = samples  # [(story, question)]

    def _word_ids(self, strings: tf.Tensor) -> tf.RaggedTensor:
        return self.tokenizer.tokenize(strings)[:, : self.max_words]

    def answer(self, story, question):
        story, question = self.checked_inputs(story, question)
        sentences = split_sentences(story)
        count = sentences.row_lengths()
        kept = tf.minimum(count, self.max_memories)
        skipped = count - kept  # the oldest sentences, not read
        first = sentences.row_starts() + skipped
        rows = tf.ragged.range(first, first + kept)
        read = tf.gather(sentences.flat_values, rows.flat_values)
        words = tf.RaggedTensor.from_row_lengths(self._word_ids(read), kept)
        story_ids = _at_least_one(words.to_tensor(0), [1, 2])
        question_words = self._word_ids(question)
        question_ids = _at_least_one(question_words.to_tensor(0), [1])
        answerable = tf.reduce_any(story_ids != 0, axis=[1, 2]) & tf.reduce_any(
            question_ids != 0, axis=1
        )
        if self.generative:
            answer, score, attention, extra = self._generate(words, question_words)
        else:
            answer, score, attention = self._classify(story_ids, question_ids)
            extra = {}
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
            "answer": tf.where(answerable, answer, ""),
            "score": tf.where(answerable, score, 0.0),
            "attention": spread,
            "sentences": sentences.to_tensor(""),
            **{k: tf.where(answerable[:, None], v, "") for k, v in extra.items()},
        }

    def _classify(self, story_ids, question_ids):
        """The memory network: the most probable answer and every hop's
        attention over the read memories."""
        logits, attention = self.model.scorer([story_ids, question_ids])
        candidates = tf.gather(tf.cast(logits, tf.float32), self.answer_ids, axis=1)
        probabilities = tf.nn.softmax(candidates)
        best = tf.argmax(probabilities, axis=1, output_type=tf.int32)
        return (
            tf.gather(self.answers, best),
            tf.reduce_max(probabilities, axis=1),
            attention,
        )

    def _generate(self, words, question_words):
        """The encoder-decoder, greedy: the answer's words joined by ``,``, the
        probability of the whole answer (``[END]`` included), and each step's
        attention summed over each read sentence's words (the question's
        share is left out, so a row sums to at most 1)."""
        from attention_layers.decoding import greedy_search
        from pipelines.core.text import END, PAD, RESERVED, START

        source = tf.concat([words.merge_dims(1, 2), question_words], axis=1)
        source_ids = _at_least_one(source.to_tensor(PAD), [1])
        width = tf.shape(source_ids)[1]
        question_of = tf.cast(tf.ones_like(question_words), tf.int64) * -1
        sentence_of = tf.concat([sentence_of_words(words), question_of], axis=1)
        sentence_of = tf.pad(
            sentence_of.to_tensor(-1), [[0, 0], [0, 1]], "CONSTANT", -1
        )
        sentence_of = sentence_of[:, :width]
        encoded = self.model.encode(source_ids)
        batch = tf.shape(source_ids)[0]
        out = greedy_search(
            self.model.step_fn(encoded),
            self.model.initial_state(encoded),
            tf.fill([batch], START),
            end_id=END,
            max_length=self.rows,
        )
        tokens = out["tokens"]  # [END] repeats after the first
        ends = tf.cast(tokens == END, tf.int32)
        before_end = tf.math.cumsum(ends, axis=1) == 0
        written = tf.math.cumsum(ends, axis=1, exclusive=True) == 0
        content = before_end & (tokens >= len(RESERVED))
        kept = tf.ragged.boolean_mask(tokens, content)
        answer = tf.strings.reduce_join(
            tf.gather(self.answer_vocab, kept), axis=1, separator=","
        )
        memories = tf.maximum(tf.reduce_max(words.row_lengths()), 1)
        by_sentence = tf.one_hot(sentence_of, tf.cast(memories, tf.int32))  # -1: 0
        alignments = tf.cast(out["alignments"], tf.float32)
        attention = tf.einsum("btl,blk->btk", alignments, by_sentence)
        steps = tf.where(written, tf.gather(self.answer_vocab, tokens), "")
        return answer, tf.exp(out["scores"]), attention, {"steps": steps}
