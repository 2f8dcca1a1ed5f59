"""Luong local attention: local-m (monotonic) and local-p (predictive) windows."""

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import (
    ScoreAttention,
    check_mask_shape,
    check_positive_int,
    fresh_initializer,
    linear,
    renamed_argument,
    static_shape,
)
from attention_layers.luong import (
    build_luong_score,
    luong_score,
    luong_score_config,
    set_luong_score_arguments,
)

MODES = ("monotonic", "predictive")
SCORE_MODES = ("dot", "general", "concat")


def gather_rows(x, index):
    """``x[b, index[b, i, w]]``: rows of ``x`` ``[B, T, ...]`` -> ``[B, Tq, W, ...]``.

    One flat ``take``, so only the gathered rows are materialised (a broadcast
    ``take_along_axis`` would copy ``x`` once per query).
    """
    shape = ops.shape(x)
    offsets = ops.reshape(ops.arange(shape[0], dtype="int32") * shape[1], (-1, 1, 1))
    flat = ops.reshape(x, (-1,) + tuple(x.shape[2:]))
    return ops.take(flat, index + offsets, axis=0)


def gather_window_mask(mask, index):
    """``mask[b, i, index[b, i, w]]`` for a ``[B, Tq, Tv]`` mask -> ``[B, Tq, W]``."""
    shape = ops.shape(mask)
    rows = ops.arange(shape[0] * shape[1], dtype="int32") * shape[2]
    rows = ops.reshape(rows, (shape[0], shape[1], 1))
    return ops.take(ops.reshape(mask, (-1,)), index + rows, axis=0)


@keras.saving.register_keras_serializable(package="attention_layers")
class LocalAttention(ScoreAttention):
    """Local attention of Luong et al. (2015): a window of ``2D + 1`` source states.

    Each decoder step ``t`` attends only to the source positions ``s`` in
    ``[p_t - D, p_t + D]``, clipped at the sequence edges and at the padding:

    * ``mode="monotonic"`` (local-m): ``p_t = t``, the step index of a rank-3
      query, or the ``positions`` given to the call;
      ``a_t(s) = softmax(score(h_t, h_s))`` within the window.
    * ``mode="predictive"`` (local-p): ``p_t = S sigmoid(v_p^T tanh(W_p h_t))``
      with ``S`` the real source length (from ``value_mask``), clipped to the
      last position ``S - 1`` (positions count from 0, so ``S`` itself is one
      past the end; a clipped ``p_t`` gets no gradient), and
      ``a_t(s) = softmax(score) exp(-(s - p_t)^2 / (2 sigma^2))``,
      ``sigma = D / 2``, not renormalised (as in the paper), so the weights sum
      to at most 1. Gradients reach ``W_p`` and ``v_p`` through the Gaussian.

    The score is Luong's ``"dot"``, ``"general"`` or ``"concat"``; the context is
    ``c_t = sum_s a_t(s) h_s``. Keys, values and masks are gathered in the
    window, so the cost of a step grows with ``D``, not with the source length;
    the dense ``[B, Tq, Tv]`` weights are built only when they are returned.

    Args:
        mode: ``"predictive"`` (local-p) or ``"monotonic"`` (local-m).
        window: the half-width ``D`` of the window, an integer >= 1.
        score_mode: ``"dot"``, ``"general"`` or ``"concat"``.
        units: hidden size of the ``"concat"`` score and of ``W_p`` (default:
            the query size).
        use_scale: multiply the scores by a learned scalar ``g`` (initialised
            to 1). ``scale`` is its deprecated former name.
        kernel_initializer: initializer of ``W_a``, ``v_a``, ``W_p``, ``v_p``.
        dropout: fraction of attention weights dropped in training.
        seed: dropout seed.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        query, value, key, query_mask, value_mask, attention_mask, training,
            use_causal_mask: those of `ScoreAttention`.
        positions: local-m only: the window centres ``p_t``, ``[B]`` for a
            rank-2 query (required there) or ``[B, Tq]`` for a rank-3 query
            (default ``0 .. Tq - 1``).
        return_attention_scores: also return the dense weights ``[B, Tq, Tv]``
            (``[B, Tv]``), zero outside the window.
        return_positions: also return ``p_t`` (float32, ``[B, Tq]`` or ``[B]``).

    Returns:
        ``context`` ``[B, Tq, Dv]`` (``[B, Dv]`` for a rank-2 query), followed
        by ``weights`` if ``return_attention_scores`` and by ``positions`` if
        ``return_positions`` (a tuple when either is set).

    Example:

    >>> import numpy as np
    >>> layer = LocalAttention(mode="predictive", window=2, score_mode="general")
    >>> query = np.random.rand(2, 4).astype("float32")      # one decoder step
    >>> value = np.random.rand(2, 9, 6).astype("float32")
    >>> context, weights, p = layer(query, value, return_attention_scores=True,
    ...                             return_positions=True)
    >>> tuple(context.shape), tuple(weights.shape), tuple(p.shape)
    ((2, 6), (2, 9), (2,))
    >>> int((np.asarray(weights) > 0).sum(-1).max()) <= 5   # at most 2D + 1
    True

    References:
        Luong, Pham, Manning. Effective Approaches to Attention-based Neural
        Machine Translation. EMNLP 2015, section 3.2.
        https://arxiv.org/abs/1508.04025
    """

    def __init__(
        self,
        mode="predictive",
        window=10,
        score_mode="general",
        units=None,
        use_scale=False,
        kernel_initializer="glorot_uniform",
        dropout=0.0,
        seed=None,
        **kwargs,
    ):
        use_scale = renamed_argument(self, kwargs, "scale", "use_scale", use_scale)
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        if mode not in MODES:
            raise self._error("mode", f"one of {MODES}", repr(mode))
        window = check_positive_int(
            self, "window", window, meaning="(the half-width D)"
        )
        if score_mode == "location":
            raise self._error(
                "score_mode",
                f"one of {SCORE_MODES} (the location score has no window)",
                repr(score_mode),
            )
        set_luong_score_arguments(
            self, score_mode, SCORE_MODES, units, use_scale, kernel_initializer
        )
        self.mode = mode
        self.window = window

    # -- weights ----------------------------------------------------------
    def check_score_shapes(self, query_shape, key_shape):
        if self.score_mode == "dot":
            self._check_equal_dims(query_shape, key_shape, ' for score_mode="dot"')

    def _weight(self, name, shape, index, autocast=True):
        # One initializer per weight: a shared one gives W_p == W_a (general
        # score) and v_a == v_p (concat) at equal shapes.
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=fresh_initializer(self.kernel_initializer, index),
            autocast=autocast,
        )

    def build_score(self, query_shape, key_shape):
        build_luong_score(self, query_shape, key_shape)  # W_a, v_a, g
        if self.mode == "predictive":
            # Read in float32 under every policy (see _alignment_positions).
            units = self.units or query_shape[-1]
            self.W_p = self._weight("W_p", (query_shape[-1], units), 2, autocast=False)
            self.v_p = self._weight("v_p", (units,), 3, autocast=False)

    # -- the window ---------------------------------------------------------
    def _alignment_positions(self, inputs, positions=None):
        """``p_t`` ``[B, Tq]`` in float32 for the rank-3 ``inputs``."""
        query = inputs.query
        batch, tq = ops.shape(query)[0], ops.shape(query)[1]
        if self.mode == "predictive":
            if positions is not None:
                raise self._error(
                    "positions",
                    'None with mode="predictive" (p_t is predicted)',
                    "a tensor",
                )
            # float32 whatever the policy: p_t is a source index, and float16
            # or bfloat16 cannot even represent the integers past 2048 or 256.
            hidden = ops.tanh(linear(ops.cast(query, "float32"), self.W_p))
            logit = linear(hidden, self.v_p)
            if inputs.value_mask is None:
                length = ops.cast(ops.shape(inputs.value)[1], "float32")
            else:
                length = ops.sum(
                    ops.cast(masking.as_bool(inputs.value_mask), "float32"), axis=1
                )
                length = ops.expand_dims(length, 1)
            last = ops.maximum(length - 1.0, 0.0)  # 0-based: S is past the end
            return ops.minimum(length * ops.sigmoid(logit), last)
        if positions is None:
            if inputs.single_step:
                raise self._error(
                    "positions",
                    'the window centres [batch] for a rank-2 query with mode="'
                    'monotonic" (the step index is unknown)',
                    "None",
                )
            steps = ops.cast(ops.arange(tq), "float32")
            return ops.broadcast_to(ops.expand_dims(steps, 0), (batch, tq))
        positions = ops.convert_to_tensor(positions)
        b = static_shape(inputs.value.shape)[0]
        if inputs.single_step:
            check_mask_shape(self, "positions", positions, (b,))
            positions = ops.expand_dims(positions, 1)
        else:
            check_mask_shape(
                self, "positions", positions, (b, static_shape(query.shape)[1])
            )
        return ops.cast(positions, "float32")

    def _attend(self, inputs, training=None, positions=None, dense_weights=True):
        """Attention within the window around ``positions`` (``[B, Tq]``, float32).

        Returns ``(context [B, Tq, Dv], weights)`` where ``weights`` are the
        dense ``[B, Tq, Tv]`` weights if ``dense_weights``, else ``None``.
        """
        if positions is None:
            positions = self._alignment_positions(inputs)
        d = self.window
        tv = ops.shape(inputs.value)[1]
        # Integer s in [p_t - D, p_t + D]: 2D + 1 of them from ceil(p_t - D),
        # of which the last is out when p_t is not an integer.
        centre = ops.stop_gradient(positions)
        start = ops.cast(ops.ceil(centre - d), "int32")
        s = ops.expand_dims(start, -1) + ops.arange(2 * d + 1, dtype="int32")
        s_float = ops.cast(s, "float32")
        valid = ops.logical_and(
            ops.logical_and(ops.greater_equal(s, 0), ops.less(s, tv)),
            ops.less_equal(s_float, ops.expand_dims(centre, -1) + d),
        )
        index = ops.clip(s, 0, tv - 1)
        if inputs.mask is not None:
            valid = ops.logical_and(valid, gather_window_mask(inputs.mask, index))

        keys = gather_rows(inputs.key, index)  # [B, Tq, W, Dk]
        weights = masking.masked_softmax(luong_score(self, inputs.query, keys), valid)
        if self.mode == "predictive":
            sigma = d / 2.0
            distance = s_float - ops.expand_dims(positions, -1)
            weights = weights * ops.exp(-ops.square(distance) / (2.0 * sigma**2))
        weights = ops.cast(weights, self.compute_dtype)

        values = ops.cast(gather_rows(inputs.value, index), self.compute_dtype)
        applied = weights
        if self.dropout:
            applied = self._dropout_layer(weights, training=training)
        context = ops.einsum("bqw,bqwd->bqd", applied, values)
        if not dense_weights:
            return context, None
        # Scatter the window back to [B, Tq, Tv]: one-hot of s (out-of-range
        # s match no position and carry zero weight anyway).
        hits = ops.equal(ops.expand_dims(s, -1), ops.arange(tv, dtype="int32"))
        dense = ops.einsum("bqw,bqwt->bqt", weights, ops.cast(hits, weights.dtype))
        return context, dense

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        positions=None,
        return_positions=False,
    ):
        inputs = self._prepare_inputs(
            query, value, key, query_mask, value_mask, attention_mask, use_causal_mask
        )
        p = self._alignment_positions(inputs, positions)
        context, weights = self._attend(
            inputs, training, positions=p, dense_weights=return_attention_scores
        )
        if return_attention_scores:
            context, weights = self._finish(inputs, context, weights, True)
        elif inputs.single_step:
            context = ops.squeeze(context, 1)
        if inputs.single_step:
            p = ops.squeeze(p, 1)
        outputs = (context,)
        if return_attention_scores:
            outputs += (weights,)
        if return_positions:
            outputs += (p,)
        return outputs[0] if len(outputs) == 1 else outputs

    def get_config(self):
        return {
            **super().get_config(),
            "mode": self.mode,
            "window": self.window,
            **luong_score_config(self),
        }
