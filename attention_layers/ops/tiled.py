"""Tiled attention with an online softmax and its own backward pass.

The forward pass visits query blocks one at a time. Without a causal mask,
and while a block's rows hold at most `WHOLE_ROW_ELEMENTS` scores per
(batch, head), a block takes all the keys at once: one softmax per row, the
computation of plain attention restricted to the block. Otherwise it visits
the keys in blocks with a running log-sum-exp ``lse`` and a running output
normalised over the keys seen so far (Milakov & Gimelshein 2018; Dao et al.
2022, FlashAttention), each tile normalised by one softmax op; with a causal
mask the tiles above the diagonal are skipped, not just masked. It keeps
only the output and each row's log-sum-exp. The backward pass is written out
(``keras.ops.custom_gradient``): one sweep over the query blocks, each
scanning the key blocks, recomputes each tile's weights ``P_ij = w_i *
softmax(S_ij)`` (``w_i = exp(lse_ij - lse_i)``, 1 for whole rows) and sums

    dS_ij = P_ij * (dO_i V_j^T - D_i),  D_i = rowsum(dO_i * O_i)
    dQ_i = sum_j dS_ij K_j,  dK_j = sum_i dS_ij^T Q_i,  dV_j = sum_i P_ij^T dO_i

Why our own: autodiff through the loops stores every tile's intermediates,
and TensorFlow runs rematerialised query blocks side by side, so memory
grows with ``Tq * Tk`` again; no Keras or TensorFlow op offers a tiled
attention on CPU. On CPU without XLA a tile costs what its ops write,
so the tile math writes as few tile-sized tensors as it can (`tile_softmax`,
`backward_tile`), and keys and values are cast and transposed once, outside
the loops. The scores and the products with the weights run in the score
dtype (bfloat16 under ``mixed_bfloat16``, as in the direct path and its
autodiff); the softmax, ``lse`` and every sum over blocks in float32 (whole
rows of bfloat16 scores use the native bfloat16 softmax op where it computes
in float32 inside: `probe_native_softmax`). The measurements behind these
choices are in docs/benchmark_notes.md.

The block layout, one tile and the softmax probe are in `tiles`; this module
reads top-down: the forward pass over query blocks, the backward pass over
query blocks, and the custom-gradient glue that joins them under
`tiled_attention`.
"""

import functools
from typing import NamedTuple

from keras import ops

from attention_layers.base import static_shape as _static
from attention_layers.ops.tiles import (
    block_layout,
    both_ways,
    context,
    from_blocks,
    key_block,
    key_blocks,
    last_key,
    probe_native_softmax,
    put,
    seen,
    tile_softmax,
    to_blocks,
)


# -- forward ---------------------------------------------------------------------------
def forward_key_tile(layout, qi, i, keys, j, state):
    """One step of the online softmax over query block ``i``'s key blocks.

    ``state`` is the running ``(lse, O)`` over the keys seen so far, ``O``
    normalised over them; key block ``j`` with ``lse_j`` and ``O_j = p_j V_j``
    gives ``lse' = logaddexp(lse, lse_j)`` and ``O' = exp(lse - lse') O +
    exp(lse_j - lse') O_j``.
    """
    lse, acc = state
    kt_j, vj = key_block(layout, keys, j)
    p, lse_j = tile_softmax(layout, qi, kt_j, i, j)
    new = ops.logaddexp(lse, lse_j)
    acc = ops.expand_dims(ops.exp(lse - new), -1) * acc + ops.expand_dims(
        ops.exp(lse_j - new), -1
    ) * context(p, vj)
    return new, acc


def forward_query_block(layout, qb, keys, rows, carry, i, native=False):
    """Query block ``i``'s output ``O_i`` and row log-sum-exps ``lse_i``.

    Whole rows: one softmax, ``O_i = softmax(S_i) V``. Square tiles: the
    online softmax (`forward_key_tile`) over key blocks ``[0, last_key)``.
    Rows that saw no real key get a zero output. keras' scan on TensorFlow
    wants outputs shaped like the carry: ``carry`` is an unused pair shaped
    like one block's outputs (its first also the zero start of ``O``).
    """
    qi = ops.take(qb, i, axis=1)
    if layout.whole_rows:  # one key block: its softmax is the answer
        kt_0, v0 = keys
        p, lse_i = tile_softmax(layout, qi, kt_0, i, 0, native)
        acc = context(p, v0)
    else:
        body = functools.partial(forward_key_tile, layout, qi, i, keys)
        start = (rows - float("inf"), carry[0])
        lse_i, acc = ops.fori_loop(0, last_key(layout, i), body, start)
    out_i = ops.where(ops.expand_dims(seen(lse_i), -1), acc, 0.0)
    return carry, (out_i, lse_i)


def forward_sweep(layout, qb, keys, rows, block, native):
    """Every query block's ``(O_i, lse_i)``, stacked: a scan over the blocks."""
    body = functools.partial(forward_query_block, layout, qb, keys, rows, native=native)
    return ops.scan(body, (block, rows), ops.arange(layout.nq, dtype="int32"))[1]


def forward(layout, qb, keys, native_check):
    """The forward pass, query blocks in sequence: ``O`` ``[B, nq, H, bq, Dv]``
    (float32) and each row's log-sum-exp ``lse`` ``[B, nq, H, bq]``, all the
    backward pass keeps. ``keys``: ``(K^T, V)`` from `key_blocks`;
    ``native_check`` from `probe_native_softmax`."""
    dv = _static(keys[1].shape)[-1]
    rows = ops.zeros_like(qb[:, 0, ..., 0], "float32")  # [B, H, bq]
    block = ops.zeros_like(qb[:, 0, ..., :1], "float32") * ops.zeros((dv,))
    sweep = functools.partial(forward_sweep, layout, qb, keys, rows, block)
    out, lse = both_ways(native_check, sweep)
    return ops.moveaxis(out, 0, 1), ops.moveaxis(lse, 0, 1)


# -- backward --------------------------------------------------------------------------
class Saved(NamedTuple):
    """What every query block of the backward pass reads."""

    qb: object  # Q in blocks, [B, nq, H, bq, D], the score dtype
    d_out: object  # dO, [B, nq, H, bq, Dv], float32
    lse: object  # the forward pass's row log-sum-exps, [B, nq, H, bq]
    delta: object  # D = rowsum(dO * O), [B, nq, H, bq]
    tiles: tuple  # (j, K_j^T, (V_j | 1)^T) per key block (`key_blocks`)
    k_rows: object  # with whole rows K [B, H, Tk, D], else None


class QueryRows(NamedTuple):
    """Query block ``i``'s share of `Saved`."""

    i: object
    q: object  # Q_i [B, H, bq, D]
    d_out: object  # dO_i [B, H, bq, Dv]
    lse: object  # lse_i [B, H, bq]
    seen: object  # rows that saw a real key
    delta: object  # D_i [B, H, bq, 1]


def backward_tile(layout, rows, k_rows, native, acc, x):
    """Tile (i, j) of the FlashAttention backward pass.

    Recomputes the weights ``P_ij = w * p_ij`` (`tile_softmax`; ``w =
    exp(lse_ij - lse_i)`` per row, 1 with whole rows), then ``dP_ij = dO_i
    V_j^T``, ``dS_ij = P_ij * (dP_ij - D_i)``, ``dQ_i += dS_ij K_j``, ``dK_j
    = dS_ij^T Q_i`` and ``dV_j = P_ij^T dO_i``. ``w`` scales the small
    ``dO_i`` and ``D_i`` rather than the tile, and ``dO_i V_j^T - D_i`` is one
    product (``dO_i`` with a column ``-D_i``, ``V_j`` with a column of ones):
    one tile-sized write less per tile. ``acc``: ``(dQ_i so far, an unused
    slot shaped like dO_i)`` (keras' scan on TensorFlow wants outputs shaped
    like the carry); ``x``: one of `Saved`'s ``tiles``. Returns ``acc`` and
    float32 ``(dK_ij, dV_ij)``, with whole rows transposed: ``dK^T = Q^T dS``,
    ``dV^T = dO^T P`` (XLA on CPU is slower multiplying by a transposed
    tile, ``dS^T Q``).
    """
    dq_i, unused = acc
    j, kt_j, vt_ones = x
    cd = rows.q.dtype
    kj = k_rows if layout.whole_rows else ops.swapaxes(kt_j, -1, -2)
    p, lse_ij = tile_softmax(layout, rows.q, kt_j, rows.i, j, native)
    w = ops.where(rows.seen, ops.exp(lse_ij - rows.lse), 0.0)[..., None]
    w_do = w * rows.d_out
    do_delta = ops.cast(ops.concatenate([w_do, -w * rows.delta], -1), cd)
    w_do = ops.cast(w_do, cd)
    p = ops.cast(p, cd)
    ds = p * ops.matmul(do_delta, vt_ones)
    dq_ij = ops.matmul(ds, kj)
    # One key block: dQ_i is this product, kept in the gradient's dtype;
    # otherwise a float32 sum over blocks.
    dq_i = dq_ij if layout.whole_rows else dq_i + ops.cast(dq_ij, "float32")
    if layout.whole_rows:
        dk_ij = ops.matmul(ops.swapaxes(rows.q, -1, -2), ds)
        dv_ij = ops.matmul(ops.swapaxes(w_do, -1, -2), p)
    else:  # square tiles keep dK, dV: keras' scan wants them like its carry
        dk_ij = ops.matmul(ops.swapaxes(ds, -1, -2), rows.q)
        dv_ij = ops.matmul(ops.swapaxes(p, -1, -2), w_do)
    return (dq_i, unused), (ops.cast(dk_ij, "float32"), ops.cast(dv_ij, "float32"))


def backward_causal_tile(layout, rows, k_rows, native, last, acc, x):
    """`backward_tile` below the diagonal (key block ``j < last``); zero
    gradients for the tiles above it, skipped rather than masked."""
    return ops.cond(
        x[0] < last,
        lambda: backward_tile(layout, rows, k_rows, native, acc, x),
        lambda: (acc, (ops.zeros_like(acc[0]), ops.zeros_like(acc[1]))),
    )


def backward_query_block(layout, saved, i, state, native=False):
    """Query block ``i``'s gradients: ``dQ_i`` put into ``dQ``, its shares of
    ``dK`` and ``dV`` added (``state``: ``(dQ, dK, dV)``).

    ``dK``, ``dV``: ``[nk, B, H, bk, D]``, key blocks leading, or with whole
    rows ``[B, H, D, Tk]``, transposed (see `backward_tile`). Square tiles
    are a scan over the key blocks.
    """
    dq, dk, dv = state
    qi = ops.take(saved.qb, i, axis=1)
    lse_i = ops.take(saved.lse, i, axis=1)
    rows = QueryRows(
        i=i,
        q=qi,
        d_out=ops.take(saved.d_out, i, axis=1),
        lse=lse_i,
        seen=seen(lse_i),
        delta=ops.expand_dims(ops.take(saved.delta, i, axis=1), -1),
    )
    zeros = (ops.zeros_like(qi, "float32"), ops.zeros_like(rows.d_out))
    args = (layout, rows, saved.k_rows, native)
    if layout.whole_rows:  # one key block, [bk] keys unlike the carry's [bq]
        acc, (dk_i, dv_i) = backward_tile(*args, zeros, saved.tiles)
    elif layout.masks.causal_offset is None:
        body = functools.partial(backward_tile, *args)
        acc, (dk_i, dv_i) = ops.scan(body, zeros, saved.tiles)
    else:
        body = functools.partial(backward_causal_tile, *args, last_key(layout, i))
        acc, (dk_i, dv_i) = ops.scan(body, zeros, saved.tiles)
    return put(dq, i, ops.cast(acc[0], dq.dtype)), dk + dk_i, dv + dv_i


def backward_sweep(layout, saved, start, native):
    """``(dQ, dK, dV)`` summed over the query blocks: a loop from ``start``."""
    body = functools.partial(backward_query_block, layout, saved, native=native)
    return ops.fori_loop(0, layout.nq, body, start)


def backward(layout, qb, kb, vb, kt, out, lse, d_out, native_check):
    """The backward pass: ``(dQ, dK, dV)`` in blocks, in the dtypes of ``qb``,
    ``kb``, ``vb``, from ``dO`` (float32) and the forward pass's ``O`` and
    ``lse`` (``kt``: K^T in blocks, the forward pass's). One sweep over the
    query blocks (`backward_query_block`), each over its key blocks; no
    tile's intermediates are stored.
    """
    cd = qb.dtype
    delta = ops.sum(d_out * out, axis=-1)  # D = rowsum(dO * O), [B, nq, H, bq]
    # V gets a column of ones, so that one product gives dO V^T - D (dO gets
    # the column -D): see `backward_tile`.
    v_ones = ops.concatenate([ops.cast(vb, cd), ops.ones_like(vb[..., :1], cd)], -1)
    # K^T and (V | 1)^T per key block.
    tiles = (
        0 if layout.whole_rows else ops.arange(layout.nk, dtype="int32"),
        *key_blocks(layout, kt, ops.swapaxes(v_ones, -1, -2)),
    )
    # K for dQ: whole rows take it once; a square tile transposes its K^T (a
    # third tensor scanned over is copied by each of the query blocks
    # TensorFlow runs at once).
    k_rows = ops.cast(kb[:, 0], cd) if layout.whole_rows else None
    saved = Saved(qb, d_out, lse, delta, tiles, k_rows)

    dk, dv = key_blocks(layout, *(ops.zeros_like(x, "float32") for x in (kb, vb)))
    if layout.whole_rows:  # dK^T, dV^T: [B, H, D, Tk]
        dk, dv = ops.swapaxes(dk, -1, -2), ops.swapaxes(dv, -1, -2)
    # dQ in the gradient's dtype: each block's rows are put once.
    start = (ops.zeros_like(qb), dk, dv)
    sweep = functools.partial(backward_sweep, layout, saved, start)
    dq, dk, dv = both_ways(native_check, sweep)
    if layout.whole_rows:  # [B, H, D, Tk] -> [B, 1, H, Tk, D]
        dk, dv = (ops.expand_dims(ops.swapaxes(x, -1, -2), 1) for x in (dk, dv))
    else:
        dk, dv = ops.moveaxis(dk, 0, 1), ops.moveaxis(dv, 0, 1)
    return ops.cast(dq, qb.dtype), ops.cast(dk, kb.dtype), ops.cast(dv, vb.dtype)


# -- the custom gradient ---------------------------------------------------------------
def attention_with_gradient(layout):
    """``attend(qb, kb, vb) -> O`` over ``layout``'s blocks
    (``[B, n, H, size, D]``), its gradient the written-out `backward`
    (``keras.ops.custom_gradient``) rather than autodiff through the loops.

    The probe (`probe_native_softmax`), ``K^T`` and the forward pass's ``O``
    and ``lse`` are computed once and shared by both passes.
    """

    @ops.custom_gradient
    def attend(qb, kb, vb):
        cd = qb.dtype
        native_check = probe_native_softmax(layout, qb)
        # K^T and V in the score dtype, once for all the tiles.
        kt = ops.swapaxes(ops.cast(kb, cd), -1, -2)  # [B, nk, H, D, bk]
        keys = key_blocks(layout, kt, ops.cast(vb, cd))
        out, lse = forward(layout, qb, keys, native_check)

        def grad(*args, upstream=None):
            d_out = ops.cast(args[0] if upstream is None else upstream, "float32")
            return backward(layout, qb, kb, vb, kt, out, lse, d_out, native_check)

        return out, grad

    return attend


def tiled_attention(query, key, value, masks, block_size):
    """Attention in blocks of ``block_size`` queries; ``[B, Tq, H, Dv]`` float32.

    ``query`` ``[B, Tq, H, D]`` (already scaled, in the score dtype), ``key``
    ``[B, Tk, H, D]``, ``value`` ``[B, Tk, H, Dv]``, ``masks`` a ``Masks``.
    Each query block sees the keys in blocks of ``block_size`` with an
    online softmax, or all at once where ``block_size * Tk`` is at most
    `WHOLE_ROW_ELEMENTS`, ``Tk`` is static and the mask is not causal: so a
    block holds no more than ``[B, H, block_size, max(block_size, Tk)]``
    scores, forward or backward (TensorFlow may run up to 10 blocks of a
    ``fori_loop`` at once), which grows linearly with the length. Lengths
    that are not a multiple of ``block_size`` (static or not) are padded and
    the padded keys masked. A query row with no visible key gets a zero
    output and zero gradients.

    >>> import numpy as np
    >>> from attention_layers.ops.masks import Masks
    >>> q = np.random.default_rng(0).normal(size=(1, 5, 2, 4)).astype("float32")
    >>> out = tiled_attention(q, q, q, Masks(None, None, None, 0), block_size=2)
    >>> tuple(out.shape)
    (1, 5, 2, 4)
    """
    layout = block_layout(query, key, masks, block_size)
    qb = to_blocks(query, layout, layout.nq, layout.bq, layout.pad_q)
    kb = to_blocks(key, layout, layout.nk, layout.bk, layout.pad_k)
    vb = to_blocks(value, layout, layout.nk, layout.bk, layout.pad_k)
    return from_blocks(attention_with_gradient(layout)(qb, kb, vb), layout)
