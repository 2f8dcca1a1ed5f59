"""Luong global attention: the dot, general, concat and location score functions."""

import keras
from keras import ops

from attention_layers.additive import additive_scores
from attention_layers.base import (
    ScoreAttention,
    apply_dense,
    check_positive_int,
    linear,
)

SCORE_MODES = ("dot", "general", "concat", "location")


@keras.saving.register_keras_serializable(package="attention_layers")
class LuongAttention(ScoreAttention):
    """Global attention of Luong et al. (2015) with its four score functions.

    With ``h_t`` the decoder state (query) and ``h_s`` the encoder states (keys):

    * ``"dot"``:      ``score = h_t^T h_s`` (needs equal query and key sizes);
    * ``"general"``:  ``score = h_t^T W_a h_s``;
    * ``"concat"``:   ``score = v_a^T tanh(W_a [h_t; h_s])``;
    * ``"location"``: ``a_t = softmax(W_a h_t)``, one weight per source position,
      so it needs ``max_value_length`` and ignores the keys.

    ``a_t = softmax(score)`` over the source positions and the context is
    ``c_t = sum_s a_t(s) h_s`` (values default to the keys).

    Args:
        score_mode: one of ``"dot"``, ``"general"``, ``"concat"``, ``"location"``.
        units: hidden size of the ``"concat"`` score (default: the query size).
        max_value_length: number of source positions of the ``"location"`` score.
        scale: multiply the scores by a learned scalar ``g`` (initialised to 1).
        kernel_initializer: initializer of ``W_a`` and ``v_a``.
        dropout: fraction of attention weights dropped in training.
        seed: dropout seed.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments and returns: those of `ScoreAttention`.

    Example:

    >>> import numpy as np
    >>> layer = LuongAttention(score_mode="general")
    >>> query = np.random.rand(2, 4).astype("float32")      # one decoder step
    >>> value = np.random.rand(2, 5, 6).astype("float32")
    >>> context, weights = layer(query, value, return_attention_scores=True)
    >>> tuple(context.shape), tuple(weights.shape)
    ((2, 6), (2, 5))

    References:
        Luong, Pham, Manning. Effective Approaches to Attention-based Neural
        Machine Translation. EMNLP 2015. https://arxiv.org/abs/1508.04025
    """

    def __init__(
        self,
        score_mode="general",
        units=None,
        max_value_length=None,
        scale=False,
        kernel_initializer="glorot_uniform",
        dropout=0.0,
        seed=None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        if score_mode not in SCORE_MODES:
            raise self._error("score_mode", f"one of {SCORE_MODES}", repr(score_mode))
        if score_mode == "location":
            check_positive_int(
                self,
                "max_value_length",
                max_value_length,
                meaning='with score_mode="location"',
            )
        self.score_mode = score_mode
        self.units = check_positive_int(self, "units", units, allow_none=True)
        self.max_value_length = max_value_length
        self.scale = scale
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def check_score_shapes(self, query_shape, key_shape):
        if self.score_mode == "dot":
            self.check_equal_dims(query_shape, key_shape, ' for score_mode="dot"')
        tv = key_shape[1]
        if (
            self.score_mode == "location"
            and tv is not None
            and tv > self.max_value_length
        ):
            raise self._error(
                "value",
                f"at most max_value_length={self.max_value_length} positions",
                f"shape {tuple(key_shape)}",
            )

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=False,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build_score(self, query_shape, key_shape):
        dq, dk = query_shape[-1], key_shape[-1]
        if self.score_mode == "general":
            self.W_a = self._dense(dq, "W_a")
            self.W_a.build(key_shape)
        elif self.score_mode == "concat":
            units = self.units or dq
            # One W_a over [h_t; h_s], as in the paper; it is applied in two
            # halves so that the concatenation is never materialised per pair.
            self.W_a = self.add_weight(
                name="W_a", shape=(dq + dk, units), initializer=self.kernel_initializer
            )
            self.v_a = self.add_weight(
                name="v_a", shape=(units,), initializer=self.kernel_initializer
            )
        elif self.score_mode == "location":
            self.W_a = self._dense(self.max_value_length, "W_a")
            self.W_a.build(query_shape)
        if self.scale:
            self.g = self.add_weight(name="g", shape=(), initializer="ones")

    def score(self, query, key):
        dtype = self._score_dtype()
        if self.score_mode == "dot":
            scores = ops.matmul(
                ops.cast(query, dtype), ops.transpose(ops.cast(key, dtype), (0, 2, 1))
            )
        elif self.score_mode == "general":
            scores = ops.matmul(
                ops.cast(query, dtype),
                ops.transpose(ops.cast(apply_dense(self.W_a, key), dtype), (0, 2, 1)),
            )
        elif self.score_mode == "concat":
            dq = query.shape[-1]
            w = ops.cast(self.W_a, self.compute_dtype)
            scores = additive_scores(
                linear(query, w[:dq]), linear(key, w[dq:]), self.v_a
            )
        else:  # location
            scores = apply_dense(self.W_a, query)[..., : ops.shape(key)[1]]
        scores = ops.cast(scores, "float32")
        if self.scale:
            scores = scores * ops.cast(self.g, "float32")
        return scores

    def get_config(self):
        return {
            **super().get_config(),
            "score_mode": self.score_mode,
            "units": self.units,
            "max_value_length": self.max_value_length,
            "scale": self.scale,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }
