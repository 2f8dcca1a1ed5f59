"""Scaled dot-product attention: ``softmax(q k^T / sqrt(d)) v``."""

import math

import keras
from keras import ops

from attention_layers.base import ScoreAttention


@keras.saving.register_keras_serializable(package="attention_layers")
class ScaledDotProductAttention(ScoreAttention):
    """Scaled dot-product attention of Vaswani et al. (2017), without weights.

    ``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``, with the masks, dtype
    safety and single-step queries of every layer in this library. The product
    is taken in float32 under ``mixed_float16`` so that large activations do not
    overflow before the softmax.

    Args:
        scale: multiplier of the scores; ``None`` means ``1 / sqrt(d_k)``.
        dropout: fraction of attention weights dropped in training.
        seed: dropout seed.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments and returns: those of `ScoreAttention`. ``query`` and ``key``
    need the same last dimension.

    Example:

    >>> import numpy as np
    >>> x = np.random.rand(2, 4, 8).astype("float32")
    >>> out = ScaledDotProductAttention()(x, x, use_causal_mask=True)
    >>> tuple(out.shape)
    (2, 4, 8)

    References:
        Vaswani et al. Attention Is All You Need. NeurIPS 2017.
        https://arxiv.org/abs/1706.03762
    """

    def __init__(self, scale=None, dropout=0.0, seed=None, **kwargs):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        if scale is not None and not float(scale) > 0:
            raise self._error("scale", "a positive float or None", repr(scale))
        self.scale = scale

    def check_score_shapes(self, query_shape, key_shape):
        self._check_equal_dims(query_shape, key_shape)

    def score(self, query, key):
        dtype = self._score_dtype()
        scale = (
            self.scale if self.scale is not None else 1.0 / math.sqrt(query.shape[-1])
        )
        scores = ops.matmul(
            ops.cast(query, dtype) * ops.cast(scale, dtype),
            ops.transpose(ops.cast(key, dtype), (0, 2, 1)),
        )
        return ops.cast(scores, "float32")

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}
