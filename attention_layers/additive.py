"""Bahdanau (additive) attention: ``score(q, k) = v^T tanh(W1 q + W2 k)``."""

import math

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import (
    ScoreAttention,
    apply_dense,
    check_float,
    check_mask_shape,
    check_positive_int,
    fresh_initializer,
    linear,
    static_shape,
)

# Elements of the [B, chunk, Tv, units] tanh block evaluated at once; 4M float32
# values = 16 MiB, small enough to stay in cache-friendly territory and to bound
# peak memory whatever the sequence lengths.
DEFAULT_BLOCK_ELEMENTS = 1 << 22
ASSUMED_BATCH = 32


def additive_scores(
    query_proj,
    key_proj,
    v,
    bias=None,
    block_elements=None,
    coverage=None,
    coverage_weight=None,
):
    """Additive scores ``s[b,i,j] = sum_u v[u] tanh(q[b,i,u] + k[b,j,u] + bias[u])``.

    The naive form materialises a ``[B, Tq, Tv, units]`` tensor (what
    ``keras.layers.AdditiveAttention`` does). This evaluates it in blocks of
    query rows so that at most about ``block_elements`` values of the tanh are
    alive at once; the result is identical. Keras has no fused op for this, hence
    our own loop.

    Each block is rematerialised (``keras.remat``): a backward pass recomputes
    its tanh instead of keeping every block alive, which cut the peak memory of
    a training step from 630 to 270 MiB (B=32, Tq=Tv=128, units=256, float32;
    Dense + ``AdditiveAttention``: 2.1 GiB) for about 1% more time
    (``benchmarks/bench_bahdanau.py``). Where the lengths are unknown at trace
    time (TensorFlow with varying lengths) the blocks are planned when the
    step runs instead (see ``_dynamic_blocks``).

    With a ``coverage`` (See et al. 2017) the tanh also takes the term
    ``c[b,i,j] w_c[u]``: ``s[b,i,j] = sum_u v[u] tanh(q[b,i,u] + k[b,j,u] +
    c[b,i,j] w_c[u] + bias[u])``. The static blocked path splits the coverage
    along its query axis with the queries. Where the lengths are unknown at
    trace time, a coverage term takes the single-block path (the whole
    ``[B, Tq, Tv, U]`` tanh at once, differentiated by autodiff) rather than
    ``_dynamic_blocks``: in a decoder the query is one step (``Tq = 1``),
    which is one block anyway.

    Args:
        query_proj: ``[B, Tq, U]``, the projected queries ``W1 q``.
        key_proj: ``[B, Tv, U]``, the projected keys ``W2 k``.
        v: ``[U]``, the scoring vector.
        bias: optional ``[U]`` bias inside the tanh.
        block_elements: budget of tanh elements per block (``None``: default).
        coverage: optional ``[B, Tq, Tv]``, the coverage ``c`` of each pair.
        coverage_weight: ``[U]``, the weight ``w_c`` of the coverage; required
            with ``coverage``.

    Returns:
        ``[B, Tq, Tv]`` scores in the inputs' dtype.

    Example:

    >>> import numpy as np
    >>> s = additive_scores(np.ones((1, 2, 3), "float32"),
    ...                     np.zeros((1, 4, 3), "float32"), np.ones(3, "float32"))
    >>> tuple(s.shape), round(float(s[0, 0, 0]), 4)  # 3 * tanh(1)
    ((1, 2, 4), 2.2848)
    >>> s = additive_scores(np.zeros((1, 1, 3), "float32"),
    ...                     np.zeros((1, 2, 3), "float32"), np.ones(3, "float32"),
    ...                     coverage=np.array([[[0.0, 1.0]]], "float32"),
    ...                     coverage_weight=np.ones(3, "float32"))
    >>> np.round(np.asarray(s)[0, 0], 4).tolist()  # 3 tanh(0) and 3 tanh(1)
    [0.0, 2.2848]
    """
    if coverage is not None:
        if coverage_weight is None:
            raise ValueError(
                "additive_scores: `coverage` needs `coverage_weight` (w_c, [U])."
            )
        return _coverage_scores(
            query_proj, key_proj, v, bias, block_elements, coverage, coverage_weight
        )
    if bias is not None:
        key_proj = key_proj + bias
    key_proj = ops.expand_dims(key_proj, 1)  # [B, 1, Tv, U]
    v = ops.cast(v, query_proj.dtype)  # [U]

    def block(q, k, v):  # q: [B, c, U] -> [B, c, Tv]
        # A matmul with v: on TF about 10% faster forward and 5% backward than
        # einsum("bqvu,u->bqv"), and faster than a multiply and sum; a 2-D one
        # (`linear`) so that XLA compiles its gradient inside a decoder loop.
        return linear(ops.tanh(ops.expand_dims(q, 2) + k), v)

    budget = block_elements or DEFAULT_BLOCK_ELEMENTS
    b, tq, _ = static_shape(query_proj.shape)
    tv, units = static_shape(key_proj.shape)[2:]
    if tq == 1:  # one decoder step: one block is the least it needs
        return block(query_proj, key_proj, v)
    if None in (tq, tv, units):
        # Lengths unknown at trace time (TensorFlow: tf.data batches of
        # varying length, a serving signature): blocks planned when the step
        # runs. JAX's symbolic shapes (export) allow no shape computed from
        # values: one piece there.
        if keras.backend.backend() != "tensorflow":
            return block(query_proj, key_proj, v)
        return _dynamic_blocks(query_proj, key_proj[:, 0], v, budget)
    # A batch unknown at trace time (Keras retraces fit's step with a free batch
    # after a ragged last batch) is planned as ASSUMED_BATCH rows.
    per_row = (b or ASSUMED_BATCH) * tv * units
    chunk = max(1, budget // per_row)
    if chunk >= tq:
        return block(query_proj, key_proj, v)
    # split (its gradient is one concatenation), not slices (their gradients
    # are full-size padded tensors to sum): about 5% faster training steps.
    # Every tensor is an argument of the rematerialised block: TF silently
    # drops the gradients of tensors it closes over.
    remat_block = keras.remat(block)
    pieces = ops.split(query_proj, list(range(chunk, tq, chunk)), axis=1)
    return ops.concatenate([remat_block(q, key_proj, v) for q in pieces], axis=1)


def _coverage_scores(query_proj, key_proj, v, bias, block_elements, coverage, w_c):
    """`additive_scores` with the coverage term ``c[b,i,j] w_c[u]`` in the tanh."""
    if bias is not None:
        key_proj = key_proj + bias
    key_proj = ops.expand_dims(key_proj, 1)  # [B, 1, Tv, U]
    dtype = query_proj.dtype
    v = ops.cast(v, dtype)
    w_c = ops.cast(w_c, dtype)
    coverage = ops.cast(coverage, dtype)

    def block(q, k, v, c, w):  # q: [B, r, U], c: [B, r, Tv] -> [B, r, Tv]
        hidden = ops.expand_dims(q, 2) + k + ops.expand_dims(c, -1) * w
        return linear(ops.tanh(hidden), v)

    budget = block_elements or DEFAULT_BLOCK_ELEMENTS
    b, tq, _ = static_shape(query_proj.shape)
    tv, units = static_shape(key_proj.shape)[2:]
    if tq == 1 or None in (tq, tv, units):
        # One decoder step, or lengths unknown at trace time: one block.
        return block(query_proj, key_proj, v, coverage, w_c)
    per_row = (b or ASSUMED_BATCH) * tv * units
    chunk = max(1, budget // per_row)
    if chunk >= tq:
        return block(query_proj, key_proj, v, coverage, w_c)
    remat_block = keras.remat(block)
    splits = list(range(chunk, tq, chunk))
    pieces = zip(
        ops.split(query_proj, splits, axis=1),
        ops.split(coverage, splits, axis=1),
        strict=True,
    )
    return ops.concatenate(
        [remat_block(q, key_proj, v, c, w_c) for q, c in pieces], axis=1
    )


def _dynamic_blocks(query_proj, key_proj, v, budget):
    """`additive_scores` for lengths known only when the step runs.

    The number of query rows per block, ``budget // (B * Tv * U)``, is a
    tensor here, so the blocks run in a loop, and the gradient is written
    out (``custom_gradient``) rather than left to autodiff, which would keep
    every block's tanh for the backward pass: with ``t = tanh(q_i + k_j)``
    and ``g = ds * v * (1 - t^2)``, ``dq_i = sum_j g``, ``dk_j = sum_i g`` and
    ``dv = sum ds * t``, each recomputed block by block. No more than one
    block of ``[B, rows, Tv, U]`` values is alive, forward or backward.
    """
    batch, tq, units = ops.shape(query_proj)
    tv = ops.shape(key_proj)[1]
    per_row = ops.maximum(batch * tv * units, 1)
    rows = ops.clip(budget // per_row, 1, ops.maximum(tq, 1))
    n = (tq + rows - 1) // rows
    dtype = query_proj.dtype
    zero = ops.zeros((), "int32")

    def split(x):  # [B, n * rows, U] -> [n, B, rows, U]
        x = ops.pad(x, [[0, 0], [0, n * rows - tq], [0, 0]])
        return ops.moveaxis(ops.reshape(x, (batch, n, rows, units)), 1, 0)

    def tanh_block(qi, k):  # [B, rows, U], [B, Tv, U] -> [B, rows, Tv, U]
        return ops.tanh(ops.expand_dims(qi, 2) + ops.expand_dims(k, 1))

    @ops.custom_gradient
    def scores(q, k, v):
        blocks = split(q)

        def forward(i, out):
            t = tanh_block(ops.take(blocks, i, axis=0), k)
            row = ops.expand_dims(linear(t, v), 0)
            return ops.slice_update(out, [i, zero, zero, zero], row)

        out = ops.fori_loop(0, n, forward, ops.zeros((n, batch, rows, tv), dtype))
        result = ops.reshape(ops.moveaxis(out, 0, 1), (batch, n * rows, tv))[:, :tq]

        def grad(*args, upstream=None):
            ds = args[0] if upstream is None else upstream  # [B, Tq, Tv]
            ds = ops.pad(ops.cast(ds, dtype), [[0, 0], [0, n * rows - tq], [0, 0]])
            ds = ops.moveaxis(ops.reshape(ds, (batch, n, rows, tv)), 1, 0)

            def backward(i, state):
                # g = ds v (1 - t^2) is never formed: its sums over j (for
                # dq) and over i (for dk) are v (sum ds - contraction of ds
                # with t^2), two contractions instead of four elementwise
                # passes over the block.
                dq, dk, dv = state
                t = tanh_block(ops.take(blocks, i, axis=0), k)
                ds_i = ops.take(ds, i, axis=0)  # padded rows carry ds = 0
                t2 = t * t
                dq_i = v * (
                    ops.expand_dims(ops.sum(ds_i, 2), -1)
                    - ops.einsum("bqv,bqvu->bqu", ds_i, t2)
                )
                dq = ops.slice_update(
                    dq, [i, zero, zero, zero], ops.expand_dims(dq_i, 0)
                )
                dk_i = v * (
                    ops.expand_dims(ops.sum(ds_i, 1), -1)
                    - ops.einsum("bqv,bqvu->bvu", ds_i, t2)
                )
                dk = dk + ops.cast(dk_i, "float32")
                dv = dv + ops.cast(ops.einsum("bqv,bqvu->u", ds_i, t), "float32")
                return dq, dk, dv

            start = (
                ops.zeros((n, batch, rows, units), dtype),
                ops.zeros((batch, tv, units), "float32"),
                ops.zeros((units,), "float32"),
            )
            dq, dk, dv = ops.fori_loop(0, n, backward, start)
            dq = ops.reshape(ops.moveaxis(dq, 0, 1), (batch, n * rows, units))[:, :tq]
            return dq, ops.cast(dk, k.dtype), ops.cast(dv, v.dtype)

        return result, grad

    return scores(query_proj, key_proj, v)


@keras.saving.register_keras_serializable(package="attention_layers")
class BahdanauAttention(ScoreAttention):
    """Additive attention of Bahdanau et al. (2015), with learned ``W1``, ``W2``, ``v``.

    ``e_ij = v^T tanh(W1 s_i + W2 h_j)``, ``a_ij = softmax_j(e_ij)``,
    ``c_i = sum_j a_ij h_j``, where ``s_i`` is the decoder state (query) and
    ``h_j`` the encoder states (keys and values). Unlike
    ``keras.layers.AdditiveAttention`` this has the projections of the paper and
    never materialises the whole ``[B, Tq, Tv, units]`` tanh tensor.

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
            ``None`` uses a 4M-element default.
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
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.units = check_positive_int(self, "units", units)
        self.normalize = normalize
        self.use_coverage = bool(use_coverage)
        self.block_elements = block_elements
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build_score(self, query_shape, key_shape):
        # One initializer per weight: a shared one gives W1 == W2 when the
        # query and key sizes match (see `fresh_initializer`).
        self.query_dense = keras.layers.Dense(
            self.units,
            use_bias=False,
            kernel_initializer=fresh_initializer(self.kernel_initializer, 0),
            dtype=self.dtype_policy,
            name="W1",
        )
        self.key_dense = keras.layers.Dense(
            self.units,
            use_bias=False,
            kernel_initializer=fresh_initializer(self.kernel_initializer, 1),
            dtype=self.dtype_policy,
            name="W2",
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
        if not self.use_coverage:
            if coverage is not None:
                raise self._error(
                    "coverage",
                    "None: this layer has no coverage term (make it with "
                    "use_coverage=True)",
                    f"a tensor of shape {static_shape(coverage.shape)}",
                )
            return super().call(
                query,
                value,
                key=key,
                query_mask=query_mask,
                value_mask=value_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                use_causal_mask=use_causal_mask,
            )
        inputs = self._prepare_inputs(
            query, value, key, query_mask, value_mask, attention_mask, use_causal_mask
        )
        coverage = self._prepare_coverage(coverage, inputs, query, value)
        weights = masking.masked_softmax(
            self.score(inputs.query, inputs.key, coverage=coverage), inputs.mask
        )
        weights = ops.cast(weights, self.compute_dtype)
        context = self._weighted_sum(weights, inputs.value, training)
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
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }
