"""Mask merging and the masked softmax shared by every attention layer.

The mask contract (see docs/masking.md):

* ``True`` (or non-zero) means "may attend", ``False`` means "masked out".
* Scores are masked and normalised in float32, whatever the compute dtype, so the
  fill value never overflows float16 and the softmax never loses precision.
* A row whose every position is masked gets zero weights (hence a zero context),
  never the uniform distribution and never NaN.
"""

from keras import ops

# Large enough to zero a position after ``exp``, small enough to stay finite in
# float32 arithmetic (``fill - max`` never overflows).
MASK_FILL = -1e9
# Finite "minus infinity" of masked logits and beam scores: sums, 0 * x stay finite.
NEG_INF = MASK_FILL


def as_bool(mask):
    """Return ``mask`` as a boolean tensor (``None`` stays ``None``)."""
    if mask is None:
        return None
    mask = ops.convert_to_tensor(mask)
    if mask.dtype == "bool":
        return mask
    return ops.not_equal(mask, 0)


def causal_mask(query_length, value_length):
    """Lower-triangular ``[Tq, Tv]`` mask: query ``i`` sees values ``j <= i``.

    Aligned at the first position whatever the lengths, as in Keras'
    attention layers (with ``Tq > Tv`` the last queries see every value).

    >>> import numpy as np
    >>> np.asarray(causal_mask(2, 3)).astype(int).tolist()
    [[1, 0, 0], [1, 1, 0]]
    """
    row = ops.expand_dims(ops.arange(query_length), 1)
    col = ops.expand_dims(ops.arange(value_length), 0)
    return ops.greater_equal(row, col)


def merge_masks(
    query_mask=None,
    value_mask=None,
    attention_mask=None,
    use_causal_mask=False,
    query_length=None,
    value_length=None,
):
    """Combine the mask sources into one boolean ``[B, Tq, Tv]`` mask, or ``None``.

    Args:
        query_mask: ``[B, Tq]``, positions of the query that exist.
        value_mask: ``[B, Tv]``, positions of the memory that may be attended.
        attention_mask: ``[B, Tq, Tv]``, an explicit pairwise mask.
        use_causal_mask: add the lower-triangular mask.
        query_length: ``Tq`` (needed for the causal mask and broadcasting).
        value_length: ``Tv`` (needed for the causal mask and broadcasting).

    Example:

    >>> import numpy as np
    >>> m = merge_masks(value_mask=np.array([[1, 1, 0]]), query_length=2,
    ...                 value_length=3)
    >>> np.asarray(m).astype(int).tolist()
    [[[1, 1, 0], [1, 1, 0]]]
    """
    mask = None
    if query_mask is not None:
        mask = and_masks(mask, ops.expand_dims(as_bool(query_mask), -1))
    if value_mask is not None:
        mask = and_masks(mask, ops.expand_dims(as_bool(value_mask), -2))
    if attention_mask is not None:
        mask = and_masks(mask, attention_mask)
    if use_causal_mask:
        causal = ops.expand_dims(causal_mask(query_length, value_length), 0)
        mask = and_masks(mask, causal)
    if mask is not None and value_length is not None:
        # Broadcast [B, Tq, 1] or [B, 1, Tv] pieces to the full [B, Tq, Tv].
        shape = ops.shape(mask)
        mask = ops.broadcast_to(mask, (shape[0], query_length, value_length))
    return mask


def masked_softmax(scores, mask=None, axis=-1):
    """Softmax over ``axis`` in float32, zero where ``mask`` is False.

    Fully masked rows give all-zero weights. NaN or inf in masked positions of
    ``scores`` never reach the result.

    Example:

    >>> import numpy as np
    >>> w = masked_softmax(np.zeros((1, 2, 3), "float32"),
    ...                    np.array([[[1, 1, 0], [0, 0, 0]]], bool))
    >>> np.round(np.asarray(w), 2).tolist()
    [[[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]]
    """
    scores = ops.cast(scores, "float32")
    if mask is None:
        return ops.softmax(scores, axis=axis)
    mask = as_bool(mask)
    scores = ops.where(mask, scores, MASK_FILL)
    weights = ops.softmax(scores, axis=axis)
    return ops.where(mask, weights, 0.0)


def zero_masked(x, mask):
    """Zero the time steps (axis 1) of ``x`` ``[B, T, ...]`` where ``mask``
    ``[B, T]`` (or ``[B, T, ...]``, fewer axes than ``x``) is False.

    Used on queries, keys, values and outputs so that NaN or inf stored under
    padding cannot leak through ``weights @ values`` (``0 * NaN`` is NaN):
    ``where`` selects, it does not multiply.

    >>> import numpy as np
    >>> x = np.array([[[1.0, 2.0], [np.nan, 3.0]]], "float32")
    >>> np.asarray(zero_masked(x, np.array([[True, False]]))).tolist()
    [[[1.0, 2.0], [0.0, 0.0]]]
    """
    if mask is None:
        return x
    mask = as_bool(mask)
    while len(mask.shape) < len(x.shape):
        mask = ops.expand_dims(mask, -1)
    return ops.where(mask, x, ops.zeros_like(x))


def and_masks(a, b):
    """``a AND b`` as booleans, where ``None`` means "everything may attend"."""
    if a is None:
        return as_bool(b)
    if b is None:
        return as_bool(a)
    return ops.logical_and(as_bool(a), as_bool(b))
