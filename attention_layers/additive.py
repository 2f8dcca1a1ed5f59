"""Bahdanau (additive) attention: ``score(q, k) = v^T tanh(W1 q + W2 k)``."""

import math

import keras
from keras import ops

from attention_layers.base import (
    ScoreAttention,
    apply_dense,
    check_float,
    check_mask_shape,
    check_positive_int,
    fresh_initializer,
    static_shape,
)
from attention_layers.ops.additive_score import (
    IMPLEMENTATIONS,
    additive_scores,
)

__all__ = ["BahdanauAttention", "additive_scores"]


@keras.saving.register_keras_serializable(package="attention_layers")
class BahdanauAttention(ScoreAttention):
    """Additive attention of Bahdanau et al. (2015), with learned ``W1``, ``W2``, ``v``.

    ``e_ij = v^T tanh(W1 s_i + W2 h_j)``, ``a_ij = softmax_j(e_ij)``,
    ``c_i = sum_j a_ij h_j``, where ``s_i`` is the decoder state (query) and
    ``h_j`` the encoder states (keys and values). Unlike
    ``keras.layers.AdditiveAttention`` this has the projections of the paper and
    never stores the whole ``[B, Tq, Tv, units]`` tanh tensor: on a CPU it
    evaluates the score in blocks of query rows, on a GPU or TPU in one fused
    piece whose backward pass recomputes the tanh (`additive_scores`).

    With ``normalize=True`` the scoring vector is weight-normalised
    (Salimans & Kingma 2016): ``v = g v' / ||v'||`` with a learned scalar ``g``
    and a bias ``b`` inside the tanh, which trains more stably.

    With ``use_coverage=True`` the score also sees the coverage ``c_ij``, the
    attention that source position ``j`` received at the previous decoder
    steps (See et al. 2017): ``e_ij = v^T tanh(W1 s_i + W2 h_j + w_c c_ij +
    b)``, with a learned vector ``w_c`` and bias ``b`` (shared with
    ``normalize=True``). The call then takes ``coverage``; an
    `AttentionRNNCell` around the layer carries it from step to step.

    Args:
        units: size of the hidden layer of the score (the columns of W1 and W2).
        normalize: use the weight-normalised score.
        use_coverage: add the coverage term ``w_c c_ij`` (and the bias ``b``)
            to the score.
        block_elements: memory budget (tanh elements) of one block of queries;
            ``None`` uses the implementation's default (4M for ``"blocks"``,
            64M for ``"fused"``).
        implementation: how the score is evaluated: ``"blocks"`` (blocks of
            query rows, rematerialised), ``"fused"`` (one piece in float32,
            its gradient written out with the tanh recomputed), or
            ``"auto"``: ``"fused"`` on GPUs and TPUs, ``"blocks"`` on CPUs.
        kernel_initializer: initializer of ``W1``, ``W2`` and ``v``.
        dropout: fraction of attention weights dropped in training.
        seed: dropout seed.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        query, value, key, query_mask, value_mask, attention_mask,
        return_attention_scores, training, use_causal_mask: those of
        `ScoreAttention`.
        coverage: only with ``use_coverage=True``: ``[B, Tq, Tv]`` (``[B, Tv]``
            for a rank-2 query), the attention each memory position received
            before; ``None`` is zeros (the first decoder step). Its values at
            masked positions are ignored.

    Returns: those of `ScoreAttention`.

    Example:

    >>> import numpy as np
    >>> layer = BahdanauAttention(units=8)
    >>> query = np.random.rand(2, 3, 4).astype("float32")   # 3 decoder steps
    >>> value = np.random.rand(2, 5, 6).astype("float32")   # 5 encoder states
    >>> context, weights = layer(query, value, return_attention_scores=True)
    >>> tuple(context.shape), tuple(weights.shape)
    ((2, 3, 6), (2, 3, 5))

    With coverage, one decoder step at a time:

    >>> layer = BahdanauAttention(units=8, use_coverage=True)
    >>> coverage = np.zeros((2, 5), "float32")
    >>> for step in range(3):
    ...     context, weights = layer(query[:, step], value, coverage=coverage,
    ...                              return_attention_scores=True)
    ...     coverage = coverage + np.asarray(weights)
    >>> np.round(coverage.sum(-1), 4).tolist()  # each step adds weights summing to 1
    [3.0, 3.0]

    References:
        Bahdanau, Cho, Bengio. Neural Machine Translation by Jointly Learning to
        Align and Translate. ICLR 2015. https://arxiv.org/abs/1409.0473

        See, Liu, Manning. Get To The Point: Summarization with
        Pointer-Generator Networks. ACL 2017, section 2.3 (coverage).
        https://arxiv.org/abs/1704.04368
    """

    def __init__(
        self,
        units,
        normalize=False,
        block_elements=None,
        kernel_initializer="glorot_uniform",
        dropout=0.0,
        seed=None,
        use_coverage=False,
        implementation="auto",
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.units = check_positive_int(self, "units", units)
        self.normalize = normalize
        self.use_coverage = bool(use_coverage)
        self.block_elements = check_positive_int(
            self, "block_elements", block_elements, allow_none=True
        )
        if implementation not in IMPLEMENTATIONS:
            raise self._error(
                "implementation", f"one of {IMPLEMENTATIONS}", repr(implementation)
            )
        self.implementation = implementation
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build_score(self, query_shape, key_shape):
        # One initializer per weight: a shared one gives W1 == W2 when the
        # query and key sizes match (see `fresh_initializer`).
        self.query_dense, self.key_dense = (
            keras.layers.Dense(
                self.units,
                use_bias=False,
                kernel_initializer=fresh_initializer(self.kernel_initializer, index),
                dtype=self.dtype_policy,
                name=name,
            )
            for index, name in enumerate(("W1", "W2"))
        )
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.v = self.add_weight(
            name="v",
            shape=(self.units,),
            initializer=fresh_initializer(self.kernel_initializer, 2),
        )
        if self.normalize:
            self.g = self.add_weight(
                name="g",
                shape=(),
                initializer=keras.initializers.Constant(math.sqrt(1.0 / self.units)),
            )
        if self.normalize or self.use_coverage:
            self.b = self.add_weight(name="b", shape=(self.units,), initializer="zeros")
        if self.use_coverage:
            self.w_c = self.add_weight(
                name="w_c",
                shape=(self.units,),
                initializer=fresh_initializer(self.kernel_initializer, 3),
            )

    def score(self, query, key, coverage=None):
        v, bias = self.v, None
        if self.normalize:
            v = self.g * v / ops.sqrt(ops.sum(ops.square(v)))
        if self.normalize or self.use_coverage:
            bias = ops.cast(self.b, self.compute_dtype)
        return additive_scores(
            apply_dense(self.query_dense, query),
            apply_dense(self.key_dense, key),
            v,
            bias=bias,
            block_elements=self.block_elements,
            coverage=coverage,
            implementation=self.implementation,
            coverage_weight=self.w_c if coverage is not None else None,
        )

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
        coverage=None,
    ):
        if coverage is not None and not self.use_coverage:
            raise self._error(
                "coverage",
                "None: this layer has no coverage term (make it with "
                "use_coverage=True)",
                f"a tensor of shape {static_shape(coverage.shape)}",
            )
        inputs = self._prepare_inputs(
            query, value, key, query_mask, value_mask, attention_mask, use_causal_mask
        )
        score_arguments = {}
        if self.use_coverage:
            score_arguments["coverage"] = self._prepare_coverage(
                coverage, inputs, query, value
            )
        context, weights = self._attend(inputs, training, **score_arguments)
        return self._finish(inputs, context, weights, return_attention_scores)

    def _prepare_coverage(self, coverage, inputs, query, value):
        """``coverage`` checked, as ``[B, Tq, Tv]``, zero where ``inputs.mask``
        is False; zeros when it is None."""
        batch, tv = static_shape(value.shape)[:2]
        if coverage is None:
            shape = ops.shape(inputs.query)[:2] + (ops.shape(inputs.value)[1],)
            return ops.zeros(shape, self.compute_dtype)
        coverage = ops.convert_to_tensor(coverage)
        if inputs.single_step:
            expected = (batch, tv)
        else:
            expected = (batch, static_shape(query.shape)[1], tv)
        check_mask_shape(self, "coverage", coverage, expected)
        check_float(self, "coverage", coverage)
        coverage = ops.cast(coverage, self.compute_dtype)
        if inputs.single_step:
            coverage = ops.expand_dims(coverage, 1)
        if inputs.mask is not None:
            coverage = ops.where(inputs.mask, coverage, ops.zeros_like(coverage))
        return coverage

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "normalize": self.normalize,
            "use_coverage": self.use_coverage,
            "block_elements": self.block_elements,
            "implementation": self.implementation,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }
