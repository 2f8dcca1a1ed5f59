"""The tiled path's pieces: the block layout (padding, blocks, masks in
blocks), one tile (mask, scores, softmax) and the runtime softmax probe.

`tiled` runs its forward and backward passes over these; the reasons for
each choice are in its docstring and in docs/benchmark_notes.md.
"""

from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from attention_layers import masking
from attention_layers.base import static_shape as _static
from attention_layers.ops.masks import Masks, combine, length


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
