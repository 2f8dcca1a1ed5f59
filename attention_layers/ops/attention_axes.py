"""Attention over chosen axes of higher-rank inputs (``attention_axes``), as
``keras.layers.MultiHeadAttention`` takes them, mapped onto rank-3 attention.

A query ``[B, d_1, ..., d_n, dim]`` attends over its ``attention_axes``;
its other axes act as more batch axes. Projections act on the last axis
only, so moving the batch-like axes next to the batch, the attention axes
after them, and flattening each group gives a rank-3 attention
``[B', T', dim]`` with the same weights; its output and its scores are then
put back in Keras' layout (scores ``[B, <other axes>, H, <query attention
axes>, <key attention axes>]``).
"""

import math
from typing import NamedTuple

from keras import ops

from attention_layers.base import static_shape


class AxesLayout(NamedTuple):
    """How a rank-``rank`` input maps onto rank-3 attention."""

    rank: int  # the query's rank, batch and feature axes included
    attention: tuple  # its attention axes, non-negative, in the given order
    batch: tuple  # its other non-feature axes, the batch first

    @property
    def perm(self):
        """Batch-like axes, attention axes, then the feature axis."""
        return self.batch + self.attention + (self.rank - 1,)


def resolve_axes(attention_axes, rank):
    """``attention_axes`` for a rank-``rank`` input as non-negative axes:
    ``None`` means every axis but the batch and the feature axes; a negative
    axis counts from the end (``-2`` is the last one before the features).

    >>> resolve_axes(None, 5), resolve_axes((-2,), 4)
    ((1, 2, 3), (2,))
    """
    if attention_axes is None:
        return tuple(range(1, rank - 1))
    return tuple(a if a >= 0 else rank + a for a in attention_axes)


def layout(attention_axes, rank):
    """The `AxesLayout` of a rank-``rank`` input, or ``None`` where the input
    is rank 3 attending over its one sequence axis (no mapping needed)."""
    axes = resolve_axes(attention_axes, rank)
    if rank == 3 and axes == (1,):
        return None
    batch = tuple(a for a in range(rank - 1) if a not in axes)
    return AxesLayout(rank, axes, batch)


def _sizes(x, axes):
    return [ops.shape(x)[a] for a in axes]


def _product(sizes):
    known = [s for s in sizes if isinstance(s, int)]
    if len(known) == len(sizes):
        return math.prod(sizes)
    out = sizes[0]
    for s in sizes[1:]:
        out = out * s
    return out


def flatten(x, layout, feature=True):
    """``x`` ``[B, d_1, ..., d_n(, dim)]`` as ``[B', T'(, dim)]``.

    ``feature=False`` for a mask: ``x`` then lacks the feature axis.
    """
    perm = layout.perm if feature else layout.perm[:-1]
    x = ops.transpose(x, perm)
    shape = [_product(_sizes(x, range(len(layout.batch))))]
    shape.append(_product(_sizes(x, range(len(layout.batch), len(perm) - feature))))
    if feature:
        shape.append(static_shape(x.shape)[-1] or ops.shape(x)[-1])
    return ops.reshape(x, shape)


def unflatten_output(output, layout, query):
    """``[B', T', *out]`` back to the query's axes: ``[B, d_1, ..., *out]``."""
    sizes = _sizes(query, layout.batch + layout.attention)
    out_dims = list(output.shape[2:])
    output = ops.reshape(output, sizes + out_dims)
    order = layout.batch + layout.attention
    inverse = [order.index(a) for a in range(layout.rank - 1)]
    return ops.transpose(
        output, inverse + [len(order) + i for i in range(len(out_dims))]
    )


def unflatten_scores(scores, layout, query, key):
    """``[B', H, T', S']`` as ``[B, <batch-like axes>, H, <query attention
    axes>, <key attention axes>]`` (Keras' layout)."""
    heads = static_shape(scores.shape)[1]
    shape = _sizes(query, layout.batch) + [heads]
    shape += _sizes(query, layout.attention) + _sizes(key, layout.attention)
    return ops.reshape(scores, shape)


def flatten_attention_mask(mask, layout, query, key, heads):
    """An ``attention_mask`` in Keras' layout (broadcastable to the scores
    ``[B, <batch-like axes>, H, <query attention axes>, <key attention
    axes>]``, size-1 axes inserted before the attention axes as Keras does)
    as ``[B', T', S']``, or ``[B', H, T', S']`` where it differs by head."""
    n = len(layout.attention)
    rank = len(layout.batch) + 1 + 2 * n
    mask = ops.convert_to_tensor(mask)
    while len(mask.shape) < rank:
        mask = ops.expand_dims(mask, -2 * n - 1)
    per_head = static_shape(mask.shape)[len(layout.batch)] not in (1, None)
    shape = _sizes(query, layout.batch) + [heads if per_head else 1]
    shape += _sizes(query, layout.attention) + _sizes(key, layout.attention)
    mask = ops.broadcast_to(mask, shape)
    flat = [_product(shape[: len(layout.batch)]), shape[len(layout.batch)]]
    flat += [_product(shape[-2 * n : -n]), _product(shape[-n:])]
    mask = ops.reshape(mask, flat)
    return mask if per_head else mask[:, 0]
