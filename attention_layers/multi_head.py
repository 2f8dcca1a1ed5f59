"""Multi-head attention: self, causal and cross attention with a KV cache.

Three evaluations of the same attention, chosen per call (``implementation``):

* ``"direct"``: the scores ``[B, H, Tq, Tk]`` are materialised, masked and
  normalised in float32; the only path that returns them or applies dropout.
* ``"fused"``: ``keras.ops.dot_product_attention``, the backend's kernel.
* ``"tiled"``: query blocks times key blocks with an online softmax (a running
  maximum and sum) and a hand-written backward pass (``attention_layers.tiled``),
  so that forward and backward memory grow linearly with the sequence lengths.
* ``"pallas"``: JAX's Pallas flash-attention kernel for GPUs
  (``attention_layers.pallas_attention``): linear memory in float32 too.

Every path has the same mask semantics: masked positions get zero weight, a
fully masked query row gets zero weights and a zero context (the output is then
the output projection's bias), and NaN or inf under padding never leaks.
"""

import math
import numbers

import keras
from keras import ops

from attention_layers import devices, masking
from attention_layers.base import (
    check_float,
    check_mask_shape,
    check_positive_int,
    input_error,
    score_dtype,
)
from attention_layers.base import static_shape as _static
from attention_layers.pallas_attention import pallas_attention
from attention_layers.pallas_attention import supports as pallas_supports
from attention_layers.positional import RotaryEmbedding
from attention_layers.tiled import Masks, combine, length, tiled_attention

_NO_MASKS = Masks(None, None, None, None)

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


@keras.saving.register_keras_serializable(package="attention_layers")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention of Vaswani et al. (2017): self, causal and cross.

    ``head_h = softmax(Q_h K_h^T / sqrt(key_dim)) V_h`` with ``Q_h = q W^Q_h``,
    ``K_h = k W^K_h``, ``V_h = v W^V_h``, and the output
    ``concat(head_1..head_H) W^O + b^O``. The weights have the layout and order
    of ``keras.layers.MultiHeadAttention`` (kernels ``[d_in, H, key_dim]`` and
    biases ``[H, key_dim]`` for query, key and value; output kernel
    ``[H, value_dim, d_out]`` and bias ``[d_out]``), so ``set_weights`` copies
    weights between the two.

    Masks follow the library's contract: a masked position gets zero weight; a
    fully masked query row gets zero weights and attends to nothing, so its
    output is the output bias alone (Keras instead spreads it uniformly); NaN
    under padding never leaks. Scores are normalised in float32 under
    ``mixed_float16`` and ``mixed_bfloat16``.

    ``implementation`` picks how the attention is evaluated:

    * ``"direct"``: scores materialised; the only path that returns scores or
      applies dropout.
    * ``"fused"``: ``keras.ops.dot_product_attention`` (inputs cast to float32
      under ``mixed_float16``, whose range the product may overflow); needs
      ``value_dim == key_dim``.
    * ``"tiled"``: blocks of ``block_size`` queries, each over all the keys
      at once while ``block_size * Tk <= 2^20`` (static ``Tk``, not causal),
      else over tiles of ``block_size`` keys with an online softmax; a tiled
      backward pass: memory linear in the lengths, causal tiles above the
      diagonal skipped; no scores, no dropout.
    * ``"pallas"``: JAX's Pallas flash-attention kernel for GPUs (its
      interpreter off a GPU): memory linear in the lengths in float32 too;
      JAX only, equal static query and key lengths, one head size, no key
      or pairwise mask, a causal mask only for queries aligned with the
      keys; no scores, no dropout.
    * ``"auto"``: ``"direct"`` when scores are returned or dropout is active.
      On a GPU or TPU with ``value_dim == key_dim``: ``"fused"`` in 16-bit
      (cuDNN's or the TPU's flash kernel); in float32 ``"pallas"`` past
      ``tile_threshold`` query-key pairs where it serves the call, else
      ``"tiled"`` past 2^26 pairs (8192 x 8192) and ``"fused"`` below. On a
      CPU ``"tiled"`` when the static ``Tq * Tk`` exceeds ``tile_threshold``,
      ``"fused"`` in float32 when ``value_dim == key_dim``, ``"direct"``
      otherwise. Explicit ``"tiled"``, ``"fused"`` or ``"pallas"`` raise where
      they cannot serve a call.

    Rotary positions (``rotary``, Su et al. 2021) rotate the projected
    queries and keys of every head (`RotaryEmbedding`) before the scores, on
    every implementation, so the scores depend on relative positions only.
    Keys are at positions ``0..Tk-1`` and query ``i`` at ``i + Tk - Tq`` (as
    for the causal mask: the same positions in self-attention). With a
    self-attention cache the new keys are rotated at their positions
    ``index + t`` before they are written, and the queries at the same
    positions. Rotary positions are for self-attention: a cross-attention
    cache (``compute_cache``) is refused.

    Incremental decoding uses a cache ``[B, 2, S, H, key_dim]`` (keys at index
    0, values at 1; it needs ``value_dim == key_dim``). Self-attention: pass
    ``cache`` and ``cache_update_index``; the new tokens' keys and values are
    written at ``[index, index + T)`` and the queries attend over the cache,
    where slots from ``index + T`` on (not yet written) are masked, and with
    ``use_causal_mask`` query ``i`` sees slots ``<= index + i``.
    Cross-attention: pass ``cache=layer.compute_cache(memory)`` and no index.
    `TransformerEncoderBlock` and `TransformerDecoderBlock` pass their
    ``rotary`` argument to their self-attention.

    Args:
        num_heads: number of heads ``H``.
        key_dim: size of each head of the query and key projections.
        value_dim: size of each head of the value projection; ``None`` means
            ``key_dim``.
        dropout: fraction of attention weights dropped in training.
        use_bias: whether the projections have biases.
        output_shape: last dimension(s) of the output; ``None`` means the
            query's last dimension.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        implementation: ``"auto"``, ``"direct"``, ``"tiled"`` or ``"fused"``.
        tile_threshold: ``Tq * Tk`` past which ``"auto"`` takes a
            linear-memory path: tiles on a CPU, Pallas' kernel on a GPU in
            float32 (default ``2**20``, e.g. 1024 queries times 1024 keys).
        block_size: query rows of one block of the tiled path, and key columns
            of one tile when it tiles the keys (default 256).
        seed: dropout seed.
        rotary: rotary positions on queries and keys: ``None`` (none),
            ``True`` (``RotaryEmbedding()``), a `RotaryEmbedding`, or a dict
            of its arguments (``{"max_wavelength": 500, "interleaved":
            False}``); needs an even ``key_dim``. ``get_config`` holds the
            dict.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        query: ``[B, Tq, Dq]``.
        value: ``[B, Tv, Dv]``, the memory; may be ``None`` with a
            cross-attention ``cache``.
        key: ``[B, Tv, Dk]``, defaults to ``value``.
        query_mask: ``[B, Tq]``, True where the query position exists.
        value_mask: ``[B, Tv]`` (``[B, S]`` over the cache when one is given),
            True where the memory position may be attended.
        key_mask: like ``value_mask``, combined with it.
        attention_mask: ``[B, Tq, Tv]`` (``[B, Tq, S]`` with a cache).
        return_attention_scores: also return the weights ``[B, H, Tq, Tv]``.
        training: whether dropout is active.
        use_causal_mask: query ``i`` attends only to positions
            ``j <= i + (Tv - Tq)`` (``j <= index + i`` with a self-attention
            cache).
        cache: ``[B, 2, S, H, key_dim]`` keys and values, or ``None``.
        cache_update_index: where the new tokens go in a self-attention
            cache (Python int or scalar int tensor); ``None`` for a
            cross-attention cache. ``index + Tq`` must not pass the cache
            length ``S``: a Python int past it is refused, a tensor one is
            clamped by the update (which then overwrites the last slots).

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
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        implementation="auto",
        tile_threshold=DEFAULT_TILE_THRESHOLD,
        block_size=DEFAULT_BLOCK_SIZE,
        seed=None,
        rotary=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.supports_masking = True
        num_heads = check_positive_int(self, "num_heads", num_heads)
        key_dim = check_positive_int(self, "key_dim", key_dim)
        value_dim = check_positive_int(self, "value_dim", value_dim, allow_none=True)
        if not 0.0 <= float(dropout) < 1.0:
            raise self._error("dropout", "a float in [0, 1)", repr(dropout))
        if implementation not in IMPLEMENTATIONS:
            raise self._error(
                "implementation", f"one of {IMPLEMENTATIONS}", repr(implementation)
            )
        tile_threshold = check_positive_int(self, "tile_threshold", tile_threshold)
        block_size = check_positive_int(self, "block_size", block_size)
        rotary = rotary_config(self, rotary)
        if rotary is not None and key_dim % 2:
            raise self._error(
                "key_dim", "an even size with rotary positions", repr(key_dim)
            )
        if output_shape is not None:
            dims = (output_shape,) if isinstance(output_shape, int) else output_shape
            try:
                for d in dims:
                    check_positive_int(self, "output_shape", d)
            except (TypeError, ValueError):
                raise self._error(
                    "output_shape",
                    "a positive integer or a tuple of them",
                    repr(output_shape),
                ) from None
            output_shape = output_shape if isinstance(output_shape, int) else list(dims)
        if implementation == "fused" and value_dim not in (None, key_dim):
            # keras.ops.dot_product_attention on JAX needs one head size.
            raise self._error(
                "value_dim",
                f"None or key_dim ({key_dim}) with implementation='fused'",
                repr(value_dim),
            )
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim if value_dim is not None else key_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.output_shape = output_shape
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.implementation = implementation
        self.tile_threshold = tile_threshold
        self.block_size = block_size
        self.seed = seed
        self.rotary = rotary

    def _error(self, argument, expected, received):
        return input_error(self, argument, expected, received)

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

    # -- build -------------------------------------------------------------
    def _projection(self, name, input_shape, inner):
        layer = keras.layers.EinsumDense(
            "abc,cde->abde",
            output_shape=(None, self.num_heads, inner),
            bias_axes="de" if self.use_bias else None,
            kernel_initializer=keras.initializers.get(
                keras.initializers.serialize(self.kernel_initializer)
            ),
            bias_initializer=keras.initializers.get(
                keras.initializers.serialize(self.bias_initializer)
            ),
            dtype=self.dtype_policy,
            name=name,
        )
        layer.build(input_shape)
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
        self.query_dense = self._projection("query", query_shape, self.key_dim)
        self.key_dense = self._projection("key", key_shape, self.key_dim)
        self.value_dense = self._projection("value", value_shape, self.value_dim)
        out = self.output_shape
        out = [query_shape[-1]] if out is None else out
        out = [out] if isinstance(out, int) else list(out)
        letters = "efgh"[: len(out)]
        self.output_dense = keras.layers.EinsumDense(
            f"abcd,cd{letters}->ab{letters}",
            output_shape=(None, *out),
            bias_axes=letters if self.use_bias else None,
            kernel_initializer=keras.initializers.get(
                keras.initializers.serialize(self.kernel_initializer)
            ),
            bias_initializer=keras.initializers.get(
                keras.initializers.serialize(self.bias_initializer)
            ),
            dtype=self.dtype_policy,
            name="attention_output",
        )
        self.output_dense.build(
            (query_shape[0], query_shape[1], self.num_heads, self.value_dim)
        )
        self.dropout_layer = keras.layers.Dropout(
            self.dropout, seed=self.seed, dtype=self.dtype_policy
        )
        self.rotary_embedding = None
        if self.rotary is not None:
            self.rotary_embedding = _rotary_layer(self.rotary, self.dtype_policy)

    def _check_shapes(self, query_shape, value_shape, key_shape):
        q, v, k = _static(query_shape), _static(value_shape), _static(key_shape)
        rank3 = "a rank-3 tensor [batch, length, dim]"
        for name, s in (("query", q), ("value", v), ("key", k)):
            if len(s) != 3:
                raise self._error(name, rank3, f"shape {s}")
        if len({q[0], v[0], k[0]} - {None}) > 1:
            raise self._error(
                "value",
                "the same batch size as query and key",
                f"batch sizes query={q[0]}, value={v[0]}, key={k[0]}",
            )
        if None not in (k[1], v[1]) and k[1] != v[1]:
            raise self._error("key", f"the same length as value ({v[1]})", f"shape {k}")

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
        return ops.stack([self.key_dense(key), self.value_dense(value)], axis=1)

    def empty_cache(self, batch_size, max_length):
        """Zeros ``[batch_size, 2, max_length, num_heads, key_dim]`` for
        self-attention decoding, in the compute dtype."""
        if self.value_dim != self.key_dim:
            self._require_cacheable()
        shape = (batch_size, 2, max_length, self.num_heads, self.key_dim)
        return ops.zeros(shape, dtype=self.compute_dtype)

    # -- call ----------------------------------------------------------------
    def _choose(self, training, return_scores, tq, tk, masks=None):
        """The implementation of one call (see the class docstring)."""
        dropping = bool(self.dropout) and bool(training)
        impl = self.implementation
        if impl == "direct":
            return impl
        if impl != "auto":
            self._check_explicit(impl, dropping, return_scores, tq, tk, masks)
            return impl
        if return_scores or dropping:
            return "direct"
        pairs = None if None in (tq, tk) else tq * tk
        if devices.on_accelerator():
            return self._choose_on_accelerator(pairs, tq, tk, masks)
        if pairs is not None and pairs > self.tile_threshold:
            return "tiled"
        fused = self.compute_dtype == "float32" and self.value_dim == self.key_dim
        return "fused" if fused else "direct"

    def _choose_on_accelerator(self, pairs, tq, tk, masks):
        """``"auto"`` on a GPU or TPU: the backend's fused kernel where it
        keeps memory linear (16-bit) or the scores fit, else Pallas' kernel or
        the tiled path."""
        long = pairs is not None and pairs > ACCELERATOR_TILE_THRESHOLD
        if self.value_dim != self.key_dim:
            return "tiled" if long else "direct"
        if self.compute_dtype != "float32":
            return "fused"
        if (
            pairs is not None
            and pairs > self.tile_threshold
            and devices.pallas_attention_available()
            and pallas_supports(
                masks or _NO_MASKS, tq, tk, self.key_dim, self.value_dim
            )
        ):
            return "pallas"
        return "tiled" if long else "fused"

    def _check_explicit(self, impl, dropping, return_scores, tq, tk, masks):
        """Raise where an explicit ``"tiled"``, ``"fused"`` or ``"pallas"``
        cannot serve a call."""
        if return_scores:
            raise self._error(
                "return_attention_scores",
                f"False with implementation={impl!r}, which never "
                "materialises the scores (use 'direct' or 'auto')",
                "True",
            )
        if dropping:
            raise self._error(
                "training",
                f"no dropout with implementation={impl!r} (dropout on "
                "the attention weights needs 'direct' or 'auto')",
                f"training=True with dropout={self.dropout}",
            )
        if impl != "pallas":
            return
        if keras.backend.backend() != "jax" or devices.platform() == "tpu":
            raise self._error(
                "implementation",
                "'pallas' on the JAX backend, on a GPU (or a CPU, interpreted)",
                f"the {keras.backend.backend()} backend on {devices.platform()}",
            )
        if not pallas_supports(
            masks or _NO_MASKS, tq, tk, self.key_dim, self.value_dim
        ):
            raise self._error(
                "implementation",
                "'pallas' for a call it can serve: equal static query and key "
                "lengths, value_dim == key_dim, no key or pairwise mask "
                "(use 'auto' or 'tiled')",
                f"'pallas' with Tq={tq}, Tk={tk}, key_dim={self.key_dim}, "
                f"value_dim={self.value_dim}",
            )

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
        cross_cache = cache is not None and cache_update_index is None
        if cache is None and cache_update_index is not None:
            raise self._error(
                "cache", "a cache tensor along with cache_update_index", "None"
            )
        if cross_cache and self.rotary is not None:
            raise self._error(
                "cache_update_index",
                "an index with rotary positions (a self-attention cache; "
                "rotary positions do not apply to cross-attention)",
                "None",
            )
        if value is None and not cross_cache:
            raise self._error(
                "value", "a tensor (None only with a cross-attention cache)", "None"
            )
        if key is None:
            key = value
        check_float(self, "query", query)
        if value is not None:
            self._check_shapes(query.shape, value.shape, key.shape)
            check_float(self, "value", value)
            check_float(self, "key", key)
        elif len(query.shape) != 3:
            raise self._error(
                "query", "a rank-3 tensor [batch, length, dim]", f"shape {query.shape}"
            )
        batch, tq = _static(query.shape)[:2]
        if cache is not None:
            self._require_cacheable()
            want = (batch, 2, None, self.num_heads, self.key_dim)
            check_mask_shape(self, "cache", cache, want)
            tk = _static(cache.shape)[2]
        else:
            tk = _static(value.shape)[1]
        check_mask_shape(self, "query_mask", query_mask, (batch, tq))
        check_mask_shape(self, "value_mask", value_mask, (batch, tk))
        check_mask_shape(self, "key_mask", key_mask, (batch, tk))
        check_mask_shape(self, "attention_mask", attention_mask, (batch, tq, tk))

        query_mask = masking.as_bool(query_mask)
        kv_mask = masking.and_masks(value_mask, key_mask)
        query = masking.zero_masked(query, query_mask)
        q = self.query_dense(query)
        offset = None
        if cache is None:
            k = self.key_dense(masking.zero_masked(key, kv_mask))
            v = self.value_dense(masking.zero_masked(value, kv_mask))
            new_cache = None
            if self.rotary is not None:
                # Query i sits at key position i + Tk - Tq, as for the causal
                # mask (the same positions in self-attention); both are
                # shifted to start at 0 or more (only differences count).
                shift = length(k) - length(q)
                if isinstance(shift, int):
                    starts = max(shift, 0), max(-shift, 0)
                else:
                    starts = ops.maximum(shift, 0), ops.maximum(-shift, 0)
                q, k = self._rotate(q, starts[0]), self._rotate(k, starts[1])
        elif cross_cache:
            k, v = cache[:, 0], cache[:, 1]
            new_cache = cache
        else:
            self._check_cache_index(cache, value, cache_update_index)
            index = ops.convert_to_tensor(cache_update_index, "int32")
            steps = length(value)
            new_mask = None
            if kv_mask is not None:  # the new tokens' slice of the cache mask
                new_mask = ops.take(kv_mask, index + ops.arange(steps), axis=1)
            new_keys = self.key_dense(masking.zero_masked(key, new_mask))
            if self.rotary is not None:
                q = self._rotate(q, index)
                new_keys = self._rotate(new_keys, index)
            update = ops.stack(
                [new_keys, self.value_dense(masking.zero_masked(value, new_mask))],
                axis=1,
            )
            zero = ops.zeros((), "int32")
            new_cache = ops.slice_update(
                cache,
                [zero, zero, index, zero, zero],
                ops.cast(update, cache.dtype),
            )
            k, v = new_cache[:, 0], new_cache[:, 1]
            written = ops.expand_dims(ops.arange(length(k)) < index + steps, 0)
            kv_mask = written if kv_mask is None else ops.logical_and(kv_mask, written)
            if use_causal_mask:
                offset = index
        if cache is not None:
            k = masking.zero_masked(k, kv_mask)
            v = masking.zero_masked(v, kv_mask)
        if use_causal_mask and offset is None:
            offset = length(k) - length(q)
        masks = Masks(
            query_mask,
            kv_mask,
            masking.as_bool(attention_mask),
            offset,
        )

        impl = self._choose(training, return_attention_scores, tq, tk, masks)
        if impl == "tiled":
            context, scores = self._tiled(q, k, v, masks), None
        elif impl == "pallas":
            context, scores = self._pallas(q, k, v, masks), None
        elif impl == "fused":
            context, scores = self._fused(q, k, v, masks), None
        else:
            context, scores = self._direct(q, k, v, masks, training)
        output = self.output_dense(ops.cast(context, self.compute_dtype))
        result = (output, scores) if return_attention_scores else (output,)
        if cache is not None:
            result += (new_cache,)
        return result[0] if len(result) == 1 else result

    def _rotate(self, x, start_index):
        """``x`` ``[B, T, H, key_dim]`` rotated at positions ``start_index + t``."""
        return ops.cast(self.rotary_embedding(x, start_index=start_index), x.dtype)

    def _score_dtype(self):
        return score_dtype(self.compute_dtype)

    def _scaled_query(self, q):
        dtype = self._score_dtype()
        return ops.cast(q, dtype) * ops.cast(1.0 / math.sqrt(self.key_dim), dtype)

    def _dense_mask(self, q, k, masks):
        """The whole ``[B, Tq, Tk]`` boolean mask, or ``None``."""
        tq, tk = length(q), length(k)
        mask = combine(
            masks,
            ops.arange(tq),
            ops.arange(tk),
            query=masks.query,
            kv=masks.kv,
            pair=masks.pair,
        )
        if mask is None:
            return None
        shape = ops.shape(mask)
        batch = ops.shape(q)[0] if _static(shape)[0] in (None, 1) else shape[0]
        return ops.broadcast_to(mask, (batch, tq, tk))

    def _direct(self, q, k, v, masks, training):
        dtype = self._score_dtype()
        scores = ops.einsum(
            "bqhd,bkhd->bhqk", self._scaled_query(q), ops.cast(k, dtype)
        )
        mask = self._dense_mask(q, k, masks)
        if mask is not None:
            mask = ops.expand_dims(mask, 1)
        weights = ops.cast(masking.masked_softmax(scores, mask), self.compute_dtype)
        dropped = weights
        if self.dropout:
            dropped = self.dropout_layer(weights, training=training)
        context = ops.einsum(
            "bhqk,bkhd->bqhd", dropped, ops.cast(v, self.compute_dtype)
        )
        return context, weights

    def _fused(self, q, k, v, masks):
        dtype = "float32" if self.compute_dtype == "float16" else self.compute_dtype
        mask = self._dense_mask(q, k, masks)
        rows = None
        if mask is not None:
            # A fully masked row would get uniform weights from the kernel:
            # let it attend everywhere (finite values and gradients), then zero
            # its context.
            rows = ops.any(mask, axis=-1)  # [B, Tq]
            mask = ops.logical_or(mask, ops.expand_dims(ops.logical_not(rows), -1))
            mask = ops.expand_dims(mask, 1)
        context = ops.dot_product_attention(
            ops.cast(q, dtype),
            ops.cast(k, dtype),
            ops.cast(v, dtype),
            mask=mask,
            scale=1.0 / math.sqrt(self.key_dim),
        )
        return masking.zero_masked(context, rows)

    def _pallas(self, q, k, v, masks):
        dtype = "float32" if self.compute_dtype == "float16" else self.compute_dtype
        q, k, v = (ops.cast(x, dtype) for x in (q, k, v))
        return pallas_attention(q, k, v, masks, 1.0 / math.sqrt(self.key_dim))

    def _tiled(self, q, k, v, masks):
        return tiled_attention(self._scaled_query(q), k, v, masks, self.block_size)

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
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "implementation": self.implementation,
            "tile_threshold": self.tile_threshold,
            "block_size": self.block_size,
            "seed": self.seed,
            "rotary": self.rotary,
        }
