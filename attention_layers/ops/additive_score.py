"""The additive score ``s_ij = v^T tanh(q_i + k_j + c_ij w_c + b)`` and its evaluations.

The naive form materialises a ``[B, Tq, Tv, U]`` tanh tensor (what
``keras.layers.AdditiveAttention`` does); no Keras or backend op computes the
score without it, hence our own evaluations, one per kind of device:

* ``"blocks"`` (the default on CPUs): blocks of query rows, each holding at
  most ``block_elements`` tanh values (4M by default: 16 MiB of float32, which
  stays in cache) and rematerialised in the backward pass (``keras.remat``).
  Where the lengths are unknown at trace time (TensorFlow with varying
  lengths) a loop plans the blocks when the step runs, with its gradient
  written out (`dynamic_blocks`).
* ``"fused"`` (the default on GPUs and TPUs): the whole score in one piece
  (blocks only past ``block_elements``, 64M tanh values by default: 256 MiB of
  float32 per temporary where nothing fuses), in float32, with its gradient
  written out (`fused_scores`): every sum over the tanh recomputes it, and
  each sum builds it in its own axis order, so that XLA fuses each one into a
  single reduction and no ``[B, Tq, Tv, U]`` tensor is stored (no
  common-subexpression pass can merge them). A serial loop of small blocks
  costs an accelerator a launch per block; recomputing the tanh costs it
  arithmetic, which it has plenty of, instead of memory traffic.

``"auto"`` picks by `attention_layers.ops.devices.platform`.
"""

import keras
from keras import ops

from attention_layers.base import linear, static_shape
from attention_layers.ops import devices

IMPLEMENTATIONS = ("auto", "blocks", "fused")
# Tanh elements of one block, per implementation (see the module docstring).
BLOCK_ELEMENTS = {"blocks": 1 << 22, "fused": 1 << 26}
# A batch unknown at trace time (Keras retraces fit's step with a free batch
# after a ragged last batch) is planned as this many rows.
ASSUMED_BATCH = 32


def choose_implementation(implementation="auto"):
    """``"blocks"`` or ``"fused"``: ``implementation``, with ``"auto"`` decided
    by the device (`attention_layers.ops.devices.platform`).

    >>> choose_implementation("fused")
    'fused'
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"additive_scores: `implementation` expected one of {IMPLEMENTATIONS}; "
            f"received {implementation!r}."
        )
    if implementation != "auto":
        return implementation
    return "fused" if devices.on_accelerator() else "blocks"


def additive_scores(
    query_proj,
    key_proj,
    v,
    bias=None,
    block_elements=None,
    coverage=None,
    coverage_weight=None,
    implementation="auto",
):
    """Additive scores ``s[b,i,j] = sum_u v[u] tanh(q[b,i,u] + k[b,j,u] + bias[u])``.

    With a ``coverage`` (See et al. 2017) the tanh also takes
    ``c[b,i,j] w_c[u]``. The result is the same on every evaluation (see the
    module docstring), up to float rounding; none holds more than one block of
    ``[B, rows, Tv, U]`` tanh values alive, forward or backward.

    Args:
        query_proj: ``[B, Tq, U]``, the projected queries ``W1 q``.
        key_proj: ``[B, Tv, U]``, the projected keys ``W2 k``.
        v: ``[U]``, the scoring vector.
        bias: optional ``[U]`` bias inside the tanh.
        block_elements: budget of tanh elements per block (``None``: the
            implementation's default).
        coverage: optional ``[B, Tq, Tv]``, the coverage ``c`` of each pair.
        coverage_weight: ``[U]``, the weight ``w_c`` of the coverage; required
            with ``coverage``.
        implementation: ``"auto"``, ``"blocks"`` or ``"fused"``.

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
    ...                     coverage_weight=np.ones(3, "float32"),
    ...                     implementation="fused")
    >>> tuple(np.round(np.asarray(s)[0, 0], 4).tolist())  # 3 tanh(0), 3 tanh(1)
    (0.0, 2.2848)
    """
    implementation = choose_implementation(implementation)
    if coverage is not None and coverage_weight is None:
        raise ValueError(
            "additive_scores: `coverage` needs `coverage_weight` (w_c, [U])."
        )
    query_proj = ops.convert_to_tensor(query_proj)
    dtype = query_proj.dtype
    key_proj = ops.convert_to_tensor(key_proj)
    if bias is not None:
        key_proj = key_proj + ops.cast(bias, key_proj.dtype)
    extra = ()
    if coverage is not None:
        extra = (ops.cast(coverage, dtype), ops.cast(coverage_weight, dtype))
    v = ops.cast(v, dtype)
    budget = block_elements or BLOCK_ELEMENTS[implementation]
    rows = block_rows(query_proj, key_proj, budget)
    if rows == "dynamic" and not extra:
        return dynamic_blocks(query_proj, key_proj, v, budget)
    score = fused_scores if implementation == "fused" else tanh_block
    tq = static_shape(query_proj.shape)[1]
    if rows in (None, "dynamic") or rows >= tq:
        return score(query_proj, key_proj, v, *extra)
    # split (its gradient is one concatenation), not slices (their gradients
    # are full-size padded tensors to sum): faster training steps.
    # Every tensor is an argument of a rematerialised block: TensorFlow
    # silently drops the gradients of tensors it closes over.
    if implementation == "blocks":
        score = keras.remat(score)
    splits = list(range(rows, tq, rows))
    pieces = [ops.split(query_proj, splits, axis=1)]
    if extra:
        pieces.append(ops.split(extra[0], splits, axis=1))
    blocks = [
        score(q, key_proj, v, *cov, *extra[1:]) for q, *cov in zip(*pieces, strict=True)
    ]
    return ops.concatenate(blocks, axis=1)


def block_rows(query_proj, key_proj, budget):
    """Query rows per block: an int, ``None`` for one piece, or ``"dynamic"``
    where the lengths are known only when the step runs (TensorFlow).

    One decoder step (``Tq = 1``) is one block whatever the budget; JAX's
    symbolic shapes (export) allow no shape computed from values, so they get
    one piece too.
    """
    b, tq, _ = static_shape(query_proj.shape)
    tv, units = static_shape(key_proj.shape)[1:]
    if tq == 1:
        return None
    if None in (tq, tv, units):
        return "dynamic" if keras.backend.backend() == "tensorflow" else None
    return max(1, budget // ((b or ASSUMED_BATCH) * tv * units))


def tanh_block(q, k, v, coverage=None, w_c=None):
    """``sum_u v tanh(q_i + k_j (+ c_ij w_c))`` of one block, by plain autodiff.

    ``q`` ``[B, r, U]``, ``k`` ``[B, Tv, U]``, ``coverage`` ``[B, r, Tv]``. A
    2-D matmul with ``v`` (`linear`): on TensorFlow faster than an einsum,
    forward and backward, and XLA compiles its gradient inside a decoder
    loop.
    """
    hidden = ops.expand_dims(q, 2) + ops.expand_dims(k, 1)
    if coverage is not None:
        hidden = hidden + ops.expand_dims(coverage, -1) * w_c
    return linear(ops.tanh(hidden), v)


# -- fused: one piece, the gradient written out -----------------------------
def _arrange(x, axes, order):
    """``x`` ``[B, *axes]`` with its axes in ``order`` (after the batch), a
    size-1 axis for each letter of ``order`` it lacks.

    Letters: ``q`` (query steps), ``k`` (keys), ``u`` (score units).
    """
    x = ops.transpose(x, [0] + [1 + axes.index(a) for a in order if a in axes])
    for i, a in enumerate(order):
        if a not in axes:
            x = ops.expand_dims(x, i + 1)
    return x


def _units(w, order):
    """A ``[U]`` vector shaped to broadcast along ``u`` of a ``[B, *order]`` tensor."""
    shape = [1] * 4
    shape[1 + order.index("u")] = -1
    return ops.reshape(w, shape)


def _tanh(order, q, k, coverage=None, w_c=None):
    """``tanh(q_i + k_j (+ c_ij w_c))`` as a ``[B, *order]`` tensor."""
    hidden = _arrange(q, "qu", order) + _arrange(k, "ku", order)
    if coverage is not None:
        hidden = hidden + _arrange(coverage, "qk", order) * _units(w_c, order)
    return ops.tanh(hidden)


def fused_scores(q, k, v, coverage=None, w_c=None):
    """`tanh_block` in float32, its gradient written out with the tanh recomputed.

    With ``t = tanh(q_i + k_j + c_ij w_c)``, ``ds`` the upstream gradient and
    ``g = ds v (1 - t^2)``: ``dq_i = v (sum_j ds - sum_j ds t^2)``,
    ``dk_j = v (sum_i ds - sum_i ds t^2)``, ``dv = sum ds t``,
    ``dc_ij = ds_ij (sum_u v w_c - sum_u v w_c t^2)`` and
    ``dw_c = v (sum ds c - sum ds c t^2)``. Each sum builds ``t`` in its own
    axis order (``"quk"`` for dq, ``"kuq"`` for dk, ...), so each stays a
    single fused reduction under XLA.
    """
    args = (q, k, v) if coverage is None else (q, k, v, coverage, w_c)
    dtypes = [x.dtype for x in args]

    @ops.custom_gradient
    def scores(*args):
        q, k, v, *cov = (ops.cast(x, "float32") for x in args)
        s = ops.sum(_tanh("qku", q, k, *cov) * _units(v, "qku"), axis=-1)

        def grad(*upstream_args, upstream=None):
            ds = upstream_args[0] if upstream is None else upstream
            ds = ops.cast(ds, "float32")  # [B, Tq, Tk]
            t = _tanh("quk", q, k, *cov)
            dq = ops.sum(ds, 2)[..., None] - ops.sum(
                _arrange(ds, "qk", "quk") * t * t, 3
            )
            t = _tanh("kuq", q, k, *cov)
            dk = ops.sum(ds, 1)[..., None] - ops.sum(
                _arrange(ds, "qk", "kuq") * t * t, 3
            )
            t = _tanh("uqk", q, k, *cov)
            grads = [dq * v, dk * v, ops.sum(_arrange(ds, "qk", "uqk") * t, (0, 2, 3))]
            if cov:
                c, w = cov
                vw = v * w
                t = _tanh("kqu", q, k, *cov)
                dct = ops.sum(vw) - ops.sum(t * t * _units(vw, "kqu"), 3)
                grads.append(ds * ops.swapaxes(dct, 1, 2))
                t = _tanh("ukq", q, k, *cov)
                dsc = _arrange(ds * c, "qk", "ukq")
                grads.append(v * (ops.sum(ds * c) - ops.sum(dsc * t * t, (0, 2, 3))))
            return tuple(ops.cast(g, d) for g, d in zip(grads, dtypes, strict=True))

        return ops.cast(s, dtypes[0]), grad

    return scores(*(ops.convert_to_tensor(x) for x in args))


# -- dynamic blocks: lengths known only when the step runs --------------------
def dynamic_blocks(query_proj, key_proj, v, budget):
    """`additive_scores` for lengths known only when the step runs (TensorFlow).

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

    def tanh_rows(qi, k):  # [B, rows, U], [B, Tv, U] -> [B, rows, Tv, U]
        return ops.tanh(ops.expand_dims(qi, 2) + ops.expand_dims(k, 1))

    @ops.custom_gradient
    def scores(q, k, v):
        blocks = split(q)

        def forward(i, out):
            t = tanh_rows(ops.take(blocks, i, axis=0), k)
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
                t = tanh_rows(ops.take(blocks, i, axis=0), k)
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
