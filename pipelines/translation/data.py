"""The translation task's data: a corpus, filtered and split, with what was dropped.

Example:

>>> from pipelines.translation.config import preset
>>> data = load_data(preset("tiny"))
>>> len(data.train) > len(data.test) > 0, data.notes[0]
(True, 'read 600 pairs from dates:600')
"""

from __future__ import annotations

from pipelines.core.errors import PipelineError
from pipelines.core.task import Data
from pipelines.data import split_pairs
from pipelines.translation.corpus import load_corpus


def corpus_files(spec: str) -> str:
    """What a corpus spec reads, for messages: its file(s), or its name."""
    name, _, argument = spec.partition(":")
    if name in ("tsv", "parallel") and argument:
        return argument.replace(",", " and ")
    return spec


def load_data(config) -> Data:
    """Pairs of ``config.data.source``: limited, length-filtered, split.

    Raises `PipelineError` when the corpus holds no pairs, or none survive
    the length filter.
    """
    data = config.data
    pairs = load_corpus(data.source)
    if not pairs:
        raise PipelineError(f"data: no examples in {corpus_files(data.source)}.")
    notes = [f"read {len(pairs)} pairs from {data.source}"]
    if data.limit and len(pairs) > data.limit:
        notes.append(f"kept the first {data.limit} (data.limit)")
        pairs = pairs[: data.limit]
    empty = [p for p in pairs if not p[0].split() or not p[1].split()]
    pairs = [p for p in pairs if p[0].split() and p[1].split()]
    kept = [
        p
        for p in pairs
        if len(p[0].split()) <= data.max_source_words
        and len(p[1].split()) <= data.max_target_words
    ]
    if empty:
        notes.append(f"dropped {len(empty)} pairs with an empty side")
    if len(kept) < len(pairs):
        notes.append(
            f"dropped {len(pairs) - len(kept)} pairs over {data.max_source_words} "
            f"source / {data.max_target_words} target words "
            "(data.max_source_words, data.max_target_words)"
        )
    if not kept:
        raise PipelineError(
            f"data: no pairs of {corpus_files(data.source)} are left after the "
            f"filters ({'; '.join(notes[1:])})."
        )
    splits = split_pairs(
        kept,
        data.valid_fraction,
        data.test_fraction,
        seed=data.seed,
        key=data.split_key,
    )
    return Data(splits.train, splits.valid, splits.test, notes)


def _ragged_ids(tokenizer, texts: list[str], limit: int):
    import tensorflow as tf

    ids = [
        tokenizer.tokenize(tf.constant(texts[start : start + 4096]))
        for start in range(0, len(texts), 4096)
    ]
    if not ids:
        return tf.ragged.constant([], dtype=tf.int32, ragged_rank=1)
    return tf.concat(ids, 0)[:, :limit]


def make_dataset(pairs, tokenizers, config, training: bool, replicas: int = 1):
    """Teacher-forcing batches ``({"source", "target_in"}, target_out)``.

    Pairs are bucketed by source length so that a batch holds sentences of
    similar length (little padding); the target gets ``[START]`` in front of
    the decoder input and ``[END]`` after the expected output. Under a
    strategy with ``replicas`` replicas every batch is cut to a multiple of
    ``replicas`` rows (`pipelines.core.datasets.teacher_forcing_batches`). With
    ``train.jit_compile`` the batches take static shapes: sources padded to
    their bucket's bound, targets to ``max_target_tokens + 1``. Training
    batches on one device all have ``train.batch_size`` rows (a bucket's
    last batch is filled with rows of padding, which the token-mean loss
    ignores), so the train step is traced for one batch size.
    """
    import tensorflow as tf

    from pipelines.core.datasets import example_order, teacher_forcing_batches
    from pipelines.core.text import END, START

    tok = config.tokenizer
    source = _ragged_ids(
        tokenizers.source, [s for s, _ in pairs], tok.max_source_tokens
    )
    target = _ragged_ids(
        tokenizers.target, [t for _, t in pairs], tok.max_target_tokens
    )
    lengths = source.row_lengths().numpy()
    order = example_order(len(pairs), config, training)

    def add_markers(i):
        s, t = source[i], target[i]
        return s, tf.concat([[START], t], 0), tf.concat([t, [END]], 0)

    data = order.map(add_markers, num_parallel_calls=tf.data.AUTOTUNE)
    return teacher_forcing_batches(
        data, lengths, config, replicas, full_batches=training and replicas == 1
    )
