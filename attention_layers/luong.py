"""Luong global attention, and the dot, general and concat scores it shares with
local attention (`attention_layers.local`)."""

import keras
from keras import ops

from attention_layers.additive import additive_scores
from attention_layers.base import (
    ScoreAttention,
    apply_dense,
    check_positive_int,
    fresh_initializer,
    linear,
    renamed_argument,
)

SCORE_MODES = ("dot", "general", "concat", "location")


def set_luong_score_arguments(
    layer, score_mode, score_modes, units, use_scale, kernel_initializer
):
    """Check the score arguments of a Luong layer (global or local) and keep
    them on ``layer``: ``score_mode`` (one of ``score_modes``), ``units``,
    ``use_scale`` and ``kernel_initializer``."""
    if score_mode not in score_modes:
        raise layer._error("score_mode", f"one of {score_modes}", repr(score_mode))
    layer.score_mode = score_mode
    layer.units = check_positive_int(layer, "units", units, allow_none=True)
    layer.use_scale = bool(use_scale)
    layer.kernel_initializer = keras.initializers.get(kernel_initializer)


def luong_score_config(layer):
    """The config entries of the arguments `set_luong_score_arguments` keeps."""
    return {
        "score_mode": layer.score_mode,
        "units": layer.units,
        "use_scale": layer.use_scale,
        "kernel_initializer": keras.initializers.serialize(layer.kernel_initializer),
    }


def build_luong_score(layer, query_shape, key_shape):
    """Create the weights of ``layer.score_mode`` (``"dot"``, ``"general"`` or
    ``"concat"``; none for others) and the scale ``g``, on ``layer``.

    ``"general"``: ``W_a``, a bias-free ``Dense`` with kernel ``[Dk, Dq]``;
    ``"concat"``: ``W_a`` ``[Dq + Dk, units]`` and ``v_a`` ``[units]``. Each
    weight gets its own initializer (`fresh_initializer`).
    """
    dq, dk = query_shape[-1], key_shape[-1]
    init = layer.kernel_initializer
    if layer.score_mode == "general":
        layer.W_a = keras.layers.Dense(
            dq,
            use_bias=False,
            kernel_initializer=fresh_initializer(init, 0),
            dtype=layer.dtype_policy,
            name="W_a",
        )
        layer.W_a.build(key_shape)
    elif layer.score_mode == "concat":
        # One W_a over [h_t; h_s], as in the paper; it is applied in two
        # halves so that the concatenation is never materialised per pair.
        units = layer.units or dq
        layer.W_a = layer.add_weight(
            name="W_a", shape=(dq + dk, units), initializer=fresh_initializer(init, 0)
        )
        layer.v_a = layer.add_weight(
            name="v_a", shape=(units,), initializer=fresh_initializer(init, 1)
        )
    if layer.use_scale:
        layer.g = layer.add_weight(name="g", shape=(), initializer="ones")


def luong_score(layer, query, key):
    """Float32 scores of ``query`` ``[B, Tq, Dq]`` against ``key``.

    ``key`` is ``[B, Tv, Dk]`` (every source position: scores ``[B, Tq, Tv]``)
    or ``[B, Tq, W, Dk]`` (a window per query: scores ``[B, Tq, W]``).

    * ``"dot"``: ``h_t^T h_s``;
    * ``"general"``: ``h_t^T W_a h_s``, computed as ``(W_a^T h_t)^T h_s`` so
      that ``W_a`` is applied once per query rather than once per key;
    * ``"concat"``: ``v_a^T tanh(W_a [h_t; h_s])``;

    times the learned ``g`` with ``use_scale``. Products are taken in
    ``layer._score_dtype()`` (float32 under float16).
    """
    windowed = len(key.shape) == 4
    if layer.score_mode == "concat":
        dq = query.shape[-1]
        w = ops.cast(layer.W_a, layer.compute_dtype)
        q, k = linear(query, w[:dq]), linear(key, w[dq:])
        if windowed:
            v = ops.cast(layer.v_a, layer.compute_dtype)
            scores = linear(ops.tanh(ops.expand_dims(q, 2) + k), v)
        else:
            scores = additive_scores(q, k, layer.v_a)
    else:
        dtype = layer._score_dtype()
        query = ops.cast(query, dtype)
        if layer.score_mode == "general":
            kernel = ops.cast(layer.W_a.kernel, dtype)  # [Dk, Dq]
            query = linear(query, ops.transpose(kernel))
        key = ops.cast(key, dtype)
        if windowed:
            scores = ops.einsum("bqd,bqwd->bqw", query, key)
        else:
            scores = ops.matmul(query, ops.transpose(key, (0, 2, 1)))
    scores = ops.cast(scores, "float32")
    if layer.use_scale:
        scores = scores * ops.cast(layer.g, "float32")
    return scores


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
        use_scale: multiply the scores by a learned scalar ``g`` (initialised
            to 1), as ``keras.layers.Attention(use_scale=True)``. ``scale`` is
            its deprecated former name.
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
        use_scale=False,
        kernel_initializer="glorot_uniform",
        dropout=0.0,
        seed=None,
        **kwargs,
    ):
        use_scale = renamed_argument(self, kwargs, "scale", "use_scale", use_scale)
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        set_luong_score_arguments(
            self, score_mode, SCORE_MODES, units, use_scale, kernel_initializer
        )
        if score_mode == "location":
            check_positive_int(
                self,
                "max_value_length",
                max_value_length,
                meaning='with score_mode="location"',
            )
        self.max_value_length = max_value_length

    def check_score_shapes(self, query_shape, key_shape):
        if self.score_mode == "dot":
            self._check_equal_dims(query_shape, key_shape, ' for score_mode="dot"')
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

    def build_score(self, query_shape, key_shape):
        build_luong_score(self, query_shape, key_shape)  # and g
        if self.score_mode == "location":
            self.W_a = keras.layers.Dense(
                self.max_value_length,
                use_bias=False,
                kernel_initializer=fresh_initializer(self.kernel_initializer),
                dtype=self.dtype_policy,
                name="W_a",
            )
            self.W_a.build(query_shape)

    def score(self, query, key):
        if self.score_mode != "location":
            return luong_score(self, query, key)
        scores = apply_dense(self.W_a, query)[..., : ops.shape(key)[1]]
        scores = ops.cast(scores, "float32")
        return scores * ops.cast(self.g, "float32") if self.use_scale else scores

    def get_config(self):
        return {
            **super().get_config(),
            **luong_score_config(self),
            "max_value_length": self.max_value_length,
        }
