"""Scaled dot-product attention of projected heads, by the evaluation that
suits the call: the one function the layers call (`dot_product_attention`).

Four evaluations of ``softmax(scale q k^T + mask) v`` per head:

* ``"direct"``: the scores ``[B, H, Tq, Tk]`` are materialised, masked and
  normalised in float32; the only path that returns them or applies dropout.
* ``"fused"``: ``keras.ops.dot_product_attention``, the backend's kernel.
* ``"tiled"``: query blocks times key blocks with an online softmax and a
  hand-written backward pass (`attention_layers.ops.tiled`).
* ``"pallas"``: JAX's Pallas flash-attention kernel for GPUs
  (`attention_layers.ops.pallas_attention`).

``"auto"`` picks one by backend, device (`attention_layers.ops.devices`) and
dtype (`choose`), as ``keras.ops.dot_product_attention`` picks its own
kernel. Every path has the same mask semantics: masked positions get zero
weight, and a fully masked query row gets zero weights and a zero context.
"""

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import score_dtype
from attention_layers.base import static_shape as _static
from attention_layers.ops import devices
from attention_layers.ops.masks import Masks, dense_mask, length
from attention_layers.ops.pallas_attention import pallas_attention
from attention_layers.ops.pallas_attention import supports as pallas_supports
from attention_layers.ops.tiled import tiled_attention

IMPLEMENTATIONS = ("auto", "direct", "tiled", "fused", "pallas")
# Query length times key length past which "auto" takes a linear-memory path
# (the tiled one on a CPU, Pallas' kernel on a GPU in float32): at 1024 x 1024
# the scores of a batch of 32 with 8 heads already take 1 GiB in float32.
DEFAULT_TILE_THRESHOLD = 1 << 20
# Past this many query-key pairs (8192 x 8192: 4 GiB of float32 scores for a
# batch of 2 with 8 heads) "auto" tiles on an accelerator where no fused
# kernel keeps memory linear; below it the backend's kernel is faster.
ACCELERATOR_TILE_THRESHOLD = 1 << 26
DEFAULT_BLOCK_SIZE = 256
NO_MASKS = Masks(None, None, None, None)
# Keras' own words for this refusal, which its users may already match.
FLASH_SCORES = (
    "Returning attention scores is not supported when flash attention is "
    "enabled. Please disable flash attention to access attention scores."
)


def _value_error(argument, expected, received):
    return ValueError(
        f"dot_product_attention: argument `{argument}` expected {expected}; "
        f"received {received}."
    )


def dot_product_attention(
    query,
    key,
    value,
    masks=NO_MASKS,
    *,
    scale,
    implementation="auto",
    dtype="float32",
    block_size=DEFAULT_BLOCK_SIZE,
    tile_threshold=DEFAULT_TILE_THRESHOLD,
    dropout=0.0,
    dropout_fn=None,
    training=None,
    return_scores=False,
    flash_attention=False,
    softmax=None,
    error=_value_error,
):
    """``(context [B, Tq, H, Dv], scores [B, H, Tq, Tk] or None)``: the
    scores (weights) where the direct path ran, always with ``return_scores``.

    Args:
        query: ``[B, Tq, H, D]`` projected queries (not yet scaled).
        key: ``[B, Tk, H, D]`` projected keys.
        value: ``[B, Tk, H, Dv]`` projected values.
        masks: the call's `Masks` (query, key, pairwise, causal, window).
        scale: the scores' multiplier, ``1 / sqrt(D)`` in a transformer.
        implementation: ``"auto"``, ``"direct"``, ``"fused"``, ``"tiled"`` or
            ``"pallas"``; an explicit one raises where it cannot serve the
            call.
        dtype: the compute dtype (``"float16"`` takes its products in
            float32).
        block_size: query rows (and key columns) of one tile.
        tile_threshold: ``Tq * Tk`` past which ``"auto"`` keeps memory
            linear.
        dropout: the dropout rate of the weights; ``dropout_fn(weights,
            training=...)`` applies it (the direct path only).
        training: whether dropout is active.
        return_scores: also return the weights (the direct path only).
        flash_attention: passed to the backend's fused kernel; True makes
            ``"auto"`` take it.
        softmax: ``softmax(scores, mask)`` of the direct path, weights in
            ``dtype`` (default: `attention_layers.masking.masked_softmax`).
        error: ``error(argument, expected, received)`` builds the exception
            of a refused call (a layer passes its own, naming itself).

    >>> import numpy as np
    >>> q = np.random.default_rng(0).normal(size=(1, 3, 2, 4)).astype("float32")
    >>> out, scores = dot_product_attention(q, q, q, scale=0.5, return_scores=True)
    >>> tuple(out.shape), tuple(scores.shape)
    ((1, 3, 2, 4), (1, 2, 3, 3))
    """
    if flash_attention and return_scores:
        raise error(
            "return_attention_scores", f"False with flash attention. {FLASH_SCORES}",
            "True",
        )  # fmt: skip
    impl = choose(
        implementation,
        length(query),
        length(key),
        masks,
        dtype=dtype,
        key_dim=_static(key.shape)[-1],
        value_dim=_static(value.shape)[-1],
        dropout=dropout,
        training=training,
        return_scores=return_scores,
        flash_attention=flash_attention,
        tile_threshold=tile_threshold,
        error=error,
    )
    if impl == "tiled":
        scaled = scaled_query(query, scale, dtype)
        return tiled_attention(scaled, key, value, masks, block_size), None
    if impl == "pallas":
        return pallas(query, key, value, masks, scale, dtype), None
    if impl == "fused":
        context = fused(query, key, value, masks, scale, dtype, flash_attention)
        return context, None
    return direct(
        query, key, value, masks, scale, dtype, dropout, dropout_fn, training,
        softmax,
    )  # fmt: skip


# -- the choice --------------------------------------------------------------------
def choose(
    implementation,
    tq,
    tk,
    masks=NO_MASKS,
    *,
    dtype="float32",
    key_dim,
    value_dim,
    dropout=0.0,
    training=None,
    return_scores=False,
    flash_attention=False,
    tile_threshold=DEFAULT_TILE_THRESHOLD,
    error=_value_error,
):
    """The evaluation of one call: ``implementation``, checked, or for
    ``"auto"`` the one that suits the backend, the device and ``dtype``.

    ``"auto"``: ``"direct"`` when scores are returned or dropout is active;
    ``"fused"`` when ``flash_attention`` is True. On a GPU or TPU with
    ``value_dim == key_dim``: ``"fused"`` in 16-bit; in float32 ``"pallas"``
    past ``tile_threshold`` query-key pairs where it serves the call, else
    ``"tiled"`` past 2^26 pairs and ``"fused"`` below. On a CPU ``"tiled"``
    past ``tile_threshold`` pairs, else ``"fused"`` in float32 with one head
    size and ``"direct"`` otherwise.

    >>> choose("auto", 4096, 4096, key_dim=8, value_dim=8)  # on a CPU
    'tiled'
    """
    masks = masks or NO_MASKS
    tq, tk = (t if isinstance(t, int) else None for t in (tq, tk))
    dropping = bool(dropout) and bool(training)
    if implementation == "direct":
        return implementation
    if implementation != "auto":
        check_explicit(
            implementation, tq, tk, masks, key_dim, value_dim,
            dropout if dropping else 0.0, return_scores, error,
        )  # fmt: skip
        return implementation
    if return_scores or dropping:
        return "direct"
    if flash_attention and value_dim == key_dim:
        return "fused"
    pairs = None if None in (tq, tk) else tq * tk
    per_head = masks.pair is not None and len(masks.pair.shape) == 4
    if devices.on_accelerator():
        long = pairs is not None and pairs > ACCELERATOR_TILE_THRESHOLD
        if value_dim != key_dim:
            return "tiled" if long and not per_head else "direct"
        if dtype != "float32":
            return "fused"
        if (
            pairs is not None
            and pairs > tile_threshold
            and devices.pallas_attention_available()
            and pallas_supports(masks, tq, tk, key_dim, value_dim)
        ):
            return "pallas"
        return "tiled" if long and not per_head else "fused"
    if pairs is not None and pairs > tile_threshold and not per_head:
        return "tiled"
    return "fused" if dtype == "float32" and value_dim == key_dim else "direct"


def check_explicit(impl, tq, tk, masks, key_dim, value_dim, dropping, scores, error):
    """Raise where an explicit ``"tiled"``, ``"fused"`` or ``"pallas"``
    cannot serve a call (``dropping``: the active dropout rate, or 0)."""
    if scores:
        raise error(
            "return_attention_scores",
            f"False with implementation={impl!r}, which never "
            "materialises the scores (use 'direct' or 'auto')",
            "True",
        )
    if dropping:
        raise error(
            "training",
            f"no dropout with implementation={impl!r} (dropout on "
            "the attention weights needs 'direct' or 'auto')",
            f"training=True with dropout={dropping}",
        )
    if impl == "tiled" and masks.pair is not None and len(masks.pair.shape) == 4:
        raise error(
            "attention_mask",
            "one mask for every head with implementation='tiled' (use "
            "'direct', 'fused' or 'auto' for a per-head mask)",
            f"shape {_static(masks.pair.shape)}",
        )
    if impl != "pallas":
        return
    backend, platform = keras.backend.backend(), devices.platform()
    if backend != "jax" or platform == "tpu":
        raise error(
            "implementation",
            "'pallas' on the JAX backend, on a GPU (or a CPU, interpreted)",
            f"the {backend} backend on {platform}",
        )
    if not pallas_supports(masks, tq, tk, key_dim, value_dim):
        raise error(
            "implementation",
            "'pallas' for a call it can serve: equal static query and key "
            "lengths, value_dim == key_dim, no key, pairwise or window "
            "mask (use 'auto' or 'tiled')",
            f"'pallas' with Tq={tq}, Tk={tk}, key_dim={key_dim}, value_dim={value_dim}",
        )


# -- the evaluations ---------------------------------------------------------------
def scaled_query(q, scale, dtype):
    """``q * scale`` in the score dtype (float32 under float16)."""
    dtype = score_dtype(dtype)
    return ops.cast(q, dtype) * ops.cast(scale, dtype)


def direct(q, k, v, masks, scale, dtype, dropout=0.0, dropout_fn=None,
           training=None, softmax=None):  # fmt: skip
    """The scores materialised: ``(context, weights)``; dropout (by
    ``dropout_fn``) on the weights that multiply the values, not on those
    returned."""
    scores = ops.einsum(
        "bqhd,bkhd->bhqk",
        scaled_query(q, scale, dtype),
        ops.cast(k, score_dtype(dtype)),
    )
    mask = dense_mask(q, k, masks)
    if softmax is None:
        weights = ops.cast(masking.masked_softmax(scores, mask), dtype)
    else:
        weights = softmax(scores, mask)
    dropped = weights
    if dropout and dropout_fn is not None:
        dropped = dropout_fn(weights, training=training)
    context = ops.einsum("bhqk,bkhd->bqhd", dropped, ops.cast(v, dtype))
    return context, weights


def fused(q, k, v, masks, scale, dtype, flash_attention=None):
    """The backend's kernel; a causal mask alone goes as ``is_causal``
    (the kernels' own causal path, flash attention's included)."""
    dtype = "float32" if dtype == "float16" else dtype
    causal_only = (
        masks[:3] == (None, None, None)
        and masks.window is None
        and isinstance(masks.causal_offset, int)
        and masks.causal_offset == 0
    )
    mask = None if causal_only else dense_mask(q, k, masks)
    rows = None
    if mask is not None:
        # A fully masked row would get uniform weights from the kernel:
        # let it attend everywhere (finite values and gradients), then zero
        # its context.
        rows = ops.any(mask, axis=-1)  # [B, 1 or H, Tq]
        mask = ops.logical_or(mask, ops.expand_dims(ops.logical_not(rows), -1))
        rows = ops.moveaxis(rows, 1, 2)  # [B, Tq, 1 or H]
    context = ops.dot_product_attention(
        ops.cast(q, dtype),
        ops.cast(k, dtype),
        ops.cast(v, dtype),
        mask=mask,
        scale=scale,
        is_causal=causal_only,
        flash_attention=flash_attention,
    )
    return masking.zero_masked(context, rows)


def pallas(q, k, v, masks, scale, dtype):
    """Pallas' kernel, in float32 under float16."""
    dtype = "float32" if dtype == "float16" else dtype
    q, k, v = (ops.cast(x, dtype) for x in (q, k, v))
    return pallas_attention(q, k, v, masks, scale)
