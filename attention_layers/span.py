"""Extractive question answering: bidirectional attention flow and answer spans.

BiDAF (Seo et al. 2017) reads a passage ``H`` ``[B, T, d]`` against a question
``U`` ``[B, J, d]`` with one similarity matrix ``S`` ``[B, T, J]`` and
attention in both directions, context-to-query (which question words matter
to each passage word) and query-to-context (which passage words matter most
to the question), and emits a query-aware passage ``G`` ``[B, T, 4d]``.
`SpanPointer` turns the modelled passage into start and end logits,
`best_span` picks the best answer span under a length limit, and `span_loss`
is the training loss of the two pointers.
"""

import numbers

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import (
    ScoreAttention,
    check_built_dim,
    check_float,
    check_mask_shape,
    fresh_initializer,
    input_error,
    linear,
    static_shape,
)
from attention_layers.masking import NEG_INF


def _function_error(function, argument, expected, received):
    """The ``ValueError`` of a function of this module, in the house format."""
    return ValueError(
        f"{function}: argument `{argument}` expected {expected}; received {received}."
    )


@keras.saving.register_keras_serializable(package="attention_layers")
class BidirectionalAttentionFlow(ScoreAttention):
    """Bidirectional attention flow between a passage and a question (BiDAF).

    With the passage encodings ``h_t`` (the ``query``, ``[B, T, d]``) and the
    question encodings ``u_j`` (the ``value``, ``[B, J, d]``):

    * similarity ``S_tj = w^T [h_t; u_j; h_t * u_j]``, computed as
      ``w_h . h_t + w_u . u_j + (w_hu * h_t) . u_j`` with ``w = [w_h; w_u;
      w_hu]`` (one ``kernel`` of size ``3d``), so the ``[B, T, J, 3d]``
      concatenation is never built;
    * context-to-query ``a_t = softmax_j(S_tj)`` over the unmasked question
      words and ``U~_t = sum_j a_tj u_j``;
    * query-to-context ``b = softmax_t(max_j S_tj)`` over the unmasked passage
      words (the max over unmasked ``j`` only) and ``h~ = sum_t b_t h_t``,
      the same for every ``t``;
    * output ``G_t = [h_t; U~_t; h_t * U~_t; h_t * h~]`` ``[B, T, 4d]``.

    ``G`` is zero at masked passage positions and keeps the passage mask
    (the Keras mask of ``query``), so a modelling RNN over it honours the
    padding. A fully masked question gives zero attention in both directions
    (``G_t = [h_t; 0; 0; 0]``), a fully masked passage gives zeros; never NaN.
    NaN or inf under padding does not leak. The softmaxes run in float32
    under any policy, the scores too under ``mixed_float16`` (bfloat16 keeps
    its own dtype, as in every score layer); the output is in the compute
    dtype, so under ``mixed_float16`` the products ``h_t * U~_t`` and
    ``h_t * h~`` overflow where ``|h| |u|`` passes 65504, as any float16
    product does.

    The layer is a `ScoreAttention` (its validation, padding scrub, mask
    merging and dropout), with the house call signature less ``key``,
    ``attention_mask`` and ``use_causal_mask``: the question is its own key,
    and a passage-to-question alignment has no causal order.

    Args:
        kernel_initializer: initializer of the similarity vector ``w``.
        dropout: fraction of both attention distributions dropped in training.
        seed: seed of the dropout.
        **kwargs: standard ``keras.layers.Layer`` arguments (``name``, ``dtype``).

    Call arguments:
        query: ``[B, T, d]``, the passage encodings ``H``.
        value: ``[B, J, d]``, the question encodings ``U`` (same ``d``).
        query_mask: ``[B, T]``, True on real passage words; Keras fills it
            from an ``Embedding(mask_zero=True)``.
        value_mask: ``[B, J]``, True on real question words; likewise.
        return_attention_scores: also return the two attentions.
        training: whether dropout is active.

    Returns:
        ``G`` ``[B, T, 4d]``, and with ``return_attention_scores=True`` the
        tuple ``(G, (c2q, q2c))``: ``c2q`` ``[B, T, J]`` (the ``a_t``, rows sum
        to 1 over the unmasked question, 0 at masked passage positions) and
        ``q2c`` ``[B, T]`` (the ``b``, sums to 1 over the unmasked passage).

    Example:

    >>> import numpy as np
    >>> import attention_layers as al
    >>> passage = np.random.rand(2, 6, 4).astype("float32")
    >>> question = np.random.rand(2, 3, 4).astype("float32")
    >>> layer = al.BidirectionalAttentionFlow()
    >>> g, (c2q, q2c) = layer(passage, question, return_attention_scores=True)
    >>> tuple(g.shape), tuple(c2q.shape), tuple(q2c.shape)
    ((2, 6, 16), (2, 6, 3), (2, 6))
    >>> np.allclose(np.asarray(c2q).sum(-1), 1), np.allclose(np.asarray(q2c).sum(-1), 1)
    (True, True)

    References:
        Seo, Kembhavi, Farhadi and Hajishirzi. Bidirectional Attention Flow
        for Machine Comprehension. ICLR 2017, section 2 (item 4).
        https://arxiv.org/abs/1611.01603
    """

    def __init__(
        self, kernel_initializer="glorot_uniform", dropout=0.0, seed=None, **kwargs
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    # -- shapes -------------------------------------------------------------
    def build(self, query_shape, value_shape):
        super().build(query_shape, value_shape)

    def _check_shapes(self, query_shape, value_shape, key_shape):
        query, value = static_shape(query_shape), static_shape(value_shape)
        if len(query) != 3:
            raise self._error(
                "query",
                "a rank-3 tensor [batch, passage_length, dim] (the passage "
                "encodings H)",
                f"shape {query}",
            )
        if len(value) != 3:
            raise self._error(
                "value",
                "a rank-3 tensor [batch, question_length, dim] (the question "
                "encodings U)",
                f"shape {value}",
            )
        super()._check_shapes(query_shape, value_shape, key_shape)

    def check_score_shapes(self, query_shape, key_shape):
        d, dv = query_shape[-1], key_shape[-1]
        if d is None:
            raise self._error(
                "query",
                "a known last dimension (the size of w is 3 * dim)",
                f"shape {tuple(query_shape)}",
            )
        kernel = getattr(self, "kernel", None)
        if kernel is not None and kernel.shape[0] != 3 * d:
            raise self._error(
                "query",
                f"last dimension {kernel.shape[0] // 3} (as when the layer was built)",
                f"shape {tuple(query_shape)}",
            )
        if dv is not None and dv != d:
            raise self._error(
                "value",
                f"last dimension equal to the query's ({d}), for h_t * u_j",
                f"shape {tuple(key_shape)}",
            )

    def build_score(self, query_shape, key_shape):
        self.kernel = self.add_weight(
            name="kernel",
            shape=(3 * query_shape[-1],),
            initializer=self.kernel_initializer,
        )

    # -- the computation ----------------------------------------------------
    def score(self, query, key):
        """``S`` ``[B, T, J]`` from ``H`` ``[B, T, d]`` and ``U`` ``[B, J, d]``."""
        dtype = self._score_dtype()
        h, u = ops.cast(query, dtype), ops.cast(key, dtype)
        w = ops.cast(self.kernel, dtype)
        d = self.kernel.shape[0] // 3
        w_h, w_u, w_hu = w[:d], w[d : 2 * d], w[2 * d :]
        return (
            ops.expand_dims(linear(h, w_h), 2)
            + ops.expand_dims(linear(u, w_u), 1)
            + ops.matmul(h * w_hu, ops.transpose(u, (0, 2, 1)))
        )

    def _dropped(self, weights, training):
        if self.dropout:
            return self._dropout_layer(weights, training=training)
        return weights

    def call(
        self,
        query,
        value,
        query_mask=None,
        value_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        inputs = self._prepare_inputs(query, value, None, query_mask, value_mask)
        mask = inputs.mask  # [B, T, J]: passage word t and question word j exist
        scores = self.score(inputs.query, inputs.key)
        c2q = masking.masked_softmax(scores, mask)
        # Query-to-context: the best question word of each passage word; a
        # passage word takes part where it exists and the question is not empty.
        scores = ops.cast(scores, "float32")
        if mask is None:
            q2c = ops.softmax(ops.max(scores, axis=-1), axis=-1)
        else:
            best = ops.max(ops.where(mask, scores, masking.MASK_FILL), axis=-1)
            q2c = masking.masked_softmax(best, ops.any(mask, axis=-1))

        dtype = self.compute_dtype
        c2q, q2c = ops.cast(c2q, dtype), ops.cast(q2c, dtype)
        h = ops.cast(inputs.query, dtype)
        attended = self._weighted_sum(c2q, inputs.value, training)  # U~ [B, T, d]
        summary = ops.matmul(
            ops.expand_dims(self._dropped(q2c, training), 1), h
        )  # h~ [B, 1, d]
        g = ops.concatenate([h, attended, h * attended, h * summary], axis=-1)
        g = masking.zero_masked(g, query_mask)
        if return_attention_scores:
            return g, (c2q, q2c)
        return g

    def get_config(self):
        return {
            **super().get_config(),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }


@keras.saving.register_keras_serializable(package="attention_layers")
class SpanPointer(keras.layers.Layer):
    """Start and end logits of an answer span over a modelled passage.

    The output layer of BiDAF: ``p1 = softmax(w_1^T [G; M])`` and
    ``p2 = softmax(w_2^T [G; M2])``, with ``G`` the output of
    `BidirectionalAttentionFlow`, ``M`` the modelling layer's output and
    ``M2`` one more RNN over ``M``. The layer takes the concatenations: the
    start logits are ``w_1 . inputs_t`` and the end logits
    ``w_2 . end_inputs_t`` (``end_inputs`` defaults to ``inputs``, with its
    own ``w_2``). No bias: it would cancel in the softmax over ``t``.

    The logits are float32 under any dtype policy and exactly ``NEG_INF``
    (``-1e9``, finite) at masked positions, so a softmax, `span_loss` or
    `best_span` never picks them; NaN or inf there does not leak, into the
    logits or the gradients. The outputs carry no Keras mask (they are
    scores over the positions, not a sequence).

    Keras fills ``mask`` from the Keras mask of ``inputs`` when it is the
    only tensor argument; when ``end_inputs`` is given too it fills
    ``inputs_mask`` instead (its rule for several tensor arguments), which
    means the same. An explicit ``mask`` wins.

    Args:
        kernel_initializer: initializer of ``w_1`` and ``w_2``.
        **kwargs: standard ``keras.layers.Layer`` arguments (``name``, ``dtype``).

    Call arguments:
        inputs: ``[B, T, F]``, e.g. ``[G; M]``.
        end_inputs: optional ``[B, T, F2]``, e.g. ``[G; M2]``; defaults to
            ``inputs``.
        mask: optional ``[B, T]``, True on real passage words.
        inputs_mask: the same as ``mask`` (filled by Keras, see above).

    Returns:
        ``(start_logits, end_logits)``, float32 ``[B, T]`` each.

    Example:

    >>> import numpy as np
    >>> import attention_layers as al
    >>> features = np.random.rand(2, 5, 8).astype("float32")
    >>> mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    >>> start, end = al.SpanPointer()(features, mask=mask)
    >>> tuple(start.shape), tuple(end.shape)
    ((2, 5), (2, 5))
    >>> np.asarray(start)[1, 3:].tolist()
    [-1000000000.0, -1000000000.0]

    References:
        Seo, Kembhavi, Farhadi and Hajishirzi. Bidirectional Attention Flow
        for Machine Comprehension. ICLR 2017, section 2 (item 6).
        https://arxiv.org/abs/1611.01603
    """

    def __init__(self, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, inputs_shape, end_inputs_shape=None):
        self._check_shapes(inputs_shape, end_inputs_shape)
        end_inputs_shape = (
            inputs_shape if end_inputs_shape is None else end_inputs_shape
        )
        for name, shape in (("inputs", inputs_shape), ("end_inputs", end_inputs_shape)):
            if static_shape(shape)[-1] is None:
                raise input_error(
                    self,
                    name,
                    "a known last dimension (the size of its kernel)",
                    f"shape {static_shape(shape)}",
                )
        self.start_kernel = self.add_weight(
            name="start_kernel",
            shape=(static_shape(inputs_shape)[-1],),
            initializer=fresh_initializer(self.kernel_initializer, 0),
        )
        self.end_kernel = self.add_weight(
            name="end_kernel",
            shape=(static_shape(end_inputs_shape)[-1],),
            initializer=fresh_initializer(self.kernel_initializer, 1),
        )

    def _check_shapes(self, inputs_shape, end_inputs_shape):
        inputs = static_shape(inputs_shape)
        end = None if end_inputs_shape is None else static_shape(end_inputs_shape)
        for name, shape in (("inputs", inputs), ("end_inputs", end)):
            if shape is not None and len(shape) != 3:
                raise input_error(
                    self,
                    name,
                    "a rank-3 tensor [batch, length, features]",
                    f"shape {shape}",
                )
        if end is None:
            return
        for axis, what in ((0, "batch size"), (1, "length")):
            if None not in (inputs[axis], end[axis]) and inputs[axis] != end[axis]:
                raise input_error(
                    self,
                    "end_inputs",
                    f"the {what} of inputs ({inputs[axis]})",
                    f"shape {end}",
                )

    def call(self, inputs, end_inputs=None, mask=None, inputs_mask=None):
        self._check_shapes(
            inputs.shape, None if end_inputs is None else end_inputs.shape
        )
        check_float(self, "inputs", inputs)
        if end_inputs is not None:
            check_float(self, "end_inputs", end_inputs)
        mask = inputs_mask if mask is None else mask
        batch, length = static_shape(inputs.shape)[:2]
        check_mask_shape(self, "mask", mask, (batch, length))
        end_inputs = inputs if end_inputs is None else end_inputs
        check_built_dim(self, "inputs", inputs, self.start_kernel.shape[0])
        check_built_dim(self, "end_inputs", end_inputs, self.end_kernel.shape[0])

        logits = []
        for x, kernel in ((inputs, self.start_kernel), (end_inputs, self.end_kernel)):
            # Scrub padding first: NaN there would reach the kernel's gradient.
            x = ops.cast(masking.zero_masked(x, mask), "float32")
            z = linear(x, ops.cast(kernel, "float32"))
            if mask is not None:
                z = ops.where(masking.as_bool(mask), z, NEG_INF)
            logits.append(z)
        return tuple(logits)

    def compute_mask(self, inputs, previous_mask=None):
        return None

    def get_config(self):
        return {
            **super().get_config(),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }


def _check_logits(function, start_logits, end_logits):
    start_logits = ops.convert_to_tensor(start_logits)
    end_logits = ops.convert_to_tensor(end_logits)
    for name, x in (("start_logits", start_logits), ("end_logits", end_logits)):
        shape = static_shape(x.shape)
        if len(shape) != 2:
            raise _function_error(
                function, name, "a rank-2 tensor [batch, length]", f"shape {shape}"
            )
        dtype = keras.backend.standardize_dtype(x.dtype)
        if "float" not in dtype:
            raise _function_error(
                function, name, "a floating-point tensor", f"dtype {dtype}"
            )
    a, b = static_shape(start_logits.shape), static_shape(end_logits.shape)
    if any(None not in (x, y) and x != y for x, y in zip(a, b, strict=True)):
        raise _function_error(
            function, "end_logits", f"the shape of start_logits {a}", f"shape {b}"
        )
    return ops.cast(start_logits, "float32"), ops.cast(end_logits, "float32")


def best_span(start_logits, end_logits, max_span_length, mask=None):
    """The answer span ``(i, j)`` with the best ``start_logits[i] + end_logits[j]``.

    The argmax over ``j >= i``, ``j - i < max_span_length``, both positions
    unmasked. The scores are log-space: logits (or log-probabilities) add,
    as the log of ``p1(i) p2(j)``; the normalisers of the two softmaxes are
    the same for every span and do not change the argmax.

    Computed as an ``O(T * L)`` band (``L = max_span_length``): the end logits
    are gathered at ``i + k`` for every start ``i`` and offset ``k < L`` into
    ``[B, T, L]``, then one argmax over the flattened band. Answer lengths are
    short next to passages (SQuAD: ``L`` of 15 to 30 against ``T`` in the
    hundreds), so this is ``T / L`` times smaller than the ``[B, T, T]``
    matrix of every pair, and it is one gather with static shapes (XLA,
    TensorFlow and JAX alike). Ties go to the smallest ``i``, then the
    smallest ``j``.

    Args:
        start_logits: ``[B, T]`` float, e.g. from `SpanPointer`.
        end_logits: ``[B, T]`` float.
        max_span_length: ``L``, a positive Python int: the longest span, in
            tokens (1: single tokens). ``L >= T`` allows every span.
        mask: optional ``[B, T]``, True on real passage words.

    Returns:
        ``(start, end, score)``: ``start`` and ``end`` int32 ``[B]`` (``end``
        inclusive, ``start <= end``) and the float32 ``score`` ``[B]``,
        ``start_logits[start] + end_logits[end]``. A row with no valid span
        (a fully masked passage) gives ``(0, 0, NEG_INF)``.

    Example:

    >>> import numpy as np
    >>> from attention_layers import best_span
    >>> start_logits = np.array([[-5.0, 3.0, 1.0, 0.0]], "float32")
    >>> end_logits = np.array([[9.0, 0.0, 2.0, 5.0]], "float32")
    >>> # (1, 0) would score 12 but ends before it starts.
    >>> start, end, score = best_span(start_logits, end_logits, max_span_length=2)
    >>> int(start[0]), int(end[0]), float(score[0])
    (2, 3, 6.0)
    >>> start, end, score = best_span(start_logits, end_logits, max_span_length=4)
    >>> int(start[0]), int(end[0]), float(score[0])
    (1, 3, 8.0)
    """
    if (
        isinstance(max_span_length, bool)
        or not isinstance(max_span_length, numbers.Integral)
        or max_span_length < 1
    ):
        raise _function_error(
            "best_span",
            "max_span_length",
            "a positive Python int",
            repr(max_span_length),
        )
    start_logits, end_logits = _check_logits("best_span", start_logits, end_logits)
    batch, t_static = static_shape(start_logits.shape)
    if mask is not None:
        mask = ops.convert_to_tensor(mask)
        shape = static_shape(mask.shape)
        if len(shape) != 2 or any(
            None not in (x, y) and x != y
            for x, y in zip(shape, (batch, t_static), strict=True)
        ):
            raise _function_error(
                "best_span",
                "mask",
                f"shape {(batch, t_static)} (that of start_logits)",
                f"shape {shape}",
            )
        mask = masking.as_bool(mask)
    span = int(max_span_length)
    if t_static is not None:
        span = min(span, t_static)
    length = ops.shape(start_logits)[1]
    ends = ops.expand_dims(ops.arange(length, dtype="int32"), 1) + ops.expand_dims(
        ops.arange(span, dtype="int32"), 0
    )  # [T, L]: end of the span from start i with offset k
    inside = ends < length
    ends = ops.minimum(ends, length - 1)
    flat_ends = ops.reshape(ends, (-1,))
    end_at = ops.reshape(
        ops.take(end_logits, flat_ends, axis=1), (-1, length, span)
    )  # [B, T, L]
    valid = ops.expand_dims(inside, 0)
    if mask is not None:
        end_ok = ops.reshape(ops.take(mask, flat_ends, axis=1), (-1, length, span))
        valid = ops.logical_and(
            valid, ops.logical_and(ops.expand_dims(mask, 2), end_ok)
        )
    scores = ops.expand_dims(start_logits, 2) + end_at
    scores = ops.where(valid, scores, NEG_INF)
    flat = ops.reshape(scores, (-1, length * span))
    best = ops.cast(ops.argmax(flat, axis=-1), "int32")
    start = best // span
    end = start + best % span
    score = ops.max(flat, axis=-1)
    return start, end, score


def span_loss(start_logits, end_logits, start, end):
    """The negative log-likelihood of the answer span, per example.

    ``-log p1(start) - log p2(end)`` with ``p1 = softmax(start_logits)`` and
    ``p2 = softmax(end_logits)``, in float32 with ``log_softmax``. Logits are
    clipped from below at ``NEG_INF`` (``-1e9``), so masked positions (as
    `SpanPointer` gives them) and even ``-inf`` keep the loss finite; a
    target at a masked position costs about ``1e9``. The mean over the batch
    equals the sum of two ``SparseCategoricalCrossentropy(from_logits=True)``
    losses, one per pointer.

    Args:
        start_logits: ``[B, T]`` float.
        end_logits: ``[B, T]`` float.
        start: ``[B]`` (or ``[B, 1]``) int, the answer's first token.
        end: ``[B]`` (or ``[B, 1]``) int, its last token (inclusive).

    Returns:
        float32 ``[B]``.

    Example:

    >>> import numpy as np
    >>> from attention_layers import span_loss
    >>> logits = np.log(np.array([[0.5, 0.25, 0.25]], "float32"))
    >>> loss = span_loss(logits, logits, np.array([0]), np.array([1]))
    >>> round(float(loss[0]), 4), round(float(np.log(2) + np.log(4)), 4)
    (2.0794, 2.0794)
    """
    start_logits, end_logits = _check_logits("span_loss", start_logits, end_logits)
    batch = static_shape(start_logits.shape)[0]
    total = 0.0
    for name, logits, target in (
        ("start", start_logits, start),
        ("end", end_logits, end),
    ):
        target = ops.convert_to_tensor(target)
        shape = static_shape(target.shape)
        dtype = keras.backend.standardize_dtype(target.dtype)
        if (
            len(shape) not in (1, 2)
            or (len(shape) == 2 and shape[1] != 1)
            or (None not in (batch, shape[0]) and batch != shape[0])
            or "int" not in dtype
        ):
            raise _function_error(
                "span_loss",
                name,
                f"an integer tensor of shape ({batch},) (or ({batch}, 1)): one "
                "position per example",
                f"shape {shape}, dtype {dtype}",
            )
        target = ops.reshape(ops.cast(target, "int32"), (-1, 1))
        log_p = ops.log_softmax(ops.maximum(logits, NEG_INF), axis=-1)
        total = total - ops.take_along_axis(log_p, target, axis=1)[:, 0]
    return total
