"""Tiled attention with an online softmax and its own backward pass.

The forward pass visits query blocks one at a time. Without a causal mask,
and while a block's rows hold at most `WHOLE_ROW_ELEMENTS` scores per
(batch, head), a block takes all the keys at once: one softmax per row, the
computation of plain attention restricted to the block. Otherwise it visits
the keys in blocks with a running log-sum-exp ``lse`` and a running output
normalised over the keys seen so far (Milakov & Gimelshein 2018; Dao et al.
2022, FlashAttention), each tile normalised by one softmax op. It keeps only
the output and each row's log-sum-exp. The backward pass is written out
(``keras.ops.custom_gradient``) rather than left to autodiff: one sweep over
the query blocks, each scanning the key blocks, recomputes each tile's
weights ``P_ij = w_i * softmax(S_ij)`` (``w_i = exp(lse_ij - lse_i)``, 1 for
whole rows) and sums

    dS_ij = P_ij * (dO_i V_j^T - D_i),  D_i = rowsum(dO_i * O_i)
    dQ_i = sum_j dS_ij K_j,  dK_j = sum_i dS_ij^T Q_i,  dV_j = sum_i P_ij^T dO_i

On CPU without XLA every op that writes a tile-sized tensor costs about as
much as the next, so the tile math writes as few as it can: one softmax
instead of ``exp(s - m)`` and its normalisation, ``w_i`` applied to the
small ``dO_i`` and ``D_i`` rather than to the tile, and ``dO_i V_j^T - D_i``
as one product (``dO_i`` with a column ``-D_i``, ``V_j`` with a column of
ones). Keys and values are cast and transposed once, outside the loops. With
whole rows the backward pass forms ``dK^T = Q^T dS`` and ``dV^T = dO^T P``
(XLA on CPU multiplies by a transposed tile, ``dS^T Q``, at under half the
speed). The scores and the products with the weights run in the score dtype
(bfloat16 under ``mixed_bfloat16``, as in the direct path and its autodiff);
the softmax, ``lse`` and every sum over blocks in float32. Whole rows of
bfloat16 scores go through one native bfloat16 softmax op where that op
computes in float32 (TensorFlow's oneDNN kernel; checked in the graph, see
`native_softmax_is_float32`), at half the cost of casting the scores to
float32 and the weights back; elsewhere their scores are a float32 product.

Why our own: autodiff through the loops stores every tile's intermediates,
and TensorFlow ran the rematerialised query blocks of a backward pass side by
side, so memory grew with ``Tq * Tk`` after all (4.8 GiB at T=8192 against
0.8 GiB now); no Keras or TensorFlow op offers a tiled attention on CPU. With a
causal mask the tiles above the diagonal are skipped, not just masked.
"""

import functools
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from attention_layers import masking
from attention_layers.base import static_shape as _static


class Masks(NamedTuple):
    """The mask sources of one call, kept apart so that tiles build their own."""

    query: object  # bool [B, Tq] or None
    kv: object  # bool [B or 1, Tk] or None
    pair: object  # bool [B, Tq, Tk] or None
    causal_offset: object  # None, or int / scalar tensor: query i sits at offset + i


def combine(masks, q_pos, k_pos, query=None, kv=None, pair=None):
    """``[B or 1, tq, tk]`` boolean mask of one tile, or ``None`` (no mask).

    ``q_pos`` / ``k_pos`` are the tile's query and key indices; ``query``,
    ``kv``, ``pair`` the tile's slices of the mask sources.
    """
    mask = None

    def _and(a, b):
        return b if a is None else ops.logical_and(a, b)

    if query is not None:
        mask = _and(mask, ops.expand_dims(query, -1))
    if kv is not None:
        mask = _and(mask, ops.expand_dims(kv, -2))
    if pair is not None:
        mask = _and(mask, pair)
    if masks.causal_offset is not None:
        row = ops.expand_dims(q_pos + masks.causal_offset, 1)
        mask = _and(mask, ops.expand_dims(row >= ops.expand_dims(k_pos, 0), 0))
    return mask


def length(x, axis=1):
    """The static length of ``axis``, else its dynamic size."""
    n = _static(x.shape)[axis]
    return n if n is not None else ops.shape(x)[axis]


def pad_steps(x, pad, axis=1, value=0):
    """Pad ``x`` with ``pad`` (int or scalar tensor) entries at the end of ``axis``."""
    if isinstance(pad, int) and pad == 0:
        return x
    widths = [[0, 0] for _ in x.shape]
    widths[axis] = [0, pad]
    return ops.pad(x, widths, constant_values=value)


# Scores for `native_softmax_is_float32`: a row where a running sum kept in
# a 16-bit float stalls (one score of 0, 1023 of -5: the true largest weight
# is 0.1267, a bfloat16 sum gives 0.125), and rows of spread scores whose
# weights change when the exponentials are rounded to 16 bits.
_PROBE = np.concatenate(
    [[[0.0] + [-5.0] * 1023], 3 * np.random.RandomState(0).normal(size=(16, 1024))]
).astype("float32")


def native_softmax_is_float32(dtype, zero, softmax=ops.softmax):
    """Scalar bool tensor: does ``ops.softmax`` of ``dtype`` scores give, bit
    for bit, the float32 softmax rounded to ``dtype``, where it runs?

    TensorFlow's oneDNN softmax kernel for bfloat16 (x86 CPUs) converts
    to float32 inside: its weights equal those of casting the scores to
    float32, a float32 softmax and a cast back, in half the time. Other
    kernels do not: XLA rounds the exponentials to bfloat16, and
    TensorFlow's Eigen kernel (oneDNN off) also sums in bfloat16 (measured:
    the row of -5s gives 0.125). The check runs in the caller's graph, so it
    meets the kernel the caller's softmax will get; ``zero`` is a zero
    computed from the call's inputs, so that no graph optimiser evaluates the
    check ahead of time with another kernel (TensorFlow's constant folding
    did, with the Eigen one). NaN or inf inputs make it ``False``.
    ``softmax(x, axis)`` is the kernel to check (tests pass stand-ins).

    >>> bool(native_softmax_is_float32("float32", 0.0))
    True
    """
    probe = ops.cast(ops.convert_to_tensor(_PROBE) + zero, dtype)
    exact = ops.cast(ops.softmax(ops.cast(probe, "float32"), axis=-1), dtype)
    return ops.all(ops.equal(softmax(probe, axis=-1), exact))


def both_ways(flag, build):
    """``build(False)``, or where ``flag`` is a scalar bool tensor, whichever
    of ``build(True)`` and ``build(False)`` it picks."""
    if flag is None:
        return build(False)
    return ops.cond(flag, lambda: build(True), lambda: build(False))


# Without a causal mask, a query block takes all the keys at once (one
# softmax per row, no running log-sum-exp) while its rows hold at most this
# many scores per (batch, head): 4096 keys with blocks of 256 queries.
WHOLE_ROW_ELEMENTS = 2**20


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
    >>> q = np.random.default_rng(0).normal(size=(1, 5, 2, 4)).astype("float32")
    >>> out = tiled_attention(q, q, q, Masks(None, None, None, 0), block_size=2)
    >>> tuple(out.shape)
    (1, 5, 2, 4)
    """
    bq = block_size
    tq, tk = length(query), length(key)
    whole_rows = (
        masks.causal_offset is None
        and isinstance(tk, int)
        and bq * tk <= WHOLE_ROW_ELEMENTS
    )
    bk = tk if whole_rows else bq
    pad_q, pad_k = (-tq) % bq, (-tk) % bk
    query = pad_steps(query, pad_q)
    key, value = pad_steps(key, pad_k), pad_steps(value, pad_k)
    kv = masks.kv
    if kv is not None:
        kv = pad_steps(masking.as_bool(kv), pad_k, value=False)
    if not (isinstance(pad_k, int) and pad_k == 0):
        valid = ops.expand_dims(ops.arange(tk + pad_k) < tk, 0)  # [1, Tk_pad]
        kv = valid if kv is None else ops.logical_and(kv, valid)
    query_mask, pair = masks.query, masks.pair
    if query_mask is not None:
        query_mask = pad_steps(query_mask, pad_q, value=False)
    if pair is not None:
        pair = pad_steps(pad_steps(pair, pad_q, value=False), pad_k, 2, False)

    batch = ops.shape(key)[0]
    heads = _static(key.shape)[2]

    nq, nk = (tq + pad_q) // bq, (tk + pad_k) // bk  # static where the lengths are

    def blocks(x, n, size):  # [B, n * size, H, D] -> [B, n, H, size, D]
        x = ops.reshape(x, (batch, n, size, heads, _static(x.shape)[3]))
        return ops.transpose(x, (0, 1, 3, 2, 4))

    qb = blocks(query, nq, bq)
    kb, vb = blocks(key, nk, bk), blocks(value, nk, bk)
    if kv is not None:
        kv = ops.reshape(kv, (ops.shape(kv)[0], nk, bk))  # [B or 1, nk, bk]
    if query_mask is not None:
        query_mask = ops.reshape(query_mask, (batch, nq, bq))
    if pair is not None:
        pair = ops.reshape(pair, (batch, nq, bq, nk, bk))
    offset = masks.causal_offset
    if offset is not None:
        offset = ops.convert_to_tensor(offset, "int32")
    q_steps, k_steps = ops.arange(bq, dtype="int32"), ops.arange(bk, dtype="int32")

    def tile_mask(i, j):
        """``[B or 1, 1, bq, bk]`` mask of tile (i, j), or ``None``."""
        mask = combine(
            masks._replace(causal_offset=offset),
            i * bq + q_steps,
            j * bk + k_steps,
            query=None if query_mask is None else ops.take(query_mask, i, axis=1),
            kv=None if kv is None else ops.take(kv, j, axis=1),
            pair=None
            if pair is None
            else ops.take(ops.take(pair, i, axis=1), j, axis=2),
        )
        return None if mask is None else ops.expand_dims(mask, 1)

    # With a causal mask, query block i sees key blocks [0, last_key(i)).
    def last_key(i):
        if offset is None:
            return nk
        return ops.clip((i * bq + bq - 1 + offset) // bk + 1, 0, nk)

    def scores(qi, kt_j, i, j, dtype="float32"):
        """Tile (i, j)'s scores in ``dtype``, masked, and its mask (``kt_j``: K_j^T).

        Float32 scores of whole rows are a float32 product of the (bfloat16)
        operands: XLA then writes the scores once instead of in bfloat16 and
        again converted (mixed_bfloat16 forward + backward with XLA, T=2048:
        3065 -> 2614 ms), and they are not rounded to bfloat16 on the way.
        """
        if whole_rows and dtype == "float32":
            s = ops.matmul(ops.cast(qi, dtype), ops.cast(kt_j, dtype))
        else:
            s = ops.cast(ops.matmul(qi, kt_j), dtype)
        mask = tile_mask(i, j)
        if mask is not None:
            s = ops.where(mask, s, masking.MASK_FILL)
        return s, mask

    def tile_softmax(qi, kt_j, i, j, native=False):
        """Tile (i, j)'s softmax over its own keys and each row's log-sum-exp.

        One softmax op writes the weights (where ``exp(s - m)`` and its
        normalisation would write three tile-sized tensors; on CPU without
        XLA, writes are what a tile costs). Masked scores are ``MASK_FILL``:
        their weights underflow to exactly 0 next to any real key. With whole
        rows the log-sum-exp is not needed: ``lse`` is then 0 where the row
        saw a real key and -inf where not. Otherwise it comes from two
        reductions that only read: the largest weight sits at the largest
        score, ``p_max = exp(m - lse)``, so ``lse = m - log p_max`` (``p_max
        >= 1 / bk``: no underflow), and a row with no real key in the tile
        gets ``lse ~ MASK_FILL``, which weighs nothing against a real tile.

        ``native`` (whole rows of bfloat16 scores only) is for where
        `native_softmax_is_float32` holds: the scores are then a bfloat16
        product, as in the direct path, and their weights come, in
        bfloat16, from one softmax op that computes in float32 inside
        (bfloat16 has float32's range, so ``MASK_FILL`` is as safe in it).
        """
        if native:
            s, mask = scores(qi, kt_j, i, j, qi.dtype)
            p = ops.softmax(s, axis=-1)
        else:
            s, mask = scores(qi, kt_j, i, j)
            # One key: the weight is 1 (keras warns about a softmax over size 1).
            p = ops.ones_like(s) if bk == 1 else ops.softmax(s, axis=-1)
        if not whole_rows:
            return p, ops.max(s, axis=-1) - ops.log(ops.max(p, axis=-1))
        if mask is None:
            return p, ops.zeros_like(p[..., 0], "float32")
        real = ops.broadcast_to(ops.any(mask, axis=-1), ops.shape(p)[:-1])
        return p, ops.where(real, 0.0, -float("inf"))

    def seen(lse):
        """Rows that saw a real key (``lse`` is ~``MASK_FILL`` or -inf if not)."""
        return lse > masking.MASK_FILL / 2

    def put(buffer, i, block):
        """``buffer[:, i] = block`` for a ``[B, n, ...]`` buffer."""
        zero = ops.zeros((), "int32")
        start = [zero, i] + [zero] * (len(buffer.shape) - 2)
        return ops.slice_update(buffer, start, ops.expand_dims(block, 1))

    def key_blocks(*xs):
        """Each of ``xs`` ``[B, nk, ...]`` with key blocks leading, or with
        whole rows the one block, taken here once rather than in the loops
        (TensorFlow without XLA would copy it for every query block)."""
        if whole_rows:
            return tuple(x[:, 0] for x in xs)
        return tuple(ops.moveaxis(x, 1, 0) for x in xs)

    def key_block(xs, j):
        """Key block ``j`` of each of ``xs`` from `key_blocks`."""
        return xs if whole_rows else tuple(ops.take(x, j, axis=0) for x in xs)

    @ops.custom_gradient
    def attend(qb, kb, vb):
        # Forward: query blocks in sequence, key blocks with an online softmax.
        dv = _static(vb.shape)[-1]
        # The products run in the score dtype (bfloat16 under mixed_bfloat16,
        # as in the direct path and its autodiff); the softmax, lse and the
        # sums over blocks in float32.
        cd = qb.dtype
        # Whole rows of bfloat16 scores on TensorFlow: a native bfloat16
        # softmax where it computes in float32, checked in this graph; the
        # loops are built both ways and the check picks one (a choice per
        # tile cost XLA 3%). On JAX it never holds: XLA rounds the
        # exponentials, and checking would only compile both.
        native_check = None
        if (
            whole_rows
            and bk > 1
            and keras.backend.standardize_dtype(cd) == "bfloat16"
            and keras.backend.backend() == "tensorflow"
        ):
            first = ops.cast(ops.sum(qb[:1, :1, :1, :1, :1]), "float32")
            zero = ops.minimum(ops.abs(first), 0.0)
            native_check = native_softmax_is_float32(cd, zero)
        # K^T and V, once for all the tiles.
        kt = ops.swapaxes(ops.cast(kb, cd), -1, -2)  # [B, nk, H, D, bk]
        fwd_keys = key_blocks(kt, ops.cast(vb, cd))

        def context(p, v):
            """``P V`` in the score dtype, as float32."""
            return ops.cast(ops.matmul(ops.cast(p, cd), v), "float32")

        rows = ops.zeros_like(qb[:, 0, ..., 0], "float32")  # [B, H, bq]

        # keras' scan on TensorFlow wants outputs shaped like the carry: the
        # carry is an unused pair shaped like one block's outputs.
        def query_block(unused, i, native=False):
            qi = ops.take(qb, i, axis=1)

            # The running output is normalised over the keys seen so far;
            # each tile's share is rescaled by the log-sum-exps.
            def key_tile(j, acc_state):
                lse, acc = acc_state
                kt_j, vj = key_block(fwd_keys, j)
                p, lse_j = tile_softmax(qi, kt_j, i, j)
                new = ops.logaddexp(lse, lse_j)
                acc = ops.expand_dims(ops.exp(lse - new), -1) * acc + ops.expand_dims(
                    ops.exp(lse_j - new), -1
                ) * context(p, vj)
                return new, acc

            if whole_rows:  # one key block: its softmax is the answer
                kt_0, v0 = fwd_keys
                p, lse_i = tile_softmax(qi, kt_0, i, 0, native)
                acc = context(p, v0)
            else:
                start = (rows - float("inf"), unused[0])
                lse_i, acc = ops.fori_loop(0, last_key(i), key_tile, start)
            out_i = ops.where(ops.expand_dims(seen(lse_i), -1), acc, 0.0)
            return unused, (out_i, lse_i)

        block = ops.zeros_like(qb[:, 0, ..., :1], "float32") * ops.zeros((dv,))

        def forward(native):
            body = functools.partial(query_block, native=native)
            return ops.scan(body, (block, rows), ops.arange(nq, dtype="int32"))[1]

        out, lse = both_ways(native_check, forward)
        out, lse = ops.moveaxis(out, 0, 1), ops.moveaxis(lse, 0, 1)

        def grad(*args, upstream=None):
            d_out = ops.cast(args[0] if upstream is None else upstream, "float32")
            delta = ops.sum(d_out * out, axis=-1)  # [B, nq, H, bq]
            # V gets a column of ones, so that one product gives dO V^T - D
            # (dO gets the column -D): one tile-sized write less per tile.
            v_ones = ops.concatenate(
                [ops.cast(vb, cd), ops.ones_like(vb[..., :1], cd)], -1
            )
            # K^T and (V | 1)^T per key block.
            tiles = (
                0 if whole_rows else ops.arange(nk, dtype="int32"),
                *key_blocks(kt, ops.swapaxes(v_ones, -1, -2)),
            )
            # K for dQ: whole rows take it once; a square tile transposes its
            # K^T (a third tensor scanned over is copied by each of the query
            # blocks TensorFlow runs at once: +150-250 MiB at T=8192).
            k_rows = ops.cast(kb[:, 0], cd) if whole_rows else None

            def query_block(i, state, native=False):
                # dk, dv: [nk, B, H, bk, D], key blocks leading; with whole
                # rows [B, H, D, Tk], transposed (see the end of `tile`).
                dq, dk, dv = state
                qi = ops.take(qb, i, axis=1)
                do_i, lse_i = ops.take(d_out, i, axis=1), ops.take(lse, i, axis=1)
                seen_i = seen(lse_i)
                delta_i = ops.expand_dims(ops.take(delta, i, axis=1), -1)
                last = last_key(i)

                # keras' scan on TensorFlow wants outputs shaped like the
                # carry: dQ_i rides along with an unused V-shaped slot.
                # The weights are P = w * p, p the tile's own softmax and w
                # = exp(lse_ij - lse_i) per row: w scales the small dO_i and
                # D_i instead of the tile.
                def tile(acc, x):
                    dq_i, unused = acc
                    j, kt_j, vt_ones = x
                    kj = k_rows if whole_rows else ops.swapaxes(kt_j, -1, -2)
                    p, lse_ij = tile_softmax(qi, kt_j, i, j, native)
                    w = ops.where(seen_i, ops.exp(lse_ij - lse_i), 0.0)[..., None]
                    w_do = w * do_i
                    do_delta = ops.cast(ops.concatenate([w_do, -w * delta_i], -1), cd)
                    w_do = ops.cast(w_do, cd)
                    p = ops.cast(p, cd)
                    ds = p * ops.matmul(do_delta, vt_ones)
                    dq_ij = ops.matmul(ds, kj)
                    # One key block: dQ_i is this product, kept in the
                    # gradient's dtype; otherwise a float32 sum over blocks.
                    dq_i = dq_ij if whole_rows else dq_i + ops.cast(dq_ij, "float32")
                    if whole_rows:
                        # dK^T = Q^T dS, dV^T = dO^T P: XLA on CPU multiplies
                        # by a transposed tile (dS^T Q) at under half the
                        # speed of these; without XLA they cost the same.
                        # (Square tiles keep dK, dV: keras' scan wants the
                        # outputs shaped like its [bq, D] carry.)
                        dk_ij = ops.matmul(ops.swapaxes(qi, -1, -2), ds)
                        dv_ij = ops.matmul(ops.swapaxes(w_do, -1, -2), p)
                    else:
                        dk_ij = ops.matmul(ops.swapaxes(ds, -1, -2), qi)
                        dv_ij = ops.matmul(ops.swapaxes(p, -1, -2), w_do)
                    return (dq_i, unused), (
                        ops.cast(dk_ij, "float32"),
                        ops.cast(dv_ij, "float32"),
                    )

                def causal_tile(acc, x):  # tiles above the diagonal: skipped
                    return ops.cond(
                        x[0] < last,
                        lambda: tile(acc, x),
                        lambda: (acc, (ops.zeros_like(acc[0]), ops.zeros_like(acc[1]))),
                    )

                zeros = (ops.zeros_like(qi, "float32"), ops.zeros_like(do_i))
                if whole_rows:  # one key block, [bk] keys unlike the carry's [bq]
                    (dq_i, _), (dk_i, dv_i) = tile(zeros, tiles)
                else:
                    body = tile if offset is None else causal_tile
                    (dq_i, _), (dk_i, dv_i) = ops.scan(body, zeros, tiles)
                return put(dq, i, ops.cast(dq_i, dq.dtype)), dk + dk_i, dv + dv_i

            dk, dv = key_blocks(*(ops.zeros_like(x, "float32") for x in (kb, vb)))
            if whole_rows:  # dK^T, dV^T: [B, H, D, Tk]
                dk, dv = ops.swapaxes(dk, -1, -2), ops.swapaxes(dv, -1, -2)
            # dQ in the gradient's dtype: each block's rows are put once.
            start = (ops.zeros_like(qb), dk, dv)

            def backward(native):
                body = functools.partial(query_block, native=native)
                return ops.fori_loop(0, nq, body, start)

            dq, dk, dv = both_ways(native_check, backward)
            if whole_rows:  # [B, H, D, Tk] -> [B, 1, H, Tk, D]
                dk, dv = (ops.expand_dims(ops.swapaxes(x, -1, -2), 1) for x in (dk, dv))
            else:
                dk, dv = ops.moveaxis(dk, 0, 1), ops.moveaxis(dv, 0, 1)
            return (
                ops.cast(dq, qb.dtype),
                ops.cast(dk, kb.dtype),
                ops.cast(dv, vb.dtype),
            )

        return out, grad

    out = ops.transpose(attend(qb, kb, vb), (0, 1, 3, 2, 4))  # [B, nq, bq, H, Dv]
    out = ops.reshape(out, (batch, nq * bq, heads, _static(vb.shape)[-1]))
    return out[:, :tq]
