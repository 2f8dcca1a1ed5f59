"""The extractive task's data: passages, questions, answer spans, and batches.

Examples are `pipelines.extractive.countries.SpanExample` (a passage, a question,
the gold answers and the first one's character start). `encode` turns
passages and questions into what the model reads, with the same graph code
the export runs (`pipelines.extractive.tokenizer.SpanTokenizer`), and finds
the answer's first and last token: the tokens that overlap the gold
answer's characters.

Example:

>>> from pipelines.extractive.countries import SpanExample
>>> from pipelines.extractive.data import token_span
>>> example = SpanExample("Its capital is Paris.", "Capital?", ("Paris",), 15)
>>> token_span(example, begins=[0, 4, 12, 15, 20], ends=[3, 11, 14, 20, 21])
(3, 3)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from pipelines.core.errors import PipelineError
from pipelines.core.task import Data


class Preprocessors(NamedTuple):
    tokenizer: object  # pipelines.extractive.tokenizer.SpanTokenizer


def load_data(config) -> Data:
    """The configured examples split into train / valid / test, with notes."""
    from pipelines.core.errors import ConfigError
    from pipelines.extractive import countries

    d = config.data
    kind, _, argument = d.source.partition(":")
    if kind == "countries" and not argument:
        train, valid, test, counts = countries.load_countries(
            passages_per_country=d.passages_per_country,
            valid_fraction=d.valid_fraction,
            test_fraction=d.test_fraction,
            seed=d.seed,
        )
        notes = describe_countries(counts)
    elif kind == "jsonl" and argument:
        from pipelines.data import read_examples, split_by_key

        examples = read_examples(countries.read_span_jsonl, argument)
        notes = [f"read {len(examples)} questions from {argument}"]
        # Split by passage: no passage is read in two splits.
        train, valid, test = split_by_key(examples, [e.context for e in examples], d)
    else:
        raise ConfigError(
            "config: `data.source` must be countries or jsonl:PATH, received "
            f"{d.source!r}."
        )
    if d.limit:
        train, valid, test = train[: d.limit], valid[: d.limit], test[: d.limit]
        notes.append(f"kept the first {d.limit} questions of each split (data.limit)")
    return Data(train, valid, test, notes)


def describe_countries(counts: dict) -> list[str]:
    """`pipelines.extractive.countries.load_countries`'s counts as summary lines."""
    from pipelines.extractive.countries import FIELDS

    missing = ", ".join(
        f"{field} {counts[f'skipped_{field}']}"
        for field in FIELDS
        if counts.get(f"skipped_{field}")
    )
    lines = [
        f"read {counts['records']} countryinfo records: {counts['countries']} "
        f"countries used; dropped {counts['skipped_duplicate']} duplicates and "
        f"{counts['skipped_few_facts']} with too few facts; "
        f"{counts['unresolved_border_codes']} border codes name no record",
        f"facts dropped as missing or unusable: {missing or 'none'}",
    ]
    for split in ("train", "valid", "test"):
        lines.append(
            f"{split}: {counts[f'{split}_countries']} countries, "
            f"{counts[f'{split}_passages']} passages, "
            f"{counts[f'{split}_examples']} questions"
        )
    lines[-1] += (
        f" ({counts['test_held_out_examples']} in phrasings held out of training)"
    )
    return lines


def token_span(example, begins: Sequence[int], ends: Sequence[int]) -> tuple[int, int]:
    """The first and last token (inclusive) overlapping the first gold
    answer, from the tokens' byte offsets in the context; ``(-1, -1)`` when
    the read tokens do not hold all of it (the answer lies past, or across,
    the cut of a long passage)."""
    head = example.context[: example.answer_start].encode("utf-8")
    first_byte = len(head)
    last_byte = first_byte + len(example.answers[0].encode("utf-8"))
    begins, ends = np.asarray(begins), np.asarray(ends)
    inside = (ends > first_byte) & (begins < last_byte)
    if not inside.any():
        return -1, -1
    where = np.flatnonzero(inside)
    if ends[where[-1]] < last_byte:  # its end was cut off
        return -1, -1
    return int(where[0]), int(where[-1])


def encode(examples: Sequence, preprocessors: Preprocessors, config) -> dict:
    """The model's inputs and the answer spans of ``examples``.

    Returns a dict of ragged ``context``, ``match`` (1.0 where the passage
    word occurs in the question) and ``question``, and numpy ``start`` and
    ``end`` (``-1`` where the answer is not among the read tokens).
    """
    import tensorflow as tf

    tokenizer, t = preprocessors.tokenizer, config.tokenizer
    parts = []
    for i in range(0, len(examples), 2048):
        chunk = examples[i : i + 2048]
        parts.append(
            tokenizer.encode(
                tf.constant([e.context for e in chunk]),
                tf.constant([e.question for e in chunk]),
                t.max_context_tokens,
                t.max_question_tokens,
            )
        )
    if not parts:
        raise PipelineError("data: no questions to encode.")
    encoded = {key: tf.concat([p[key] for p in parts], 0) for key in parts[0]}
    begins, ends = encoded.pop("begins").to_list(), encoded.pop("ends").to_list()
    spans = np.array(
        [token_span(e, b, n) for e, b, n in zip(examples, begins, ends, strict=True)],
        dtype=np.int32,
    ).reshape(-1, 2)
    encoded["start"], encoded["end"] = spans[:, 0], spans[:, 1]
    return encoded


def make_dataset(examples, preprocessors, config, training: bool, replicas: int = 1):
    """Batches ``({"context", "match", "question"}, {"start", "end"})``.

    ``context`` ``[B, T]`` and ``question`` ``[B, J]`` are word ids (0 pads),
    ``match`` ``[B, T]`` float32, ``start`` and ``end`` ``[B]`` token
    indices. Questions whose answer lies past ``tokenizer.max_context_tokens``
    are left out. Batches are bucketed by passage length, static-shaped with
    ``train.jit_compile``.
    """
    import tensorflow as tf

    from pipelines.core.datasets import example_order, length_batches

    if not examples:
        raise PipelineError("data: no questions to batch.")
    encoded = encode(list(examples), preprocessors, config)
    keep = np.flatnonzero(encoded["start"] >= 0)
    if not keep.size:
        raise PipelineError(
            f"data: none of the {len(examples)} answers lies within the first "
            f"{config.tokenizer.max_context_tokens} tokens of its passage "
            "(tokenizer.max_context_tokens)."
        )
    rows = tf.constant(keep, tf.int64)
    context, match, question = (
        tf.gather(encoded[key], rows) for key in ("context", "match", "question")
    )
    start = tf.constant(encoded["start"][keep])
    end = tf.constant(encoded["end"][keep])
    lengths = context.row_lengths().numpy()
    order = example_order(len(keep), config, training)
    data = order.map(
        lambda i: (context[i], match[i], question[i], start[i], end[i]),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    t = config.tokenizer

    def static_shapes(bound):
        return (tf.stack([bound]), tf.stack([bound]), [t.max_question_tokens], [], [])

    data = length_batches(
        data,
        np.maximum(lengths, 1),
        t.max_context_tokens,
        config,
        replicas,
        static_shapes,
        minimum=16,
    )

    def as_features(context, match, question, start, end):
        features = {"context": context, "match": match, "question": question}
        return features, {"start": start, "end": end}

    return data.map(as_features).prefetch(tf.data.AUTOTUNE)


def samples_for(config) -> list[str]:
    """Inputs for ``demo`` and the contract: three questions on other facts,
    passage then question, from the test split (else the validation or the
    training split)."""
    data = load_data(config)
    for split in ("test", "valid", "train"):
        chosen, fields = [], set()
        for example in data.split(split):  # the first three facts asked
            if example.field not in fields and example.question.endswith("?"):
                fields.add(example.field)
                chosen.append(f"{example.context}\n{example.question}")
            if len(chosen) == 3:
                break
        if chosen:
            return chosen
    raise PipelineError(
        f"data: no question of {config.data.source} ends in '?' "
        f"({len(data.train)} train / {len(data.valid)} valid / "
        f"{len(data.test)} test questions); demo and export send three as "
        "samples."
    )
