"""Multi-head attention: a drop-in for ``keras.layers.MultiHeadAttention``,
with a KV cache, rotary positions and paths whose memory is linear in length.

Five evaluations of the same attention, chosen per call (``implementation``):

* ``"direct"``: the scores ``[B, H, Tq, Tk]`` are materialised, masked and
  normalised in float32; the only path that returns them or applies dropout.
* ``"fused"``: ``keras.ops.dot_product_attention``, the backend's kernel.
* ``"tiled"``: query blocks times key blocks with an online softmax and a
  hand-written backward pass (``attention_layers.ops.tiled``).
* ``"pallas"``: JAX's Pallas flash-attention kernel for GPUs
  (``attention_layers.ops.pallas_attention``).

Every path has the same mask semantics: masked positions get zero weight, a
fully masked query row gets zero weights and a zero context (the output is then
the output projection's bias), and NaN or inf under padding never leaks.
"""

import math
import numbers

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import (
    check_float,
    check_mask_shape,
    check_positive_int,
    input_error,
)
from attention_layers.base import static_shape as _static
from attention_layers.ops import attention, attention_axes
from attention_layers.ops.attention import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_TILE_THRESHOLD,
    IMPLEMENTATIONS,
)
from attention_layers.ops.masks import Masks, dense_mask, length
from attention_layers.positional import RotaryEmbedding

# Keras' own words for this refusal, which its users may already match.
_FLASH_DROPOUT = (
    "Dropout is not supported when flash attention is enabled. "
    "Please set dropout to 0.0 to use flash attention."
)
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


def _rotary_layer(config, dtype):
    """A fresh rotary layer from `rotary_config`'s dict, in ``dtype``."""
    if "class_name" not in config:
        return RotaryEmbedding(**config, dtype=dtype, name="rotary_embedding")
    layer = keras.saving.deserialize_keras_object(config)
    return layer.__class__.from_config(
        {**layer.get_config(), "dtype": dtype, "name": "rotary_embedding"}
    )


def _output_shape_arg(layer, output_shape):
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


def _attention_axes_arg(layer, attention_axes):
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


@keras.saving.register_keras_serializable(package="attention_layers")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention of Vaswani et al. (2017): self, causal and cross.

    ``head_h = softmax(Q_h K_h^T / sqrt(key_dim)) V_h`` with ``Q_h = q W^Q_h``,
    ``K_h = k W^K_h``, ``V_h = v W^V_h``, and the output
    ``concat(head_1..head_H) W^O + b^O``. It takes every argument and input
    of ``keras.layers.MultiHeadAttention`` (Keras 3.15) with the same meaning
    and the same weights in the same order, so ``set_weights`` copies weights
    between the two and ``from_config`` reads a Keras config
    (docs/from_keras_attention.md has the table).

    Differences from Keras: a fully masked query row gets zero weights and
    attends to nothing, so its output is the output bias alone (Keras spreads
    it uniformly); NaN under padding never leaks; scores are normalised in
    float32 under ``mixed_float16`` and ``mixed_bfloat16``. What Keras lacks:
    a KV cache for incremental decoding, rotary positions, and the
    ``implementation`` choice (the module docstring lists the paths).

    ``implementation``:

    * ``"direct"``: scores materialised; the only path that returns scores or
      applies dropout.
    * ``"fused"``: ``keras.ops.dot_product_attention`` (inputs cast to float32
      under ``mixed_float16``, whose range the product may overflow); needs
      ``value_dim == key_dim``; ``flash_attention`` is passed to it.
    * ``"tiled"``: blocks of ``block_size`` queries over all the keys or over
      tiles of ``block_size`` keys with an online softmax, and a tiled
      backward pass: memory linear in the lengths; no scores, no dropout, no
      per-head mask.
    * ``"pallas"``: JAX's Pallas flash-attention kernel for GPUs (its
      interpreter off a GPU); JAX only, equal static query and key lengths,
      one head size, no key, pairwise or window mask, a causal mask only for
      queries aligned with the keys; no scores, no dropout.
    * ``"auto"``: ``"direct"`` when scores are returned or dropout is active;
      ``"fused"`` when ``flash_attention`` is True. On a GPU or TPU with
      ``value_dim == key_dim``: ``"fused"`` in 16-bit; in float32
      ``"pallas"`` past ``tile_threshold`` query-key pairs where it serves
      the call, else ``"tiled"`` past 2^26 pairs and ``"fused"`` below. On a
      CPU ``"tiled"`` past ``tile_threshold`` pairs, else ``"fused"`` in
      float32 with one head size and ``"direct"`` otherwise. Explicit paths
      raise where they cannot serve a call.

    Masks, as in Keras: ``query_mask`` ``[B, Tq]``, ``value_mask`` and
    ``key_mask`` ``[B, Tk]`` (filled from ``Embedding(mask_zero=True)``), an
    ``attention_mask`` ``(Tq, Tk)``, ``(B, Tq, Tk)`` or per head ``(B, H, Tq,
    Tk)`` (size-1 batch and head axes broadcast), the causal mask (query ``i``
    sees keys ``j <= i``, aligned at the first key as in Keras) and the
    ``sliding_window`` band ``|i - j| < sliding_window``. With a
    self-attention cache the queries sit at ``cache_update_index + i``: the
    causal mask and the window count from there.

    Incremental decoding uses a cache ``[B, 2, S, H, key_dim]`` (keys at index
    0, values at 1; it needs ``value_dim == key_dim``). Self-attention: pass
    ``cache`` and ``cache_update_index``; the new tokens' keys and values are
    written at ``[index, index + T)`` and the queries attend over the cache,
    where slots from ``index + T`` on (not yet written) are masked.
    Cross-attention: pass ``cache=layer.compute_cache(memory)`` and no index.

    Rotary positions (``rotary``, Su et al. 2021) rotate the projected
    queries and keys of every head before the scores, on every path: keys at
    positions ``0..Tk-1``, queries at ``0..Tq-1`` (at ``index + i`` with a
    self-attention cache). They are for self-attention: a cross-attention
    cache is refused.

    Inputs of higher rank (``[B, d_1, ..., d_n, dim]``) attend over their
    ``attention_axes`` as in Keras (the other axes act as batch axes); the
    causal mask and the window then count positions along the attention axes
    flattened; the cache and rotary positions need rank-3 inputs.

    Args:
        num_heads: number of heads ``H``.
        key_dim: size of each head of the query and key projections.
        value_dim: size of each head of the value projection; ``None`` means
            ``key_dim``.
        dropout: fraction of attention weights dropped in training.
        use_bias: whether the projections have biases.
        output_shape: last dimension(s) of the output; ``None`` means the
            query's last dimension.
        attention_axes: the axes attended over (``None``: every axis but the
            batch and the features).
        sliding_window: ``None``, or each query sees the keys within
            ``sliding_window - 1`` positions of its own.
        flash_attention: ``None`` (the backend decides; see
            ``keras.config.enable_flash_attention``), True or False: passed
            to the backend's fused kernel.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        kernel_regularizer: regularizer of the projection kernels.
        bias_regularizer: regularizer of the projection biases.
        activity_regularizer: regularizer of the projections' outputs and of
            the layer's output (as in Keras).
        kernel_constraint: constraint on the projection kernels.
        bias_constraint: constraint on the projection biases.
        use_gate: gate the attention output with ``sigmoid(q W^G)`` before the
            output projection (Qiu et al. 2025).
        seed: dropout seed.
        implementation: ``"auto"``, ``"direct"``, ``"tiled"``, ``"fused"`` or
            ``"pallas"``.
        tile_threshold: ``Tq * Tk`` past which ``"auto"`` takes a
            linear-memory path (default ``2**20``).
        block_size: query rows of one block of the tiled path, and key columns
            of one tile when it tiles the keys (default 256).
        rotary: rotary positions on queries and keys: ``None``, ``True``
            (``RotaryEmbedding()``), a `RotaryEmbedding`, or a dict of its
            arguments; needs an even ``key_dim``.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        query: ``[B, Tq, Dq]`` (or higher rank, see above).
        value: ``[B, Tk, Dv]``; may be ``None`` with a cross-attention cache.
        key: ``[B, Tk, Dk]``, defaults to ``value``.
        query_mask, value_mask, key_mask, attention_mask: the masks above.
        return_attention_scores: also return the weights ``[B, H, Tq, Tk]``.
        training: whether dropout is active.
        use_causal_mask: add the causal mask.
        cache: ``[B, 2, S, H, key_dim]`` keys and values, or ``None``.
        cache_update_index: where the new tokens go in a self-attention
            cache (Python int or scalar int tensor); ``None`` for a
            cross-attention cache. ``index + Tq`` must not pass ``S``: a
            Python int past it is refused, a tensor one is clamped by the
            update (which then overwrites the last slots).

    Returns:
        ``output`` ``[B, Tq, d_out]``; with ``return_attention_scores=True``
        ``(output, scores)``; with a cache ``(output, new_cache)`` or
        ``(output, scores, new_cache)``.

    Example:

    >>> import numpy as np
    >>> layer = MultiHeadAttention(num_heads=2, key_dim=4)
    >>> x = np.random.rand(2, 5, 8).astype("float32")
    >>> out, scores = layer(x, x, use_causal_mask=True, return_attention_scores=True)
    >>> tuple(out.shape), tuple(scores.shape)
    ((2, 5, 8), (2, 2, 5, 5))
    >>> cache = layer.empty_cache(batch_size=2, max_length=5)
    >>> step, cache = layer(x[:, :1], x[:, :1], cache=cache, cache_update_index=0,
    ...                     use_causal_mask=True)
    >>> bool(np.allclose(step, out[:, :1], atol=1e-5))
    True

    With rotary positions, a prompt fed into the cache, then one token:

    >>> rope = MultiHeadAttention(num_heads=2, key_dim=4, rotary=True)
    >>> full = rope(x, x, use_causal_mask=True)
    >>> cache = rope.empty_cache(batch_size=2, max_length=5)
    >>> _, cache = rope(x[:, :3], x[:, :3], cache=cache, cache_update_index=0,
    ...                 use_causal_mask=True)
    >>> step, cache = rope(x[:, 3:4], x[:, 3:4], cache=cache,
    ...                    cache_update_index=3, use_causal_mask=True)
    >>> bool(np.allclose(step, full[:, 3:4], atol=1e-5))
    True

    References:
        Vaswani et al. Attention Is All You Need. NeurIPS 2017.
        https://arxiv.org/abs/1706.03762

        Su et al. RoFormer: Enhanced Transformer with Rotary Position
        Embedding. 2021. https://arxiv.org/abs/2104.09864

        Qiu et al. Gated Attention for Large Language Models. 2025.
        https://arxiv.org/abs/2505.06708
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        sliding_window=None,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        use_gate=False,
        seed=None,
        implementation="auto",
        tile_threshold=DEFAULT_TILE_THRESHOLD,
        block_size=DEFAULT_BLOCK_SIZE,
        rotary=None,
        **kwargs,
    ):
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        self.supports_masking = True
        self.num_heads = check_positive_int(self, "num_heads", num_heads)
        self.key_dim = check_positive_int(self, "key_dim", key_dim)
        value_dim = check_positive_int(self, "value_dim", value_dim, allow_none=True)
        self.value_dim = value_dim or self.key_dim
        if not 0.0 <= float(dropout) < 1.0:
            raise self._error("dropout", "a float in [0, 1)", repr(dropout))
        self.dropout = dropout
        self.use_bias = use_bias
        self.output_shape = _output_shape_arg(self, output_shape)
        self.attention_axes = _attention_axes_arg(self, attention_axes)
        self.sliding_window = check_positive_int(
            self, "sliding_window", sliding_window, allow_none=True
        )
        self.flash_attention = flash_attention
        # As Keras: the global setting fills in None, once.
        self._flash_attention = flash_attention or (
            keras.config.is_flash_attention_enabled()
        )
        if self._flash_attention and dropout:
            raise self._error(
                "dropout", f"0.0 with flash attention. {_FLASH_DROPOUT}", repr(dropout)
            )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.use_gate = bool(use_gate)
        self.seed = seed
        self._set_paths(implementation, tile_threshold, block_size, rotary)

    def _set_paths(self, implementation, tile_threshold, block_size, rotary):
        """Check and keep the arguments that are ours alone."""
        if implementation not in IMPLEMENTATIONS:
            raise self._error(
                "implementation", f"one of {IMPLEMENTATIONS}", repr(implementation)
            )
        if implementation == "fused" and self.value_dim != self.key_dim:
            # keras.ops.dot_product_attention on JAX needs one head size.
            raise self._error(
                "value_dim",
                f"None or key_dim ({self.key_dim}) with implementation='fused'",
                repr(self.value_dim),
            )
        self.implementation = implementation
        self.tile_threshold = check_positive_int(self, "tile_threshold", tile_threshold)
        self.block_size = check_positive_int(self, "block_size", block_size)
        self.rotary = rotary_config(self, rotary)
        if self.rotary is not None and self.key_dim % 2:
            raise self._error(
                "key_dim", "an even size with rotary positions", repr(self.key_dim)
            )

    def _error(self, argument, expected, received):
        return input_error(self, argument, expected, received)

    # -- Keras' names --------------------------------------------------------
    @property
    def query_dense(self):
        return self._query_dense

    @property
    def key_dense(self):
        return self._key_dense

    @property
    def value_dense(self):
        return self._value_dense

    @property
    def output_dense(self):
        return self._output_dense

    @property
    def gate_dense(self):
        """The gate's projection (``use_gate=True``), else None."""
        return self._gate_dense

    @property
    def dropout_layer(self):
        return self._dropout_layer

    @property
    def _sliding_window(self):
        return self.sliding_window

    @property
    def _num_heads(self):
        return self.num_heads

    @property
    def _key_dim(self):
        return self.key_dim

    @property
    def _value_dim(self):
        return self.value_dim

    @property
    def _inverse_sqrt_key_dim(self):
        return 1.0 / math.sqrt(float(self.key_dim))

    # -- build ---------------------------------------------------------------
    def _sublayer_kwargs(self):
        """Regularizers, constraints, the dtype policy, and fresh copies of
        the initializers (one shared instance gives equal weights)."""
        return {
            "kernel_initializer": self.kernel_initializer.__class__.from_config(
                self.kernel_initializer.get_config()
            ),
            "bias_initializer": self.bias_initializer.__class__.from_config(
                self.bias_initializer.get_config()
            ),
            "kernel_regularizer": self.kernel_regularizer,
            "bias_regularizer": self.bias_regularizer,
            "activity_regularizer": self.activity_regularizer,
            "kernel_constraint": self.kernel_constraint,
            "bias_constraint": self.bias_constraint,
            "dtype": self.dtype_policy,
        }

    def _projection(self, name, dim, inner, activation=None):
        layer = keras.layers.EinsumDense(
            "abc,cde->abde",
            output_shape=(None, self.num_heads, inner),
            bias_axes="de" if self.use_bias else None,
            activation=activation,
            name=name,
            **self._sublayer_kwargs(),
        )
        layer.build((None, None, dim))
        return layer

    def build(self, query_shape, value_shape=None, key_shape=None):
        if value_shape is None:
            raise self._error(
                "value",
                "a tensor on the first call (the projections are built from it)",
                "None",
            )
        key_shape = value_shape if key_shape is None else key_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        # Built in Keras' order (query, key, gate, value, output): the same
        # weights in the same order, for set_weights.
        self._query_dense = self._projection("query", query_shape[-1], self.key_dim)
        self._key_dense = self._projection("key", key_shape[-1], self.key_dim)
        self._gate_dense = None
        if self.use_gate:
            self._gate_dense = self._projection(
                "gate", query_shape[-1], self.value_dim, activation="sigmoid"
            )
        self._value_dense = self._projection("value", value_shape[-1], self.value_dim)
        out = self.output_shape
        out = [query_shape[-1]] if out is None else out
        out = [out] if isinstance(out, int) else list(out)
        letters = "efgh"[: len(out)]
        self._output_dense = keras.layers.EinsumDense(
            f"abcd,cd{letters}->ab{letters}",
            output_shape=(None, *out),
            bias_axes=letters if self.use_bias else None,
            name="attention_output",
            **self._sublayer_kwargs(),
        )
        self._output_dense.build((None, None, self.num_heads, self.value_dim))
        self._dropout_layer = keras.layers.Dropout(
            self.dropout, seed=self.seed, dtype=self.dtype_policy
        )
        self.rotary_embedding = None
        if self.rotary is not None:
            self.rotary_embedding = _rotary_layer(self.rotary, self.dtype_policy)

    def _check_shapes(self, query_shape, value_shape, key_shape, axes=True):
        """Ranks, batch sizes and key/value shapes; with ``axes``, the
        attention axes for the query's rank."""
        q, v, k = _static(query_shape), _static(value_shape), _static(key_shape)
        if len(q) < 3:
            raise self._error(
                "query", "a tensor of rank 3 or more [batch, ..., dim]", f"shape {q}"
            )
        if len(v) != len(q):
            raise self._error(
                "value", f"the rank of query ({len(q)}) [batch, ..., dim]", f"shape {v}"
            )
        if len(k) != len(v) or any(
            None not in (a, b) and a != b for a, b in zip(k[1:-1], v[1:-1], strict=True)
        ):
            raise self._error(
                "key",
                f"the shape of value but its last axis ({_KEY_VALUE})",
                f"shape {k} (value: {v})",
            )
        if len({q[0], v[0], k[0]} - {None}) > 1:
            raise self._error(
                "value",
                "the same batch size as query and key",
                f"batch sizes query={q[0]}, value={v[0]}, key={k[0]}",
            )
        resolved = attention_axes.resolve_axes(self.attention_axes, len(q))
        if axes and (not resolved or any(not 0 < a < len(q) - 1 for a in resolved)):
            raise self._error(
                "attention_axes",
                f"axes between the batch and the feature axes of a rank-{len(q)} query",
                repr(self.attention_axes),
            )

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        self._check_shapes(query_shape, value_shape, key_shape)
        out = self.output_shape
        if out is None:
            return query_shape
        return query_shape[:-1] + ((out,) if isinstance(out, int) else tuple(out))

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        return_attention_scores=False,
        cache=None,
        **kwargs,
    ):
        out = self.output_shape
        shape = tuple(query.shape)
        if out is not None:
            shape = shape[:-1] + ((out,) if isinstance(out, int) else tuple(out))
        specs = [keras.KerasTensor(shape, dtype=self.compute_dtype)]
        if return_attention_scores:
            key = value if key is None else key
            layout = attention_axes.layout(self.attention_axes, len(query.shape))
            if layout is None:
                tk = cache.shape[2] if cache is not None else key.shape[1]
                scores = (query.shape[0], self.num_heads, query.shape[1], tk)
            else:
                scores = tuple(query.shape[a] for a in layout.batch)
                scores += (self.num_heads,)
                scores += tuple(query.shape[a] for a in layout.attention)
                scores += tuple(key.shape[a] for a in layout.attention)
            specs.append(keras.KerasTensor(scores, dtype=self.compute_dtype))
        if cache is not None:
            specs.append(keras.KerasTensor(cache.shape, dtype=cache.dtype))
        return specs[0] if len(specs) == 1 else tuple(specs)

    # -- cache helpers -----------------------------------------------------
    def _require_cacheable(self):
        if self.value_dim != self.key_dim:
            raise self._error(
                "cache",
                f"value_dim == key_dim ({self.key_dim}) for a KV cache",
                f"value_dim={self.value_dim}",
            )
        if not self.built:
            raise self._error(
                "cache",
                "a built layer (call it once, or build it) before using a cache",
                "an unbuilt layer",
            )

    def _check_cache_index(self, cache, value, index):
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
            raise self._error("cache_update_index", expected, repr(index))

    def compute_cache(self, value, key=None):
        """Project a memory once for cross-attention decoding.

        Args:
            value: ``[B, S, Dv]`` the memory (e.g. the encoder output).
            key: ``[B, S, Dk]``, defaults to ``value``.

        Returns:
            ``[B, 2, S, num_heads, key_dim]``: keys at index 0, values at 1, to
            pass as ``cache`` with ``cache_update_index=None``.
        """
        self._require_cacheable()
        if self.rotary is not None:
            raise self._error(
                "rotary",
                "None for a cross-attention cache (rotary positions are for "
                "self-attention)",
                repr(self.rotary),
            )
        key = value if key is None else key
        return ops.stack([self._key_dense(key), self._value_dense(value)], axis=1)

    def empty_cache(self, batch_size, max_length):
        """Zeros ``[batch_size, 2, max_length, num_heads, key_dim]`` for
        self-attention decoding, in the compute dtype."""
        if self.value_dim != self.key_dim:
            self._require_cacheable()
        shape = (batch_size, 2, max_length, self.num_heads, self.key_dim)
        return ops.zeros(shape, dtype=self.compute_dtype)

    # -- call ------------------------------------------------------------------
    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
    ):
        key = value if key is None else key
        layout = attention_axes.layout(self.attention_axes, len(query.shape))
        if layout is not None:
            return self._call_over_axes(
                layout, query, value, key, query_mask, value_mask, key_mask,
                attention_mask, return_attention_scores, training, use_causal_mask,
                cache,
            )  # fmt: skip
        return self._attention_call(
            query, value, key, query_mask, value_mask, key_mask, attention_mask,
            return_attention_scores, training, use_causal_mask, cache,
            cache_update_index,
        )  # fmt: skip

    def _attention_call(
        self, query, value, key, query_mask, value_mask, key_mask, attention_mask,
        return_attention_scores, training, use_causal_mask, cache=None,
        cache_update_index=None,
    ):  # fmt: skip
        """`call` on rank-3 inputs attending over their sequence axis."""
        self._check_call(query, value, key, cache, cache_update_index)
        tk = length(value) if cache is None else _static(cache.shape)[2]
        query_mask, kv_mask, pair = self._input_masks(
            query, tk, query_mask, value_mask, key_mask, attention_mask
        )
        gate = (
            None
            if self._gate_dense is None
            else self._gate_dense(masking.zero_masked(query, query_mask))
        )
        q, k, v, new_cache, masks = self._project(
            query, value, key, cache, cache_update_index,
            Masks(query_mask, kv_mask, pair, None), use_causal_mask,
        )  # fmt: skip
        if type(self)._compute_attention is MultiHeadAttention._compute_attention:
            context, scores = self._attend(
                q, k, v, masks, training, return_attention_scores
            )
        else:  # a subclass's own attention, called as Keras calls it
            dense = self._dense_mask(q, k, masks)
            context, scores = self._compute_attention(
                q, k, v, dense, training, return_attention_scores
            )
        output = self._output(context, gate)
        result = (output, scores) if return_attention_scores else (output,)
        if cache is not None:
            result += (new_cache,)
        return result[0] if len(result) == 1 else result

    def _check_call(self, query, value, key, cache, index):
        """Validate one rank-3 call's inputs and cache."""
        if cache is None and index is not None:
            raise self._error(
                "cache", "a cache tensor along with cache_update_index", "None"
            )
        cross_cache = cache is not None and index is None
        if cross_cache and self.rotary is not None:
            raise self._error(
                "cache_update_index",
                "an index with rotary positions (a self-attention cache; "
                "rotary positions do not apply to cross-attention)",
                "None",
            )
        check_float(self, "query", query)
        if value is None:
            if not cross_cache:
                raise self._error(
                    "value", "a tensor (None only with a cross-attention cache)", "None"
                )
        else:
            self._check_shapes(query.shape, value.shape, key.shape, axes=False)
            check_float(self, "value", value)
            check_float(self, "key", key)
        if cache is not None:
            self._require_cacheable()
            want = (_static(query.shape)[0], 2, None, self.num_heads, self.key_dim)
            check_mask_shape(self, "cache", cache, want)
            if not cross_cache:
                self._check_cache_index(cache, value, index)

    def _input_masks(self, query, tk, query_mask, value_mask, key_mask, attention_mask):
        """``(query mask [B, Tq], key mask [B, Tk], pairwise mask)`` as booleans
        (None where absent); the pairwise mask ``[B, Tq, Tk]``, or ``[B, H,
        Tq, Tk]`` where it differs by head."""
        batch, tq = _static(query.shape)[:2]
        check_mask_shape(self, "query_mask", query_mask, (batch, tq))
        check_mask_shape(self, "value_mask", value_mask, (batch, tk))
        check_mask_shape(self, "key_mask", key_mask, (batch, tk))
        pair = None
        if attention_mask is not None:
            pair = _attention_mask_4d(
                self, attention_mask, batch, self.num_heads, tq, tk
            )
            heads = _static(pair.shape)[1]
            full = (ops.shape(query)[0], heads, tq or ops.shape(query)[1], tk)
            pair = ops.broadcast_to(pair, full)
            pair = pair[:, 0] if heads == 1 else pair
        kv_mask = masking.and_masks(value_mask, key_mask)
        return masking.as_bool(query_mask), kv_mask, pair

    def _project(self, query, value, key, cache, index, masks, use_causal_mask):
        """The projected ``q, k, v`` ``[B, T, H, d]``, the new cache (or None)
        and the call's `Masks` (the written cache slots, causal and window
        positions included). Padding is zeroed before the projections."""
        q = self._query_dense(masking.zero_masked(query, masks.query))
        kv_mask, offset = masks.kv, 0
        if cache is None:
            k = self._key_dense(masking.zero_masked(key, kv_mask))
            v = self._value_dense(masking.zero_masked(value, kv_mask))
            if self.rotary is not None:
                q, k = self._rotate(q, 0), self._rotate(k, 0)
            new_cache = None
        elif index is None:  # cross-attention: the memory projected before
            k, v, new_cache = cache[:, 0], cache[:, 1], cache
        else:
            k, v, new_cache, kv_mask = self._write_cache(
                key, value, cache, index, kv_mask
            )
            if self.rotary is not None:
                q = self._rotate(q, index)
            offset = index
        if cache is not None:
            k, v = masking.zero_masked(k, kv_mask), masking.zero_masked(v, kv_mask)
        masks = masks._replace(
            kv=kv_mask,
            causal_offset=offset if use_causal_mask else None,
            window=self.sliding_window,
            window_offset=offset,
        )
        return q, k, v, new_cache, masks

    def _write_cache(self, key, value, cache, index, kv_mask):
        """Write the new tokens' keys (rotated at their positions) and values
        at ``[index, index + T)``; returns ``k, v``, the cache and the key
        mask with the slots not yet written masked."""
        index = ops.convert_to_tensor(index, "int32")
        steps = length(value)
        new_mask = None
        if kv_mask is not None:  # the new tokens' slice of the cache mask
            new_mask = ops.take(kv_mask, index + ops.arange(steps), axis=1)
        new_keys = self._key_dense(masking.zero_masked(key, new_mask))
        if self.rotary is not None:
            new_keys = self._rotate(new_keys, index)
        new_values = self._value_dense(masking.zero_masked(value, new_mask))
        update = ops.cast(ops.stack([new_keys, new_values], axis=1), cache.dtype)
        zero = ops.zeros((), "int32")
        cache = ops.slice_update(cache, [zero, zero, index, zero, zero], update)
        k, v = cache[:, 0], cache[:, 1]
        written = ops.expand_dims(ops.arange(length(k)) < index + steps, 0)
        kv_mask = written if kv_mask is None else ops.logical_and(kv_mask, written)
        return k, v, cache, kv_mask

    def _output(self, context, gate):
        """The output projection of the heads' context, gated first if asked."""
        context = ops.cast(context, self.compute_dtype)
        if gate is not None:
            context = context * ops.cast(gate, self.compute_dtype)
        return self._output_dense(context)

    def _rotate(self, x, start_index):
        """``x`` ``[B, T, H, key_dim]`` rotated at positions ``start_index + t``."""
        return ops.cast(self.rotary_embedding(x, start_index=start_index), x.dtype)

    def _call_over_axes(
        self, layout, query, value, key, query_mask, value_mask, key_mask,
        attention_mask, return_attention_scores, training, use_causal_mask, cache,
    ):  # fmt: skip
        """A call on higher-rank inputs (`attention_layers.attention_axes`):
        flattened to rank 3, attended, put back."""
        if cache is not None or self.rotary is not None:
            raise self._error(
                "query",
                "a rank-3 tensor with a cache or rotary positions",
                f"shape {_static(query.shape)}",
            )
        self._check_shapes(query.shape, value.shape, key.shape)

        def flat_mask(mask, like):
            if mask is None:
                return None
            check_mask_shape(self, "mask", mask, _static(like.shape)[:-1])
            return attention_axes.flatten(masking.as_bool(mask), layout, feature=False)

        if attention_mask is not None:
            attention_mask = attention_axes.flatten_attention_mask(
                masking.as_bool(attention_mask), layout, query, key, self.num_heads
            )
        out = self._attention_call(
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

    # -- the attention ---------------------------------------------------------
    def _attend(self, q, k, v, masks, training=None, return_scores=False):
        """``(context [B, Tq, H, Dv], scores [B, H, Tq, Tk] or None)`` of the
        projected ``q, k, v`` (`attention_layers.ops.attention`)."""
        return attention.dot_product_attention(
            q,
            k,
            v,
            masks,
            scale=self._inverse_sqrt_key_dim,
            implementation=self.implementation,
            dtype=self.compute_dtype,
            block_size=self.block_size,
            tile_threshold=self.tile_threshold,
            dropout=self.dropout,
            dropout_fn=self._dropout_layer,
            training=training,
            return_scores=return_scores,
            flash_attention=self._flash_attention,
            softmax=self._masked_softmax,
            error=self._error,
        )

    def _dense_mask(self, q, k, masks):
        """The whole boolean mask ``[B, 1 or H, Tq, Tk]``, or ``None``."""
        return dense_mask(q, k, masks)

    # -- Keras' extension points ----------------------------------------------
    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        """The attention of projected ``query`` ``[B, T, H, d]``, ``key`` and
        ``value`` ``[B, S, H, d]`` under a boolean ``attention_mask``
        broadcastable to ``[B, T, S]`` or ``[B, H, T, S]``, as in Keras: a
        subclass may override it (``call`` then passes it the whole mask of
        the call) and call it back with ``super()``.

        Returns:
            ``(attention_output [B, T, H, d], attention_scores or None)``.
        """
        pair = None
        if attention_mask is not None:
            tq, tk = length(query), length(key)
            pair = _attention_mask_4d(
                self, attention_mask, None, self.num_heads, tq, tk
            )
            heads = _static(pair.shape)[1]
            pair = ops.broadcast_to(pair, (ops.shape(query)[0], heads, tq, tk))
            pair = pair[:, 0] if heads == 1 else pair
        masks = Masks(None, None, pair, 0 if use_causal_mask else None)
        return self._attend(query, key, value, masks, training, return_attention_scores)

    def _compute_attention_mask(
        self,
        query,
        value,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
    ):
        """The call's masks merged into one boolean ``[B, Tq, Tk]`` mask
        (``[B, H, Tq, Tk]`` where the attention mask differs by head), or
        None: Keras' helper, for subclasses."""
        tk = length(value)
        query_mask, kv_mask, pair = self._input_masks(
            query, tk, query_mask, value_mask, key_mask, attention_mask
        )
        masks = Masks(
            query_mask,
            kv_mask,
            pair,
            0 if use_causal_mask else None,
            self.sliding_window,
        )
        mask = self._dense_mask(query, value, masks)
        if mask is None or _static(mask.shape)[1] != 1:
            return mask
        return mask[:, 0]

    def _compute_causal_mask(self, query, value=None):
        """Keras' ``[1, Tq, Tk]`` causal mask: query ``i`` sees keys ``j <= i``."""
        value = query if value is None else value
        return ops.expand_dims(masking.causal_mask(length(query), length(value)), 0)

    def _masked_softmax(self, attention_scores, attention_mask=None):
        """Softmax of ``[B, H, Tq, Tk]`` scores in float32 under a mask
        broadcastable to them (a ``[B, Tq, Tk]`` one gets the heads axis);
        fully masked rows give zeros. In the compute dtype."""
        if attention_mask is not None and len(attention_mask.shape) == 3:
            attention_mask = ops.expand_dims(attention_mask, 1)
        weights = masking.masked_softmax(attention_scores, attention_mask)
        return ops.cast(weights, self.compute_dtype)

    def compute_mask(self, query, previous_mask=None):
        # The output has the query's time steps, hence the query's mask.
        return previous_mask

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "output_shape": self.output_shape,
            "attention_axes": self.attention_axes,
            "sliding_window": self.sliding_window,
            "flash_attention": self.flash_attention,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
            "activity_regularizer": keras.regularizers.serialize(
                self.activity_regularizer
            ),
            "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
            "bias_constraint": keras.constraints.serialize(self.bias_constraint),
            "use_gate": self.use_gate,
            "seed": self.seed,
            "implementation": self.implementation,
            "tile_threshold": self.tile_threshold,
            "block_size": self.block_size,
            "rotary": self.rotary,
        }
