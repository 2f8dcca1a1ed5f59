"""The trainer's optimizers (``train.optimizer``), whose ``clipnorm`` bounds the
update that is applied, embedding tables included.

Keras 3 on TensorFlow clips each gradient with ``tf.clip_by_norm``. The
gradient of an embedding table is a ``tf.IndexedSlices``, one row per
looked-up id, and ``tf.clip_by_norm`` measures the norm of those rows as
listed: a word that occurs ``n`` times in the batch is ``n`` rows, which the
update then sums. So the table's update can exceed ``clipnorm`` by up to
``sqrt(n)`` (a word 50 times in a batch: 7 times the bound). Here such a
gradient is made dense before Keras clips it (the dense gradient sums the
rows of each id), so the bound holds. Keras' Adam makes it dense in its
update anyway; plain SGD then updates the whole table, rows of zeros
included, which costs a table-sized add per step.

Written here because neither Keras nor TensorFlow offers the choice: the
behaviour comes from ``tf.clip_by_norm``'s handling of ``IndexedSlices``.

Example: an id 50 times and another 10 times in one batch; the step of plain
SGD at rate 1 and ``clipnorm=1`` has norm 1 (Keras' own SGD: 6.6).

>>> import keras
>>> import tensorflow as tf
>>> table = keras.layers.Embedding(4, 2, embeddings_initializer="zeros")
>>> table.build((None,))
>>> ids = tf.constant([1] * 50 + [2] * 10)
>>> with tf.GradientTape() as tape:
...     loss = -tf.reduce_sum(table(ids))
>>> gradients = tape.gradient(loss, table.trainable_variables)
>>> type(gradients[0]).__name__
'IndexedSlices'
>>> optimizer = OPTIMIZERS["sgd"](1.0, clipnorm=1.0)
>>> _ = optimizer.apply_gradients(zip(gradients, table.trainable_variables))
>>> round(float(tf.norm(table.embeddings)), 4)
1.0
"""

from __future__ import annotations

import keras
import tensorflow as tf


class _DenseBeforeClipping:
    """Make ``IndexedSlices`` gradients dense before Keras clips them by norm."""

    def apply(self, grads, trainable_variables=None):
        if self.clipnorm or self.global_clipnorm:
            grads = [
                tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                for g in grads
            ]
        return super().apply(grads, trainable_variables)


@keras.saving.register_keras_serializable(package="pipelines")
class Adam(_DenseBeforeClipping, keras.optimizers.Adam):
    """``keras.optimizers.Adam`` whose ``clipnorm`` holds for embedding tables."""


@keras.saving.register_keras_serializable(package="pipelines")
class SGD(_DenseBeforeClipping, keras.optimizers.SGD):
    """``keras.optimizers.SGD`` whose ``clipnorm`` holds for embedding tables."""


OPTIMIZERS = {"adam": Adam, "sgd": SGD}
"""``train.optimizer`` -> the optimizer class."""
