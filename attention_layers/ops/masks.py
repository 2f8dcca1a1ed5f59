"""The mask sources of one attention call, and the masks built from them.

Kept apart (`Masks`) so that each kernel builds only the mask it needs: a
tile its own (`combine`), the direct and fused paths the whole one
(`dense_mask`).
"""

from typing import NamedTuple

from keras import ops

from attention_layers import masking
from attention_layers.base import static_shape as _static


class Masks(NamedTuple):
    """The mask sources of one call, kept apart so that tiles build their own."""

    query: object  # bool [B, Tq] or None
    kv: object  # bool [B or 1, Tk] or None
    pair: object  # bool [B, Tq, Tk] or None ([B, H, Tq, Tk] per head: not tiled)
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


def dense_mask(q, k, masks):
    """The whole boolean mask ``[B, 1 or H, Tq, Tk]`` of projected ``q``
    ``[B, Tq, H, D]`` and ``k``, or ``None``."""
    tq, tk = length(q), length(k)
    mask = combine(
        masks, ops.arange(tq), ops.arange(tk), query=masks.query, kv=masks.kv
    )
    pair = masks.pair
    if pair is not None:
        pair = pair if len(pair.shape) == 4 else ops.expand_dims(pair, 1)
    if mask is not None:
        mask = ops.expand_dims(mask, 1)
    mask = masking.and_masks(mask, pair)
    if mask is None:
        return None
    shape = _static(mask.shape)
    heads = _static(q.shape)[2] if shape[1] not in (None, 1) else 1
    return ops.broadcast_to(mask, (ops.shape(q)[0], heads, tq, tk))
