"""Multi-head attention: a drop-in for ``keras.layers.MultiHeadAttention``,
with a KV cache, rotary positions and paths whose memory is linear in length
(``implementation``: direct, fused, tiled, Pallas; docs/layers/multi_head.md).
"""

import math
from operator import attrgetter

import keras
from keras import ops

from attention_layers import kv_cache, masking
from attention_layers.base import (
    check_float,
    check_positive_int,
    config_entries,
    input_error,
)
from attention_layers.base import static_shape as _static
from attention_layers.multi_head_inputs import (
    attention_axes_arg,
    call_over_axes,
    check_shapes,
    input_masks,
    output_shape_arg,
    pairwise_mask,
    rotary_config,
    rotary_layer,
)
from attention_layers.ops import attention, attention_axes
from attention_layers.ops.attention import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_TILE_THRESHOLD,
    IMPLEMENTATIONS,
)
from attention_layers.ops.masks import Masks, dense_mask, length

# Keras' own words for this refusal, which its users may already match.
_FLASH_DROPOUT = (
    "Dropout is not supported when flash attention is enabled. "
    "Please set dropout to 0.0 to use flash attention."
)
_CONFIG_KEYS = (
    "num_heads", "key_dim", "value_dim", "dropout", "use_bias", "output_shape",
    "attention_axes", "sliding_window", "flash_attention", "kernel_initializer",
    "bias_initializer", "kernel_regularizer", "bias_regularizer",
    "activity_regularizer", "kernel_constraint", "bias_constraint", "use_gate",
    "seed", "implementation", "tile_threshold", "block_size", "rotary",
)  # fmt: skip


@keras.saving.register_keras_serializable(package="attention_layers")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention of Vaswani et al. (2017): self, causal and cross.

    ``head_h = softmax(Q_h K_h^T / sqrt(key_dim)) V_h`` with ``Q_h = q W^Q_h``,
    ``K_h = k W^K_h``, ``V_h = v W^V_h``; the output is
    ``concat(head_1..head_H) W^O + b^O``. A drop-in for
    ``keras.layers.MultiHeadAttention``: the same arguments, inputs and
    weights in the same order, so ``set_weights`` copies weights between the
    two and ``from_config`` reads a Keras config. A fully masked query row
    attends to nothing (its output is the output bias) and scores are
    normalised in float32 under mixed precision. Added: a KV cache for
    incremental decoding, rotary positions and a choice of
    ``implementation``; the layer's page (docs/layers/multi_head.md) has the
    details.

    Args:
        num_heads: number of heads ``H``.
        key_dim: size of each head of the query and key projections.
        value_dim: size of each value head; ``None`` means ``key_dim``.
        dropout: fraction of attention weights dropped in training.
        use_bias: whether the projections have biases.
        output_shape: last dimension(s) of the output; ``None`` means the
            query's last dimension.
        attention_axes: the axes attended over (``None``: every axis but the
            batch and the features).
        sliding_window: ``None``, or each query sees the keys within
            ``sliding_window - 1`` positions of its own.
        flash_attention: ``None`` (the backend decides), True or False.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        kernel_regularizer: regularizer of the projection kernels.
        bias_regularizer: regularizer of the projection biases.
        activity_regularizer: regularizer of the projections' outputs and of
            the layer's output (as in Keras).
        kernel_constraint: constraint on the projection kernels.
        bias_constraint: constraint on the projection biases.
        use_gate: gate the heads' output with ``sigmoid(q W^G)`` before the
            output projection (Qiu et al. 2025).
        seed: dropout seed.
        implementation: ``"auto"``, ``"direct"``, ``"tiled"``, ``"fused"`` or
            ``"pallas"``.
        tile_threshold: ``Tq * Tk`` past which ``"auto"`` takes a
            linear-memory path (default ``2**20``).
        block_size: query rows (and key columns) of one tile of ``"tiled"``.
        rotary: rotary positions on queries and keys: ``None``, ``True``, a
            `RotaryEmbedding` or a dict of its arguments; needs an even
            ``key_dim``.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        query: ``[B, Tq, Dq]`` (or higher rank, with ``attention_axes``).
        value: ``[B, Tk, Dv]``; may be ``None`` with a cross-attention cache.
        key: ``[B, Tk, Dk]``, defaults to ``value``.
        query_mask: ``[B, Tq]``.
        value_mask, key_mask: ``[B, Tk]``.
        attention_mask: ``(Tq, Tk)``, ``(B, Tq, Tk)`` or ``(B, H, Tq, Tk)``.
        return_attention_scores: also return the weights ``[B, H, Tq, Tk]``.
        training: whether dropout is active.
        use_causal_mask: query ``i`` sees keys ``j <= i`` only.
        cache: ``[B, 2, S, H, key_dim]`` keys and values (`empty_cache`,
            `compute_cache`), or ``None``.
        cache_update_index: where the new tokens go in a self-attention
            cache; ``None`` for a cross-attention cache.

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

    References:
        Vaswani et al. Attention Is All You Need. NeurIPS 2017.
        https://arxiv.org/abs/1706.03762

        Su et al. RoFormer: Enhanced Transformer with Rotary Position
        Embedding. 2021. https://arxiv.org/abs/2104.09864

        Qiu et al. Gated Attention for Large Language Models. 2025.
        https://arxiv.org/abs/2505.06708
    """

    # Keras' names for the sublayers and arguments (Keras' tests and
    # subclasses written against Keras use them).
    query_dense = property(attrgetter("_query_dense"))
    key_dense = property(attrgetter("_key_dense"))
    value_dense = property(attrgetter("_value_dense"))
    output_dense = property(attrgetter("_output_dense"))
    gate_dense = property(attrgetter("_gate_dense"))
    dropout_layer = property(attrgetter("_dropout_layer"))
    _num_heads = property(attrgetter("num_heads"))
    _key_dim = property(attrgetter("key_dim"))
    _value_dim = property(attrgetter("value_dim"))
    _sliding_window = property(attrgetter("sliding_window"))

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
        self._inverse_sqrt_key_dim = 1.0 / math.sqrt(float(self.key_dim))
        value_dim = check_positive_int(self, "value_dim", value_dim, allow_none=True)
        self.value_dim = value_dim or self.key_dim
        if not 0.0 <= float(dropout) < 1.0:
            raise self._error("dropout", "a float in [0, 1)", repr(dropout))
        self.dropout = dropout
        self.use_bias = use_bias
        self.output_shape = output_shape_arg(self, output_shape)
        self.attention_axes = attention_axes_arg(self, attention_axes)
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
        check_shapes(self, query_shape, value_shape, key_shape)
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
            self.rotary_embedding = rotary_layer(self.rotary, self.dtype_policy)

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        check_shapes(self, query_shape, value_shape, key_shape)
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

    # -- cache -----------------------------------------------------------------
    def compute_cache(self, value, key=None):
        """Project a memory once for cross-attention decoding.

        Args:
            value: ``[B, S, Dv]`` the memory (e.g. the encoder output).
            key: ``[B, S, Dk]``, defaults to ``value``.

        Returns:
            ``[B, 2, S, num_heads, key_dim]``: keys at index 0, values at 1, to
            pass as ``cache`` with ``cache_update_index=None``.
        """
        return kv_cache.project_memory(self, value, key)

    def empty_cache(self, batch_size, max_length):
        """Zeros ``[batch_size, 2, max_length, num_heads, key_dim]`` for
        self-attention decoding, in the compute dtype."""
        return kv_cache.empty(self, batch_size, max_length)

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
            return call_over_axes(
                self, self._attention_call, layout, query, value, key, query_mask,
                value_mask, key_mask, attention_mask, return_attention_scores,
                training, use_causal_mask, cache,
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
        query_mask, kv_mask, pair = input_masks(
            self, query, tk, query_mask, value_mask, key_mask, attention_mask
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
        cross_cache = kv_cache.check_arguments(self, cache, index)
        check_float(self, "query", query)
        if value is None:
            if not cross_cache:
                raise self._error(
                    "value", "a tensor (None only with a cross-attention cache)", "None"
                )
        else:
            check_shapes(self, query.shape, value.shape, key.shape, axes=False)
            check_float(self, "value", value)
            check_float(self, "key", key)
        if cache is not None:
            kv_cache.check(self, query, value, cache, index)

    def _project(self, query, value, key, cache, index, masks, use_causal_mask):
        """The projected ``q, k, v`` ``[B, T, H, d]``, the new cache (or None)
        and the call's `Masks` (the written cache slots, causal and window
        positions included). Padding is zeroed before the projections."""
        q = self._query_dense(masking.zero_masked(query, masks.query))
        offset = 0 if index is None else index
        kv_mask, k, v = masks.kv, None, None
        if cache is None or index is not None:  # new tokens' keys and values
            new_mask = kv_mask
            if cache is not None:  # their slots of the cache's mask
                new_mask = kv_cache.new_tokens_mask(kv_mask, index, length(value))
            k = self._key_dense(masking.zero_masked(key, new_mask))
            v = self._value_dense(masking.zero_masked(value, new_mask))
            if self.rotary is not None:
                q, k = self._rotate(q, offset), self._rotate(k, offset)
        if cache is not None:
            k, v, cache, kv_mask = kv_cache.update(cache, k, v, index, kv_mask)
        masks = masks._replace(
            kv=kv_mask,
            causal_offset=offset if use_causal_mask else None,
            window=self.sliding_window,
            window_offset=offset,
        )
        return q, k, v, cache, masks

    def _output(self, context, gate):
        """The output projection of the heads' context, gated first if asked."""
        context = ops.cast(context, self.compute_dtype)
        if gate is not None:
            context = context * ops.cast(gate, self.compute_dtype)
        return self._output_dense(context)

    def _rotate(self, x, start_index):
        """``x`` ``[B, T, H, key_dim]`` rotated at positions ``start_index + t``."""
        return ops.cast(self.rotary_embedding(x, start_index=start_index), x.dtype)

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
            pair = pairwise_mask(self, attention_mask, query, length(key))
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
        query_mask, kv_mask, pair = input_masks(
            self, query, tk, query_mask, value_mask, key_mask, attention_mask
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
        return {**super().get_config(), **config_entries(self, _CONFIG_KEYS)}
