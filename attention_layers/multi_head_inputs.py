"""The arguments and inputs of `MultiHeadAttention`, checked and normalised.

Its arguments (``rotary``, ``output_shape``, ``attention_axes``), the shapes
of a call's inputs, its masks as booleans, and inputs of higher rank
flattened to rank 3 around a rank-3 call. Errors name the layer
(`attention_layers.base.input_error`).
"""

import numbers

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import check_mask_shape, check_positive_int, input_error
from attention_layers.base import static_shape as _static
from attention_layers.ops import attention_axes
from attention_layers.positional import RotaryEmbedding

_KEY_VALUE = "All dimensions of `value` and `key`, except the last one, must be equal"
_ROTARY_EXPECTED = "None, True, a RotaryEmbedding or a dict of its arguments"
_ROTARY_ARGS = ("max_wavelength", "scaling_factor", "interleaved")


def rotary_config(layer, rotary):
    """The ``rotary`` argument of ``layer`` as a config: None, or a dict.

    ``True`` means ``RotaryEmbedding()``; a dict holds its arguments (or is a
    serialized Keras object); a `RotaryEmbedding` gives its arguments (a
    subclass, its serialized form). Bad values raise ``input_error``.
    """
    if rotary is None or rotary is False:
        return None
    if rotary is True:
        rotary = RotaryEmbedding()
    elif isinstance(rotary, dict):
        try:
            if "class_name" in rotary:
                rotary = keras.saving.deserialize_keras_object(rotary)
            else:
                rotary = RotaryEmbedding(**rotary)
        except (TypeError, ValueError) as error:
            raise input_error(layer, "rotary", _ROTARY_EXPECTED, str(error)) from None
    if not isinstance(rotary, RotaryEmbedding):
        raise input_error(layer, "rotary", _ROTARY_EXPECTED, repr(rotary))
    if type(rotary) is not RotaryEmbedding:
        return keras.saving.serialize_keras_object(rotary)
    config = rotary.get_config()
    return {name: config[name] for name in _ROTARY_ARGS}


def rotary_layer(config, dtype):
    """A fresh rotary layer from `rotary_config`'s dict, in ``dtype``."""
    if "class_name" not in config:
        return RotaryEmbedding(**config, dtype=dtype, name="rotary_embedding")
    layer = keras.saving.deserialize_keras_object(config)
    return layer.__class__.from_config(
        {**layer.get_config(), "dtype": dtype, "name": "rotary_embedding"}
    )


def output_shape_arg(layer, output_shape):
    """``output_shape`` as None, an int, or a list of ints."""
    if output_shape is None:
        return None
    dims = (
        (output_shape,) if isinstance(output_shape, numbers.Integral) else output_shape
    )
    try:
        dims = [check_positive_int(layer, "output_shape", d) for d in dims]
    except (TypeError, ValueError):
        raise input_error(
            layer,
            "output_shape",
            "a positive integer or a tuple or list of them",
            f"{output_shape!r} (Invalid `output_shape`)",
        ) from None
    return dims[0] if isinstance(output_shape, numbers.Integral) else dims


def attention_axes_arg(layer, attention_axes):
    """``attention_axes`` as None or a tuple of ints."""
    if attention_axes is None:
        return None
    axes = (attention_axes,) if isinstance(attention_axes, int) else attention_axes
    if not isinstance(axes, (list, tuple)) or not all(
        isinstance(a, int) and not isinstance(a, bool) for a in axes
    ):
        raise input_error(
            layer,
            "attention_axes",
            "None, an int, or a list or tuple of ints",
            repr(attention_axes),
        )
    return tuple(axes)


def check_shapes(layer, query_shape, value_shape, key_shape, axes=True):
    """Ranks, batch sizes and key/value shapes; with ``axes``, the
    attention axes for the query's rank."""
    q, v, k = _static(query_shape), _static(value_shape), _static(key_shape)
    if len(q) < 3:
        raise input_error(
            layer, "query", "a tensor of rank 3 or more [batch, ..., dim]", f"shape {q}"
        )
    if len(v) != len(q):
        raise input_error(
            layer,
            "value",
            f"the rank of query ({len(q)}) [batch, ..., dim]",
            f"shape {v}",
        )
    if len(k) != len(v) or any(
        None not in (a, b) and a != b for a, b in zip(k[1:-1], v[1:-1], strict=True)
    ):
        raise input_error(
            layer,
            "key",
            f"the shape of value but its last axis ({_KEY_VALUE})",
            f"shape {k} (value: {v})",
        )
    if len({q[0], v[0], k[0]} - {None}) > 1:
        raise input_error(
            layer,
            "value",
            "the same batch size as query and key",
            f"batch sizes query={q[0]}, value={v[0]}, key={k[0]}",
        )
    resolved = attention_axes.resolve_axes(layer.attention_axes, len(q))
    if axes and (not resolved or any(not 0 < a < len(q) - 1 for a in resolved)):
        raise input_error(
            layer,
            "attention_axes",
            f"axes between the batch and the feature axes of a rank-{len(q)} query",
            repr(layer.attention_axes),
        )


def _attention_mask_4d(layer, mask, batch, heads, tq, tk):
    """``attention_mask`` of shape ``(Tq, Tk)``, ``(B or 1, Tq, Tk)`` or
    ``(B or 1, H or 1, Tq, Tk)`` as a boolean ``[B or 1, H or 1, Tq, Tk]``."""
    mask = masking.as_bool(mask)
    shape = _static(mask.shape)
    forms = {2: (tq, tk), 3: (batch, tq, tk), 4: (batch, heads, tq, tk)}
    want = forms.get(len(shape))
    ok = want is not None and all(
        a is None or b is None or a == b or (a == 1 and i < len(shape) - 2)
        for i, (a, b) in enumerate(zip(shape, want, strict=True))
    )
    if not ok:
        raise input_error(
            layer,
            "attention_mask",
            f"shape (Tq, Tk), (B, Tq, Tk) or (B, H, Tq, Tk) = {(tq, tk)}, "
            f"{(batch, tq, tk)} or {(batch, heads, tq, tk)} (B and H may be 1)",
            f"shape {shape}",
        )
    while len(mask.shape) < 4:
        mask = ops.expand_dims(mask, 0 if len(mask.shape) == 2 else 1)
    return mask


def input_masks(layer, query, tk, query_mask, value_mask, key_mask, attention_mask):
    """``(query mask [B, Tq], key mask [B, Tk], pairwise mask)`` of a rank-3
    call, as booleans (None where absent); the pairwise mask as
    `pairwise_mask` gives it."""
    batch, tq = _static(query.shape)[:2]
    check_mask_shape(layer, "query_mask", query_mask, (batch, tq))
    check_mask_shape(layer, "value_mask", value_mask, (batch, tk))
    check_mask_shape(layer, "key_mask", key_mask, (batch, tk))
    pair = None
    if attention_mask is not None:
        pair = pairwise_mask(layer, attention_mask, query, tk, batch)
    kv_mask = masking.and_masks(value_mask, key_mask)
    return masking.as_bool(query_mask), kv_mask, pair


def pairwise_mask(layer, mask, query, tk, batch=None):
    """``attention_mask`` as a boolean ``[B, Tq, Tk]``, or ``[B, H, Tq, Tk]``
    where it differs by head; its shape checked against ``batch`` (None:
    any), the query's length and ``tk``."""
    tq = _static(query.shape)[1]
    mask = _attention_mask_4d(layer, mask, batch, layer.num_heads, tq, tk)
    heads = _static(mask.shape)[1]
    full = (ops.shape(query)[0], heads, tq or ops.shape(query)[1], tk)
    mask = ops.broadcast_to(mask, full)
    return mask[:, 0] if heads == 1 else mask


def call_over_axes(
    layer, attention_call, layout, query, value, key, query_mask, value_mask,
    key_mask, attention_mask, return_attention_scores, training, use_causal_mask,
    cache,
):  # fmt: skip
    """A call on higher-rank inputs (`attention_layers.ops.attention_axes`):
    flattened to rank 3, given to ``attention_call`` (the layer's rank-3
    call), put back."""
    if cache is not None or layer.rotary is not None:
        raise input_error(
            layer,
            "query",
            "a rank-3 tensor with a cache or rotary positions",
            f"shape {_static(query.shape)}",
        )
    check_shapes(layer, query.shape, value.shape, key.shape)

    def flat_mask(mask, like):
        if mask is None:
            return None
        check_mask_shape(layer, "mask", mask, _static(like.shape)[:-1])
        return attention_axes.flatten(masking.as_bool(mask), layout, feature=False)

    if attention_mask is not None:
        attention_mask = attention_axes.flatten_attention_mask(
            masking.as_bool(attention_mask), layout, query, key, layer.num_heads
        )
    out = attention_call(
        attention_axes.flatten(query, layout),
        attention_axes.flatten(value, layout),
        attention_axes.flatten(key, layout),
        flat_mask(query_mask, query),
        flat_mask(value_mask, value),
        flat_mask(key_mask, key),
        attention_mask,
        return_attention_scores,
        training,
        use_causal_mask,
    )
    output, scores = out if return_attention_scores else (out, None)
    output = attention_axes.unflatten_output(output, layout, query)
    if not return_attention_scores:
        return output
    return output, attention_axes.unflatten_scores(scores, layout, query, key)
