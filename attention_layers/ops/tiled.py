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

The module reads top-down: the block layout (padding, blocks, masks in
blocks), one tile (mask, scores, softmax), the runtime softmax probe, the
forward pass over query blocks, the backward pass over query blocks, and the
custom-gradient glue that joins them under `tiled_attention`.
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
    pair: object  # bool [B, Tq, Tk] (or [B, H, Tq, Tk] off this path) or None
    causal_offset: object  # None, or int / scalar tensor: query i sits at offset + i
    window: object = None  # None, or w: query i sees keys |offset + i - j| < w
    window_offset: object = 0  # where the queries sit for the window


def combine(masks, q_pos, k_pos, query=None, kv=None, pair=None):
    """``[B or 1, tq, tk]`` boolean mask of one tile, or ``None`` (no mask).

    ``q_pos`` / ``k_pos`` are the tile's query and key indices; ``query``,
    ``kv``, ``pair`` the tile's slices of the mask sources.
    """
    mask = None
    if query is not None:
        mask = masking.and_masks(mask, ops.expand_dims(query, -1))
    if kv is not None:
        mask = masking.and_masks(mask, ops.expand_dims(kv, -2))
    if pair is not None:
        mask = masking.and_masks(mask, pair)
    if masks.causal_offset is not None:
        row = ops.expand_dims(q_pos + masks.causal_offset, 1)
        causal = ops.expand_dims(row >= ops.expand_dims(k_pos, 0), 0)
        mask = masking.and_masks(mask, causal)
    if masks.window is not None:
        row = ops.expand_dims(q_pos + masks.window_offset, 1)
        band = ops.abs(row - ops.expand_dims(k_pos, 0)) < masks.window
        mask = masking.and_masks(mask, ops.expand_dims(band, 0))
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
    float32, a float32 softmax and a cast back, at a lower cost. Other
    kernels do not: XLA rounds the exponentials to bfloat16, and
    TensorFlow's Eigen kernel (oneDNN off) also sums in bfloat16. The check
    runs in the caller's graph, so it meets the kernel the caller's softmax
    will get; ``zero`` is a zero computed from the call's inputs, so that no
    graph optimiser (TensorFlow's constant folding) evaluates the check ahead
    of time with another kernel. NaN or inf inputs make it ``False``.
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


# -- block layout ----------------------------------------------------------------------
# Without a causal mask, a query block takes all the keys at once (one
# softmax per row, no running log-sum-exp) while its rows hold at most this
# many scores per (batch, head): 4096 keys with blocks of 256 queries.
WHOLE_ROW_ELEMENTS = 2**20


class Layout(NamedTuple):
    """How one call is cut into tiles: ``nq`` query blocks of ``bq`` rows times
    ``nk`` key blocks of ``bk`` columns (ints where the lengths are static)."""

    bq: int
    bk: object  # bq, or every key (whole rows)
    nq: object
    nk: object
    pad_q: object  # padding that makes Tq a multiple of bq
    pad_k: object  # and Tk a multiple of bk
    whole_rows: bool  # one key block of all Tk keys, one softmax per row
    tq: object
    tk: object
    batch: object
    heads: int
    # The mask sources in blocks (`block_masks`): query [B, nq, bq], kv
    # [B or 1, nk, bk], pair [B, nq, bq, nk, bk], causal_offset an int32 tensor.
    masks: Masks = Masks(None, None, None, None)
    q_steps: object = None  # arange(bq): row indices within a block
    k_steps: object = None  # arange(bk)


def block_layout(query, key, masks, block_size):
    """The `Layout` of a call, its mask sources in blocks (`block_masks`).

    Whole rows where the mask is not causal, ``Tk`` is static and a block's
    ``block_size * Tk`` scores are at most `WHOLE_ROW_ELEMENTS`; square tiles
    of ``block_size`` otherwise.
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
    layout = Layout(
        bq=bq,
        bk=bk,
        nq=(tq + pad_q) // bq,  # static where the lengths are
        nk=(tk + pad_k) // bk,
        pad_q=pad_q,
        pad_k=pad_k,
        whole_rows=whole_rows,
        tq=tq,
        tk=tk,
        batch=ops.shape(key)[0],
        heads=_static(key.shape)[2],
    )
    return block_masks(masks, layout)


def to_blocks(x, layout, n, size, pad):
    """``[B, T, H, D]`` padded by ``pad`` steps -> ``[B, n, H, size, D]``."""
    x = pad_steps(x, pad)
    x = ops.reshape(x, (layout.batch, n, size, layout.heads, _static(x.shape)[3]))
    return ops.transpose(x, (0, 1, 3, 2, 4))


def from_blocks(out, layout):
    """``[B, nq, H, bq, Dv]`` -> ``[B, Tq, H, Dv]``, the padded rows dropped."""
    out = ops.transpose(out, (0, 1, 3, 2, 4))  # [B, nq, bq, H, Dv]
    out = ops.reshape(
        out, (layout.batch, layout.nq * layout.bq, layout.heads, _static(out.shape)[-1])
    )
    return out[:, : layout.tq]


def block_masks(masks, layout):
    """``layout`` with ``masks`` padded and cut into blocks, and the step
    indices of a block. Padded query rows are masked out, padded keys hidden
    from every row.
    """
    pad_q, pad_k, tk = layout.pad_q, layout.pad_k, layout.tk
    kv = masks.kv
    if kv is not None:
        kv = pad_steps(masking.as_bool(kv), pad_k, value=False)
    if not (isinstance(pad_k, int) and pad_k == 0):
        valid = ops.expand_dims(ops.arange(tk + pad_k) < tk, 0)  # [1, Tk_pad]
        kv = masking.and_masks(kv, valid)
    query_mask, pair = masks.query, masks.pair
    if query_mask is not None:
        query_mask = pad_steps(query_mask, pad_q, value=False)
    if pair is not None:
        pair = pad_steps(pad_steps(pair, pad_q, value=False), pad_k, 2, False)
    batch, nq, nk, bq, bk = layout.batch, layout.nq, layout.nk, layout.bq, layout.bk
    if kv is not None:
        kv = ops.reshape(kv, (ops.shape(kv)[0], nk, bk))
    if query_mask is not None:
        query_mask = ops.reshape(query_mask, (batch, nq, bq))
    if pair is not None:
        pair = ops.reshape(pair, (batch, nq, bq, nk, bk))
    offset = masks.causal_offset
    if offset is not None:
        offset = ops.convert_to_tensor(offset, "int32")
    window_offset = ops.convert_to_tensor(masks.window_offset, "int32")
    return layout._replace(
        masks=Masks(query_mask, kv, pair, offset, masks.window, window_offset),
        q_steps=ops.arange(bq, dtype="int32"),
        k_steps=ops.arange(bk, dtype="int32"),
    )


def last_key(layout, i):
    """End of query block ``i``'s key blocks: with a causal mask it sees key
    blocks ``[0, last_key)``, the tiles above the diagonal skipped."""
    offset = layout.masks.causal_offset
    if offset is None:
        return layout.nk
    bq, bk = layout.bq, layout.bk
    return ops.clip((i * bq + bq - 1 + offset) // bk + 1, 0, layout.nk)


def key_blocks(layout, *xs):
    """Each of ``xs`` ``[B, nk, ...]`` with key blocks leading, or with
    whole rows the one block, taken here once rather than in the loops
    (TensorFlow without XLA would copy it for every query block)."""
    if layout.whole_rows:
        return tuple(x[:, 0] for x in xs)
    return tuple(ops.moveaxis(x, 1, 0) for x in xs)


def key_block(layout, xs, j):
    """Key block ``j`` of each of ``xs`` from `key_blocks`."""
    return xs if layout.whole_rows else tuple(ops.take(x, j, axis=0) for x in xs)


def put(buffer, i, block):
    """``buffer[:, i] = block`` for a ``[B, n, ...]`` buffer."""
    zero = ops.zeros((), "int32")
    start = [zero, i] + [zero] * (len(buffer.shape) - 2)
    return ops.slice_update(buffer, start, ops.expand_dims(block, 1))


# -- one tile ------------------------------------------------------------------------
def tile_mask(layout, i, j):
    """``[B or 1, 1, bq, bk]`` mask of tile (i, j), or ``None``."""
    masks = layout.masks
    query, kv, pair = masks.query, masks.kv, masks.pair
    mask = combine(
        masks,
        i * layout.bq + layout.q_steps,
        j * layout.bk + layout.k_steps,
        query=None if query is None else ops.take(query, i, axis=1),
        kv=None if kv is None else ops.take(kv, j, axis=1),
        pair=None if pair is None else ops.take(ops.take(pair, i, axis=1), j, axis=2),
    )
    return None if mask is None else ops.expand_dims(mask, 1)


def tile_scores(layout, qi, kt_j, i, j, dtype="float32"):
    """Tile (i, j)'s scores ``S_ij = Q_i K_j^T`` in ``dtype``, masked, and its
    mask (``kt_j``: K_j^T).

    Float32 scores of whole rows are a float32 product of the (bfloat16)
    operands: XLA then writes the scores once instead of in bfloat16 and
    again converted, and they are not rounded to bfloat16 on the way.
    """
    if layout.whole_rows and dtype == "float32":
        s = ops.matmul(ops.cast(qi, dtype), ops.cast(kt_j, dtype))
    else:
        s = ops.cast(ops.matmul(qi, kt_j), dtype)
    mask = tile_mask(layout, i, j)
    if mask is not None:
        s = ops.where(mask, s, masking.MASK_FILL)
    return s, mask


def tile_softmax(layout, qi, kt_j, i, j, native=False):
    """Tile (i, j)'s softmax ``p_ij`` over its own keys and each row's
    log-sum-exp ``lse_ij`` of its scores.

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
        s, mask = tile_scores(layout, qi, kt_j, i, j, qi.dtype)
        p = ops.softmax(s, axis=-1)
    else:
        s, mask = tile_scores(layout, qi, kt_j, i, j)
        # One key: the weight is 1 (keras warns about a softmax over size 1).
        p = ops.ones_like(s) if layout.bk == 1 else ops.softmax(s, axis=-1)
    if not layout.whole_rows:
        return p, ops.max(s, axis=-1) - ops.log(ops.max(p, axis=-1))
    if mask is None:
        return p, ops.zeros_like(p[..., 0], "float32")
    real = ops.broadcast_to(ops.any(mask, axis=-1), ops.shape(p)[:-1])
    return p, ops.where(real, 0.0, -float("inf"))


def seen(lse):
    """Rows that saw a real key (``lse`` is ~``MASK_FILL`` or -inf if not)."""
    return lse > masking.MASK_FILL / 2


def context(p, v):
    """``P V`` in the score dtype (``v``'s), as float32."""
    return ops.cast(ops.matmul(ops.cast(p, v.dtype), v), "float32")


# -- the softmax probe -----------------------------------------------------------------
def probe_native_softmax(layout, qb):
    """The runtime probe: a scalar bool tensor saying whether this graph's
    native bfloat16 softmax computes in float32, or ``None`` where it is
    not asked (the float32 route is then taken).

    Why: whole rows of bfloat16 scores go through one native bfloat16
    softmax op, cheaper than casting the scores to float32 and the
    weights back, but only where that op's weights are the float32 ones
    (TensorFlow's oneDNN kernel; not its Eigen kernel, not XLA). Which
    kernel runs is known only in the graph that runs, so the check
    (`native_softmax_is_float32`) runs there, once per call, on a zero
    computed from ``qb`` (no graph optimiser may fold it ahead of time), and
    `forward` and `backward` build their loops both ways for it to pick
    from (`both_ways`; a choice per tile slows XLA down). Asked only for whole
    rows of more than one key in bfloat16 on TensorFlow: on JAX it never
    holds (XLA rounds the exponentials), and checking would only compile
    both.
    """
    if not (
        layout.whole_rows
        and layout.bk > 1
        and keras.backend.standardize_dtype(qb.dtype) == "bfloat16"
        and keras.backend.backend() == "tensorflow"
    ):
        return None
    first = ops.cast(ops.sum(qb[:1, :1, :1, :1, :1]), "float32")
    zero = ops.minimum(ops.abs(first), 0.0)
    return native_softmax_is_float32(qb.dtype, zero)


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
