"""Attention pooling: a learned context vector weighs the steps of a sequence."""

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import (
    check_float,
    check_mask_shape,
    check_positive_int,
    input_error,
    static_shape,
)


@keras.saving.register_keras_serializable(package="attention_layers")
class AttentionPooling(keras.layers.Layer):
    """Attention-weighted sum of a sequence into one vector (Yang et al. 2016).

    ``u_t = tanh(W h_t + b)``, ``a_t = softmax_t(u_t^T u_w)``, ``s = sum_t a_t h_t``,
    with a learned context vector ``u_w``: the model learns which steps carry
    the signal (in sentiment classification, the words that carry the
    sentiment) and the weights ``a_t`` show it.

    Unlike the score-based layers it has one sequence input, so it takes the
    standard ``mask`` argument that Keras fills from ``Embedding(mask_zero=True)``.

    Args:
        units: size of the hidden representation ``u_t`` (default: input size).
        kernel_initializer: initializer of ``W`` and ``u_w``.
        dropout: fraction of attention weights dropped in training.
        seed: dropout seed.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        inputs: ``[B, T, D]`` sequence.
        mask: ``[B, T]``, True where the step exists.
        return_attention_scores: also return the weights ``[B, T]``.
        training: whether dropout is active.

    Returns:
        ``[B, D]``, and with ``return_attention_scores=True`` the tuple
        ``(pooled, weights)``. A fully masked sequence pools to zeros.

    Example:

    >>> import numpy as np
    >>> pooled, weights = AttentionPooling(units=8)(
    ...     np.random.rand(2, 5, 4).astype("float32"), return_attention_scores=True)
    >>> tuple(pooled.shape), tuple(weights.shape)
    ((2, 4), (2, 5))

    References:
        Yang et al. Hierarchical Attention Networks for Document Classification.
        NAACL 2016. https://aclanthology.org/N16-1174
    """

    def __init__(
        self,
        units=None,
        kernel_initializer="glorot_uniform",
        dropout=0.0,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        units = check_positive_int(self, "units", units, allow_none=True)
        if not 0.0 <= float(dropout) < 1.0:
            raise input_error(self, "dropout", "a float in [0, 1)", repr(dropout))
        self.units = units
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.dropout = dropout
        self.seed = seed
        self.supports_masking = True

    def _check_shape(self, shape):
        if len(shape) != 3:
            raise input_error(
                self,
                "inputs",
                "a rank-3 tensor [batch, length, dim]",
                f"shape {tuple(shape)}",
            )

    def build(self, inputs_shape):
        self._check_shape(inputs_shape)
        units = self.units or inputs_shape[-1]
        self.dense = keras.layers.Dense(
            units,
            activation="tanh",
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="W",
        )
        self.dense.build(inputs_shape)
        self.context_vector = self.add_weight(
            name="u_w", shape=(units,), initializer=self.kernel_initializer
        )
        if self.dropout:
            self._dropout_layer = keras.layers.Dropout(
                self.dropout, seed=self.seed, dtype=self.dtype_policy
            )

    def call(self, inputs, mask=None, return_attention_scores=False, training=None):
        self._check_shape(inputs.shape)
        check_float(self, "inputs", inputs)
        check_mask_shape(self, "mask", mask, static_shape(inputs.shape)[:2])
        inputs = masking.zero_masked(inputs, mask)
        hidden = self.dense(inputs)  # tanh keeps it bounded: safe in float16
        scores = ops.matmul(hidden, ops.cast(self.context_vector, hidden.dtype))
        weights = masking.masked_softmax(scores, mask)
        weights = ops.cast(weights, self.compute_dtype)
        dropped = weights
        if self.dropout:
            dropped = self._dropout_layer(weights, training=training)
        pooled = ops.einsum("bt,btd->bd", dropped, inputs)
        if return_attention_scores:
            return pooled, weights
        return pooled

    def compute_mask(self, inputs, previous_mask=None):
        return None  # the time axis is pooled away

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "dropout": self.dropout,
            "seed": self.seed,
        }
