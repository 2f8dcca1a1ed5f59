"""Two repairs that let Keras 3 ``fit`` train under ``MultiWorkerMirroredStrategy``.

Keras 3.15's TensorFlow trainer fails under ``MultiWorkerMirroredStrategy``
(the collective strategy of several workers) before the first step
(keras-team/keras#20585, #20329; TensorFlow's own multi-worker Keras
tutorial fails the same way):

1. ``Model._maybe_symbolic_build`` builds the model from the first batch
   reduced with ``strategy.reduce("MEAN", batch)``, which the collective
   strategy cannot do for a nested batch (``Attempt to convert a value
   ... PerReplica ... to a Tensor``). The build only needs shapes and
   dtypes: `patch_multi_worker` gives it this worker's first replica's batch.
2. ``reduce_per_replica`` reduces the step's scalar logs with
   ``strategy.reduce("MEAN", v, axis=0)``, invalid for a scalar (``Invalid
   reduction dimension 0 for input with 0 dimensions``): scalars are
   reduced with ``axis=None`` instead.

Both are private Keras functions, so the repairs are applied only under that
strategy and only to the Keras versions they were checked on; elsewhere
nothing is touched.
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf

CHECKED = ("3.15",)  # Keras minor versions these repairs were verified on


def _first_replica(strategy, value):
    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def _patch_reduce() -> None:
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.reduce_per_replica
    if getattr(original, "_attention_pipelines", False):
        return

    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        multi = tf_trainer._collective_all_reduce_multi_worker(strategy)
        if not multi or reduction not in ("auto", "mean"):
            return original(values, strategy, reduction)

        def reduce(value):
            rank = _first_replica(strategy, value).shape.rank
            return strategy.reduce("MEAN", value, axis=None if rank == 0 else 0)

        return tree.map_structure(reduce, values)

    reduce_per_replica._attention_pipelines = True
    tf_trainer.reduce_per_replica = reduce_per_replica


def patch_multi_worker(model: keras.Model, strategy) -> bool:
    """Apply the repairs for ``model`` under ``strategy``; True if applied."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    if not keras.__version__.startswith(CHECKED):
        return False
    from keras.src import tree

    _patch_reduce()

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, it in iterator:
                batch = next(it)
                data_batch = tree.map_structure(
                    lambda v: _first_replica(strategy, v), batch
                )
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = maybe_symbolic_build
    return True
