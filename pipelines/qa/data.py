"""The question-answering task's data: stories, questions, answers, and batches.

Examples are `pipelines.qa.babi.QAExample` (a story's sentences, the
question, the answer, the supporting facts' indices), generated bAbI-style
or read from the user's JSON Lines. `Preprocessors` are the word vocabulary
and the answer list; an answer that is one vocabulary word answers with that
word's id (its output embedding is the word's own, as in the paper's
adjacent tying), any other (``yes``, ``two``, ``apple,milk``) with an id of
its own after the vocabulary.

Example:

>>> from pipelines.qa.babi import QAExample
>>> from pipelines.qa.data import answer_ids
>>> answer_ids(["kitchen", "garden"], ["garden", "yes", "apple,milk"])
[5, 6, 7]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from pipelines.core.errors import PipelineError
from pipelines.core.task import Data
from pipelines.qa.babi import QAExample

SAMPLES = [
    "Mary moved to the bathroom. John went to the hallway. Where is Mary?",
    "Daniel journeyed to the office. Sandra went back to the garden. "
    "Daniel travelled to the kitchen. Where is Daniel?",
    "John moved to the bedroom. Mary went to the hallway. Is John in the bedroom?",
]


class Preprocessors(NamedTuple):
    tokenizer: object  # pipelines.core.text.WordTokenizer
    answers: list[str]  # the answers the model can give, sorted

    @property
    def answer_ids(self) -> list[int]:
        return answer_ids(self.tokenizer.words, self.answers)

    @property
    def answer_words(self) -> list[str]:
        """The encoder-decoder's output words (`answer_words`)."""
        return answer_words(self.answers)

    @property
    def vocab_size(self) -> int:
        """Word ids and the answers' own ids: the memory network's vocabulary."""
        return max([self.tokenizer.vocab_size - 1, *self.answer_ids]) + 1


def answer_ids(words: Sequence[str], answers: Sequence[str]) -> list[int]:
    """The output id of each answer: its word id (`WordTokenizer`: word ``k``
    of ``words`` is id ``4 + k``) when the answer is one vocabulary word,
    else the next id after the vocabulary, in the order of ``answers``."""
    from pipelines.core.text import RESERVED

    index = {w: len(RESERVED) + k for k, w in enumerate(words)}
    next_id = len(RESERVED) + len(words)
    ids = []
    for answer in answers:
        if answer in index:
            ids.append(index[answer])
        else:
            ids.append(next_id)
            next_id += 1
    return ids


def answer_words(answers: Sequence[str]) -> list[str]:
    """The words the encoder-decoder writes: every answer's items (the list
    answer ``apple,milk`` is two), sorted. Word ``k`` is id ``4 + k``.

    >>> answer_words(["garden", "apple,milk", "no"])
    ['apple', 'garden', 'milk', 'no']
    """
    return sorted({w for a in answers for w in a.split(",") if w})


def max_source_words(config) -> int:
    """The longest source the encoder-decoder reads: every kept sentence's
    words, then the question's."""
    return (config.model.max_memories + 1) * config.tokenizer.max_words


def load_data(config) -> Data:
    """The configured examples split into train / valid / test, with notes."""
    from pipelines.core.errors import ConfigError
    from pipelines.qa import babi

    d = config.data
    kind, _, argument = d.source.partition(":")
    if kind == "babi":
        try:
            tasks, size = babi.parse_babi_spec(d.source)
        except ValueError as error:
            raise ConfigError(f"config: `data.source`: {error}") from None
        train, valid, test, notes = babi.load_babi(
            tasks,
            size=size,
            test_size=d.test_size,
            valid_fraction=d.valid_fraction,
            seed=d.seed,
        )
    elif kind == "babi-text" and argument:
        from pipelines.qa.babi_text import load_babi_files

        train, valid, test, notes = load_babi_files(argument, d.valid_fraction)
    elif kind == "jsonl" and argument:
        from pipelines.data import read_examples, split_by_key

        examples = read_examples(babi.read_qa_jsonl, argument)
        notes = [f"read {len(examples)} questions from {argument}"]
        keys = [babi.format_story(e) + "\n" + e.question for e in examples]
        train, valid, test = split_by_key(examples, keys, d)
    else:
        raise ConfigError(
            "config: `data.source` must be babi:TASKS[@SIZE] (e.g. babi:1,2@10k), "
            f"babi-text:FOLDER or jsonl:PATH, received {d.source!r}."
        )
    notes = list(notes)
    limit, words = config.model.max_memories, config.tokenizer.max_words
    everything = train + valid + test
    long_stories = sum(len(e.story) > limit for e in everything)
    lost = sum(
        any(i < len(e.story) - limit for i in e.supporting)
        for e in everything
        if len(e.story) > limit
    )
    notes.append(
        f"cut {long_stories} stories to their last {limit} sentences "
        f"(model.max_memories); {lost} of them lost a supporting fact"
    )
    sentences = {s for e in everything for s in (*e.story, e.question)}
    long_sentences = sum(len(re.findall(r"\w+|[^\w\s]", s)) > words for s in sentences)
    notes.append(
        f"cut {long_sentences} of {len(sentences)} distinct sentences and questions "
        f"longer than about {words} words and marks (tokenizer.max_words)"
    )
    if config.model.architecture == "encoder_decoder":
        limit = config.model.max_answer_words
        long_answers = sum(len(e.answer.split(",")) > limit for e in everything)
        notes.append(
            f"cut {long_answers} answers to their first {limit} items "
            "(model.max_answer_words)"
        )
    return Data(train, valid, test, notes)


def kept_story(example: QAExample, max_memories: int) -> tuple[list[str], list[int]]:
    """The story's last ``max_memories`` sentences and the supporting facts
    among them (re-indexed)."""
    offset = max(0, len(example.story) - max_memories)
    supporting = [i - offset for i in example.supporting if i >= offset]
    return list(example.story[offset:]), supporting


def _word_ids(tokenizer, texts: list[str], limit: int):
    """Ragged ``[len(texts), None]`` ids of distinct texts, each cut at ``limit``."""
    import tensorflow as tf

    parts = [
        tokenizer.tokenize(tf.constant(texts[i : i + 4096]))[:, :limit]
        for i in range(0, len(texts), 4096)
    ]
    if not parts:
        return tf.ragged.constant([], dtype=tf.int32, ragged_rank=1)
    return tf.concat(parts, 0)


def encode(examples: Sequence[QAExample], preprocessors: Preprocessors, config):
    """``(story [N, M, W] ragged, question [N, W] ragged, supporting [N, M]
    ragged 0/1, answer [N] int32, sentences [N])`` of ``examples``.

    Every distinct sentence is tokenized once (a bAbI corpus repeats a few
    hundred sentences): the stories gather their rows.
    """
    import tensorflow as tf

    limit = config.tokenizer.max_words
    index: dict[str, int] = {}
    story_rows, lengths, questions, supporting = [], [], [], []
    for example in examples:
        story, facts = kept_story(example, config.model.max_memories)
        story_rows += [index.setdefault(s, len(index)) for s in story]
        lengths.append(len(story))
        questions.append(index.setdefault(example.question, len(index)))
        flags = np.zeros(len(story), np.int32)  # bool cannot be padded by 0
        flags[facts] = True
        supporting.append(flags)
    ids = _word_ids(preprocessors.tokenizer, list(index), limit)
    rows = tf.constant(story_rows, tf.int64)
    story = tf.RaggedTensor.from_row_lengths(
        tf.gather(ids, rows), tf.constant(lengths, tf.int64)
    )
    question = tf.gather(ids, tf.constant(questions, tf.int64))
    flat = np.concatenate(supporting) if supporting else np.zeros(0, np.int32)
    supporting = tf.RaggedTensor.from_row_lengths(flat, tf.constant(lengths, tf.int64))
    by_answer = dict(zip(preprocessors.answers, preprocessors.answer_ids, strict=True))
    unknown = sorted({e.answer for e in examples} - set(by_answer))
    if unknown:
        raise PipelineError(
            f"data: answers {unknown[:5]} are not among the {len(by_answer)} the "
            "model can give (learned from the train and valid splits)."
        )
    answer = tf.constant([by_answer[e.answer] for e in examples], tf.int32)
    return story, question, supporting, answer, np.asarray(lengths)


def make_generative_dataset(examples, preprocessors, config, training, replicas=1):
    """Teacher-forcing batches ``({"source", "target_in"}, target_out)`` of
    the encoder-decoder: ``source`` is the kept sentences' words then the
    question's (``[B, L]``, bucketed by ``L``), the targets the answer's
    words with ``[START]`` in front and ``[END]`` after."""
    import tensorflow as tf

    from pipelines.core.datasets import example_order, length_batches
    from pipelines.core.text import END, PAD, RESERVED, START

    story, question, _, _, _ = encode(examples, preprocessors, config)
    source = tf.concat([story.merge_dims(1, 2), question], axis=1)
    index = {w: len(RESERVED) + k for k, w in enumerate(preprocessors.answer_words)}
    limit = config.model.max_answer_words
    target = tf.ragged.constant(
        [[index[w] for w in e.answer.split(",")[:limit]] for e in examples],
        dtype=tf.int32,
        ragged_rank=1,
    )
    lengths = source.row_lengths().numpy()
    order = example_order(len(examples), config, training)

    def add_markers(i):
        t = target[i]
        return source[i], tf.concat([[START], t], 0), tf.concat([t, [END]], 0)

    data = order.map(add_markers, num_parallel_calls=tf.data.AUTOTUNE)
    longest, steps = max_source_words(config), limit + 1
    data = length_batches(
        data,
        np.maximum(lengths, 1),
        longest,
        config,
        replicas,
        lambda bound: (tf.stack([bound]), [steps], [steps]),
        minimum=16,
        padding_value=PAD,
    )

    def as_features(source, target_in, target_out):
        return {"source": source, "target_in": target_in}, target_out

    return data.map(as_features).prefetch(tf.data.AUTOTUNE)


def make_dataset(examples, preprocessors, config, training: bool, replicas: int = 1):
    """Batches ``({"story", "question"}, answer)``.

    ``story`` is ``[B, M, W]`` word ids (id 0 pads words and sentences),
    ``question`` ``[B, W]``; with ``model.supervision_weight > 0`` the
    features add ``supporting`` ``[B, M]`` (True on the supporting facts) and
    the target is ``{"answer": answer}``. Batches are
    bucketed by the number of sentences and static-shaped with
    ``train.jit_compile``.
    """
    import tensorflow as tf

    from pipelines.core.datasets import example_order, length_batches

    if not examples:
        raise PipelineError("data: no questions to batch.")
    if config.model.architecture == "encoder_decoder":
        return make_generative_dataset(
            examples, preprocessors, config, training, replicas
        )
    story, question, supporting, answer, lengths = encode(
        examples, preprocessors, config
    )
    order = example_order(len(examples), config, training)
    data = order.map(
        lambda i: (story[i], question[i], supporting[i], answer[i]),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    words, memories = config.tokenizer.max_words, config.model.max_memories

    def static_shapes(bound):
        return (tf.stack([bound, words]), [words], tf.stack([bound]), [])

    data = length_batches(
        data,
        np.maximum(lengths, 1),
        memories,
        config,
        replicas,
        static_shapes,
        minimum=2,
    )
    supervised = config.model.supervision_weight > 0

    def as_features(story, question, supporting, answer):
        features = {"story": story, "question": question}
        if supervised:
            features["supporting"] = tf.cast(supporting, tf.bool)
            return features, {"answer": answer}
        return features, answer

    return data.map(as_features).prefetch(tf.data.AUTOTUNE)


def samples_for(config) -> list[str]:
    """Inputs for ``demo`` and the contract: a story and a question each, from
    the configured data (a yes/no question among them where the tasks ask one)."""
    kind, _, path = config.data.source.partition(":")
    if kind == "babi":
        from pipelines.qa.babi import parse_babi_spec

        tasks, _ = parse_babi_spec(config.data.source)
        return list(SAMPLES if 6 in tasks else SAMPLES[:2])  # [2]: yes/no
    if kind == "babi-text":
        from pipelines.qa.babi_text import load_babi_files

        first = load_babi_files(path)[2][:3]  # the first test questions
    else:
        from pipelines.qa.babi import read_qa_jsonl

        first = read_qa_jsonl(path)[:3]
    examples = [e for e in first if e.question.endswith("?")]
    texts = ["\n".join((*e.story, e.question)) for e in examples]
    return texts or list(SAMPLES)
