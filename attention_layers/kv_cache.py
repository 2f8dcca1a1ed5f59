"""The key/value cache of `MultiHeadAttention`, for incremental decoding.

A cache is one tensor ``[B, 2, S, H, key_dim]``: the projected keys at index
0, the projected values at index 1 (so it needs ``value_dim == key_dim``). A
self-attention cache gets the new tokens written at ``cache_update_index`` on
every call; a cross-attention cache holds a memory projected once
(`project_memory`) and is only read. The layer projects the new tokens;
`update` writes them; the checks take the layer for its sizes and errors.
"""

import numbers

from keras import ops

from attention_layers import masking
from attention_layers.base import check_mask_shape, input_error
from attention_layers.base import static_shape as _static
from attention_layers.ops.masks import length


def check_arguments(layer, cache, index):
    """Whether the call reads a cross-attention cache (``cache`` without an
    index); raises for an index without a cache, or rotary positions there."""
    if cache is None and index is not None:
        raise input_error(
            layer, "cache", "a cache tensor along with cache_update_index", "None"
        )
    cross = cache is not None and index is None
    if cross and layer.rotary is not None:
        raise input_error(
            layer,
            "cache_update_index",
            "an index with rotary positions (a self-attention cache; "
            "rotary positions do not apply to cross-attention)",
            "None",
        )
    return cross


def _require_cacheable(layer):
    """Raise unless ``layer`` can hold a cache: one head size, built."""
    if layer.value_dim != layer.key_dim:
        raise input_error(
            layer,
            "cache",
            f"value_dim == key_dim ({layer.key_dim}) for a KV cache",
            f"value_dim={layer.value_dim}",
        )
    if not layer.built:
        raise input_error(
            layer,
            "cache",
            "a built layer (call it once, or build it) before using a cache",
            "an unbuilt layer",
        )


def check(layer, query, value, cache, index):
    """The cache's shape and, for a self-attention cache, the index."""
    _require_cacheable(layer)
    want = (_static(query.shape)[0], 2, None, layer.num_heads, layer.key_dim)
    check_mask_shape(layer, "cache", cache, want)
    if index is not None:
        _check_index(layer, cache, value, index)


def _check_index(layer, cache, value, index):
    """The new tokens must fit: ``0 <= index`` and ``index + Tq <= S``.

    Checked when the index and the sizes are static; a tensor index past
    the end is clamped by the update (it overwrites the last slots), so
    a caller with a traced index must keep it in range.
    """
    if isinstance(index, bool) or not isinstance(index, numbers.Integral):
        return
    size, steps = _static(cache.shape)[2], _static(value.shape)[1]
    if index < 0 or (None not in (size, steps) and index + steps > size):
        if None in (size, steps):
            expected = "an index >= 0"
        else:
            expected = (
                f"an index in [0, {size - steps}] (the cache holds {size} "
                f"positions and {steps} new token(s) are written from it)"
            )
        raise input_error(layer, "cache_update_index", expected, repr(index))


def empty(layer, batch_size, max_length):
    """Zeros ``[batch_size, 2, max_length, H, key_dim]`` in the compute dtype."""
    if layer.value_dim != layer.key_dim:
        _require_cacheable(layer)
    shape = (batch_size, 2, max_length, layer.num_heads, layer.key_dim)
    return ops.zeros(shape, dtype=layer.compute_dtype)


def project_memory(layer, value, key=None):
    """A cross-attention cache of the memory ``value`` (keys: ``key``)."""
    _require_cacheable(layer)
    if layer.rotary is not None:
        raise input_error(
            layer,
            "rotary",
            "None for a cross-attention cache (rotary positions are for "
            "self-attention)",
            repr(layer.rotary),
        )
    key = value if key is None else key
    return ops.stack([layer.key_dense(key), layer.value_dense(value)], axis=1)


def new_tokens_mask(kv_mask, index, steps):
    """The slice of a cache's key mask ``[B, S]`` where ``steps`` new tokens
    go (from ``index``), or None."""
    if kv_mask is None:
        return None
    index = ops.convert_to_tensor(index, "int32")
    return ops.take(kv_mask, index + ops.arange(steps), axis=1)


def update(cache, k, v, index, kv_mask):
    """``(k, v, cache, kv_mask)`` over the whole cache.

    With an index, the new tokens' projected keys ``k`` and values ``v``
    ``[B, T, H, key_dim]`` are first written at ``[index, index + T)`` and the
    slots from ``index + T`` on (not yet written) are masked; without one
    (a cross-attention cache) ``k`` and ``v`` are unused. The keys and values
    under the mask are zeroed.
    """
    if index is not None:
        index = ops.convert_to_tensor(index, "int32")
        new = ops.cast(ops.stack([k, v], axis=1), cache.dtype)
        zero = ops.zeros((), "int32")
        cache = ops.slice_update(cache, [zero, zero, index, zero, zero], new)
        written = ops.arange(length(cache, axis=2)) < index + length(k)
        written = ops.expand_dims(written, 0)
        kv_mask = written if kv_mask is None else ops.logical_and(kv_mask, written)
    k = masking.zero_masked(cache[:, 0], kv_mask)
    v = masking.zero_masked(cache[:, 1], kv_mask)
    return k, v, cache, kv_mask
