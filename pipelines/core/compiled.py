"""XLA-compiled decoding for an export: requests padded to a few shapes.

A step-by-step decoder served from a SavedModel spends most of a small
request in per-op overhead: each loop step runs dozens of small kernels.
Compiled with XLA (``export.jit_compile=true``) the loop fuses, and greedy
search at batch 1 runs several times faster (docs/benchmarks.md).

XLA compiles once per input shape, seconds each. So a request is padded
before the compiled function sees it: its rows to the next power of two
(`bucket`) by repeating its first row, which ends when that row ends and
adds no loop steps, and a token axis to the next power of two (at least
``smallest``, at most its cap) with padding ids, which the model masks. The
outputs are cut back to the request's rows and columns. A server thus
compiles a handful of shapes, once each, and TF Serving's warmup requests
compile the first ones at load.

TF Serving runs XLA only with ``--xla_cpu_compilation_enabled=true``; without
it (by the flag's description, not tried here) the warmup requests of such
an export fail and the model is not loaded.
TensorFlow's own loaders (Python, C, ``saved_model_cli``) need nothing.

Example:

>>> import tensorflow as tf
>>> [int(bucket(tf.constant(n))) for n in (0, 1, 3, 64, 65)]
[1, 1, 4, 64, 128]
>>> int(bucket(tf.constant(3), smallest=8, cap=40)), int(bucket(tf.constant(33), 8, 40))
(8, 40)
>>> pad_rows(tf.constant([[5, 6]]), tf.constant(3)).numpy().tolist()
[[5, 6], [5, 6], [5, 6]]
>>> pad_columns(tf.constant([[5, 6]]), tf.constant(4), 0).numpy().tolist()
[[5, 6, 0, 0]]
>>> out = call_bucketed(lambda x: {"x": x}, tf.ones([3, 5]), max_columns=40)
>>> out["x"].shape  # ran as [4, 8]; the rows are cut back, the columns not
TensorShape([3, 8])
"""

from __future__ import annotations

import tensorflow as tf


def bucket(n, smallest: int = 1, cap: int | None = None) -> tf.Tensor:
    """The next power of two ``>= n`` as an int32 scalar, at least ``smallest``
    and at most ``cap`` (when ``n <= cap``; a larger ``n`` is its own bucket)."""
    n = tf.maximum(tf.cast(n, tf.int32), smallest)
    powers = tf.bitwise.left_shift(1, tf.range(31))
    power = tf.reduce_min(tf.boolean_mask(powers, powers >= n))
    if cap is not None:
        power = tf.where(n <= cap, tf.minimum(power, cap), n)
    return power


def pad_rows(x: tf.Tensor, rows) -> tf.Tensor:
    """``x`` with its first row repeated up to ``rows`` rows (zeros if it has
    none): a copy of a real request decodes like it and ends with it."""
    have = tf.shape(x)[0]
    filler = tf.cond(have > 0, lambda: x[:1], lambda: tf.zeros_like(x[:1]))
    return tf.concat([x, tf.repeat(filler, tf.maximum(rows - have, 0), axis=0)], 0)


def pad_columns(x: tf.Tensor, columns, value) -> tf.Tensor:
    """``x`` ``[B, S, ...]`` padded with ``value`` to ``columns`` along axis 1."""
    extra = tf.maximum(columns - tf.shape(x)[1], 0)
    paddings = tf.concat(
        [[[0, 0], [0, extra]], tf.zeros([tf.rank(x) - 2, 2], tf.int32)], 0
    )
    return tf.pad(x, paddings, constant_values=tf.cast(value, x.dtype))


def xla(fn):
    """``fn`` as a ``tf.function`` that XLA compiles (once per input shape)."""
    return tf.function(fn, jit_compile=True)


def call_bucketed(compiled, x, *args, max_columns=None, pad_value=0) -> dict:
    """``compiled(x_padded, *args)`` with its outputs cut back to ``x``'s rows.

    ``x``'s rows are padded to their `bucket` (`pad_rows`); with
    ``max_columns``, its axis 1 too, to a bucket of at least 8, at most
    ``max_columns``, with ``pad_value`` (an output with that axis is the
    caller's to cut back).
    """
    rows = tf.shape(x)[0]
    x = pad_rows(x, bucket(rows))
    if max_columns is not None:
        x = pad_columns(x, bucket(tf.shape(x)[1], 8, max_columns), pad_value)
    return {key: value[:rows] for key, value in compiled(x, *args).items()}
