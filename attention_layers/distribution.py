"""Model parallelism for the layers under Keras' distribution API (JAX).

`layout_map` shards the attention heads and projections of this library's
layers over the ``"model"`` axis of a ``keras.distribution.DeviceMesh``, the
way keras-hub ships a layout map for its models; batches go over the other
axis. Variables it does not name (norms, embeddings) are replicated.
"""

import keras

# Weight path (regular expression, matched whole) -> which axis of the weight
# is split over the model axis ("m") and which are whole (None).
_LAYOUTS = {
    # MultiHeadAttention (and the Transformer blocks' attention): heads.
    r"(.*/)?(query|key|value)/kernel": (None, "m", None),  # [d_in, H, key_dim]
    r"(.*/)?(query|key|value)/bias": ("m", None),  # [H, key_dim]
    r"(.*/)?attention_output/kernel": ("m", None, None),  # [H, value_dim, d_out]
    # Transformer blocks' feed-forward network: its hidden units.
    r"(.*/)?intermediate/kernel": (None, "m"),
    r"(.*/)?intermediate/bias": ("m",),
    r"(.*/)?output/kernel": ("m", None),
    # BahdanauAttention (HardAttention) and AttentionPooling: the score's
    # units (their vectors ``v`` and ``u_w`` stay whole: small, and ``v``'s
    # path carries the layer's own name).
    r"(.*/)?(W1|W2|W)/kernel": (None, "m"),
}


def layout_map(device_mesh, model_axis="model"):
    """A ``keras.distribution.LayoutMap`` that shards this library's layers.

    Multi-head attention splits its heads (the query, key and value kernels
    ``[d_in, H, key_dim]`` on ``H``, the output kernel ``[H, value_dim,
    d_out]`` on ``H``), the Transformer blocks their feed-forward hidden
    units, and Bahdanau, hard attention and attention pooling the units of
    their score projections, over ``model_axis`` of ``device_mesh``; every
    other weight is
    replicated. The sizes split (heads, units) must be multiples of that
    axis's size. Pass it to ``keras.distribution.ModelParallel``; layers
    named by hand keep their sublayers' names (``query``, ``W1``, ...), so
    they are matched too.

    Args:
        device_mesh: a ``keras.distribution.DeviceMesh`` holding
            ``model_axis``.
        model_axis: the name of the mesh axis to split weights over.

    Returns:
        A ``keras.distribution.LayoutMap``.

    Example:

    >>> import keras
    >>> mesh = keras.distribution.DeviceMesh(
    ...     (1, 1), ["batch", "model"], keras.distribution.list_devices()[:1])
    >>> layouts = layout_map(mesh)
    >>> tuple(layouts["encoder/self_attention/query/kernel"].axes)
    (None, 'model', None)
    >>> layouts["encoder/self_attention_norm/gamma"] is None
    True
    """
    if model_axis not in device_mesh.axis_names:
        raise ValueError(
            f"layout_map: `model_axis` expected one of the mesh's axes "
            f"{list(device_mesh.axis_names)}; received {model_axis!r}."
        )
    layouts = keras.distribution.LayoutMap(device_mesh)
    for path, axes in _LAYOUTS.items():
        layouts[path] = tuple(model_axis if a == "m" else None for a in axes)
    return layouts
