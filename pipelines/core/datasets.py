"""Batches for training: length bucketing, an even split over replicas, a known size.

`bucket_batches` groups examples of similar length (little padding), cuts
every batch to a multiple of the replica count under a strategy, and states
the number of batches up front (`tf.data.experimental.assert_cardinality`),
so Keras shows a real progress bar and never warns that the input "ran out
of data". With ``static=True`` each bucket pads to one fixed shape, so an
XLA-compiled train step compiles once per bucket instead of once per length.
With ``full_batches=True`` a bucket's last, smaller batch is filled up with
rows of padding, so every batch has ``batch_size`` rows and the train step
is traced for that batch size, not an unknown one.

Example:

>>> import tensorflow as tf
>>> rows = [[1] * n for n in (1, 2, 2, 3, 5, 6, 7, 9)]
>>> data = tf.data.Dataset.from_tensor_slices(tf.ragged.constant(rows))
>>> batches = bucket_batches(
...     data, [len(r) for r in rows], boundaries=[4, 8], batch_size=2, max_length=10)
>>> int(batches.cardinality()), [tuple(b.shape) for b in batches]
(5, [(2, 2), (2, 3), (2, 6), (1, 7), (1, 9)])
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import tensorflow as tf

_EPOCH: tf.Variable | None = None


def _epoch() -> tf.Variable:
    global _EPOCH
    if _EPOCH is None:
        with tf.init_scope():
            _EPOCH = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
    return _EPOCH


def set_epoch(epoch: int) -> None:
    """The epoch that `training_order` shuffles for (the trainer sets it)."""
    _epoch().assign(epoch)


def training_order(size: int, seed: int) -> tf.data.Dataset:
    """The indices ``0 .. size-1`` in the order of the current epoch.

    The permutation is a function of ``seed`` and the epoch alone (stateless),
    read when a pass over the data starts. So a resumed run sees exactly the
    batches an uninterrupted one would, and a strategy that reads an extra
    batch ahead (Keras does, to build a distributed model) changes nothing.
    With ``train.steps_per_epoch`` a pass takes the order of the epoch in
    which it starts.
    """
    seed = tf.constant(seed, tf.int64)

    def one_pass(_):
        epoch = _epoch().read_value()
        order = tf.random.experimental.stateless_shuffle(
            tf.range(size, dtype=tf.int64), seed=tf.stack([seed, epoch])
        )
        return tf.data.Dataset.from_tensor_slices(order)

    return tf.data.Dataset.range(1).flat_map(one_pass)


def example_order(size: int, config, training: bool) -> tf.data.Dataset:
    """The indices of ``size`` examples to read: `training_order` with
    ``train.seed`` when ``training``, else ``0 .. size-1``."""
    if training:
        return training_order(size, config.train.seed)
    return tf.data.Dataset.range(size)


def bucket_boundaries(max_length: int, buckets: int = 8, minimum: int = 4) -> list[int]:
    """About ``buckets`` evenly spaced boundaries up to ``max_length``."""
    step = max(minimum, max_length // buckets)
    return list(range(step, max_length + 1, step))


def count_batches(
    lengths: Sequence[int], boundaries: Sequence[int], batch_size: int, replicas: int
) -> int:
    """Batches `bucket_batches` yields: per bucket, full batches plus a remainder
    that holds at least one row per replica (the order of examples does not
    change the count)."""
    counts = [0] * (len(boundaries) + 1)
    for length in lengths:
        counts[bisect.bisect_right(boundaries, length)] += 1
    total = 0
    for n in counts:
        rest = n % batch_size
        total += n // batch_size + (1 if rest >= replicas else 0)
    return total


def bucket_batches(
    data: tf.data.Dataset,
    lengths: Sequence[int],
    boundaries: Sequence[int],
    batch_size: int,
    max_length: int,
    replicas: int = 1,
    padding_value: int = 0,
    static: bool = False,
    static_shapes: Callable | None = None,
    full_batches: bool = False,
) -> tf.data.Dataset:
    """Batch ``data`` by the ``lengths`` of its examples (one length per element).

    Each element is a tensor or a tuple of tensors whose first dimension is
    the sequence (the first component's length is ``lengths[i]``, at most
    ``max_length``). Batches take examples of one bucket; a bucket is the
    interval between two ``boundaries`` (lower bound included).

    Args:
        data: the examples, in the order of ``lengths``.
        lengths: the bucketing length of every example.
        boundaries: increasing bucket boundaries.
        batch_size: rows per batch (global, across replicas).
        max_length: the longest ``lengths`` may be (the last bucket's bound).
        replicas: cut every batch to a multiple of this many rows, dropping
            batches with fewer; Keras 3.15 fails on uneven splits (an empty
            replica breaks the gradient all-reduce).
        padding_value: the pad of every component.
        static: pad to the bucket's bound, not to the batch's longest example.
        static_shapes: with ``static``, ``bound -> padded_shapes`` for the
            element (default: every component ``[bound]``).
        full_batches: fill each bucket's last batch up to ``batch_size`` rows
            with rows of ``padding_value``; the batches' first dimension is
            then static. Only for a loss that ignores padding targets and
            averages over tokens (a row of padding adds nothing to it); a
            mean over sequences would count the empty rows. One device only
            (``replicas=1``): under a strategy a replica could get nothing
            but padding.

    Returns:
        A dataset of padded batches whose cardinality is known.
    """
    if full_batches and replicas > 1:
        raise ValueError(
            "bucket_batches: full_batches fills batches with padding rows on one "
            f"device only; received replicas={replicas}"
        )
    if any(
        isinstance(spec, tf.RaggedTensorSpec)
        for spec in tf.nest.flatten(data.element_spec)
    ):
        data = data.map(_dense)
    bounds = [b - 1 for b in boundaries] + [max_length]
    bounds = [max(1, min(b, max_length)) for b in bounds]
    key_bounds = tf.constant(boundaries, tf.int64)

    def key(*element):
        first = element[0]
        length = tf.cast(tf.shape(first)[0], tf.int64)
        return tf.reduce_sum(tf.cast(key_bounds <= length, tf.int64))

    padding = tf.nest.map_structure(
        lambda spec: tf.constant(padding_value, spec.dtype), data.element_spec
    )

    def reduce(bucket, window):
        if not static:
            return window.padded_batch(batch_size, padding_values=padding)
        bound = tf.gather(tf.constant(bounds, tf.int64), bucket)
        if static_shapes is not None:
            shapes = static_shapes(bound)
        else:
            shapes = tf.nest.map_structure(
                lambda spec: tf.stack([bound] + [-1] * (spec.shape.rank - 1)),
                data.element_spec,
            )
        return window.padded_batch(
            batch_size, padded_shapes=shapes, padding_values=padding
        )

    batches = data.group_by_window(key, reduce, window_size=batch_size)
    if replicas > 1:

        def even(*batch):
            batch = batch[0] if len(batch) == 1 else batch
            rows = tf.shape(tf.nest.flatten(batch)[0])[0] // replicas * replicas
            return tf.nest.map_structure(lambda x: x[:rows], batch)

        def not_empty(*batch):
            return tf.shape(tf.nest.flatten(batch)[0])[0] > 0

        batches = batches.map(even).filter(not_empty)
    if full_batches:

        def fill(*batch):
            batch = batch[0] if len(batch) == 1 else batch

            def pad(x):
                rows = batch_size - tf.shape(x)[0]
                pads = [[0, rows]] + [[0, 0]] * (x.shape.rank - 1)
                filled = tf.pad(x, pads, constant_values=padding_value)
                return tf.ensure_shape(filled, [batch_size, *x.shape[1:]])

            return tf.nest.map_structure(pad, batch)

        batches = batches.map(fill)
    total = count_batches(lengths, boundaries, batch_size, replicas)
    return batches.apply(tf.data.experimental.assert_cardinality(total))


def length_batches(
    data: tf.data.Dataset,
    lengths: Sequence[int],
    max_length: int,
    config,
    replicas: int,
    static_shapes: Callable,
    minimum: int = 4,
    **options,
) -> tf.data.Dataset:
    """`bucket_batches` of ``data`` by ``lengths`` up to ``max_length``
    (`bucket_boundaries` with ``minimum``) with the run's ``train.batch_size``;
    static-shaped by ``static_shapes`` under ``train.jit_compile``.
    ``options``: `bucket_batches`' ``padding_value`` and ``full_batches``."""
    return bucket_batches(
        data,
        lengths,
        bucket_boundaries(max_length, minimum=minimum),
        config.train.batch_size,
        max_length,
        replicas=replicas,
        static=config.train.jit_compile,
        static_shapes=static_shapes,
        **options,
    )


def teacher_forcing_batches(
    data: tf.data.Dataset,
    lengths: Sequence[int],
    config,
    replicas: int,
    sources: tuple[str, ...] = ("source",),
    **options,
) -> tf.data.Dataset:
    """Batches ``({*sources, "target_in"}, target_out)`` of ``data``'s
    elements ``(*sources, target_in, target_out)``, bucketed by the source
    ``lengths`` up to ``tokenizer.max_source_tokens`` (`length_batches`) and
    padded with ``PAD``. Under ``train.jit_compile`` every source takes its
    bucket's bound and the targets ``tokenizer.max_target_tokens + 1``."""
    from pipelines.core.text import PAD

    tok = config.tokenizer
    target_length = tok.max_target_tokens + 1

    def static_shapes(bound):
        return (*[tf.stack([bound])] * len(sources), [target_length], [target_length])

    data = length_batches(
        data, lengths, tok.max_source_tokens, config, replicas, static_shapes,
        padding_value=PAD, **options,
    )  # fmt: skip

    def as_features(*element):
        *source, target_in, target_out = element
        features = dict(zip(sources, source, strict=True))
        return {**features, "target_in": target_in}, target_out

    return data.map(as_features).prefetch(tf.data.AUTOTUNE)


def _dense(*element):
    """Rows of ragged tensors as dense tensors (``padded_batch`` needs them)."""
    element = element[0] if len(element) == 1 else element
    return tf.nest.map_structure(
        lambda t: t.to_tensor() if isinstance(t, tf.RaggedTensor) else t, element
    )


def shard_by_data(data: tf.data.Dataset) -> tf.data.Dataset:
    """Multi-worker sharding by element (the examples come from memory, not files)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    return data.with_options(options)
