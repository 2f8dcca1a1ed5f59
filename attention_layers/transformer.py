"""Transformer encoder and decoder blocks (Vaswani et al., 2017).

Each block is attention plus a position-wise feed-forward network, each
sub-layer wrapped in dropout, a residual connection and layer normalisation,
either after the residual (``norm_first=False``, the paper's post-norm) or
before the sub-layer (``norm_first=True``, pre-norm, which trains deep stacks
without warm-up; end a pre-norm stack with a ``LayerNormalization``).
"""

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import (
    check_float,
    check_mask_shape,
    check_positive_int,
    static_shape,
)
from attention_layers.base import input_error as _input_error
from attention_layers.multi_head import MultiHeadAttention, rotary_config


class _Block(keras.layers.Layer):
    """What the encoder and decoder blocks share: arguments, sub-layers, config."""

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        key_dim=None,
        dropout=0.0,
        activation="relu",
        layer_norm_epsilon=1e-5,
        norm_first=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        attention_implementation="auto",
        seed=None,
        rotary=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        num_heads = check_positive_int(self, "num_heads", num_heads)
        intermediate_dim = check_positive_int(
            self, "intermediate_dim", intermediate_dim
        )
        key_dim = check_positive_int(self, "key_dim", key_dim, allow_none=True)
        if not 0.0 <= float(dropout) < 1.0:
            raise _input_error(self, "dropout", "a float in [0, 1)", repr(dropout))
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.key_dim = key_dim
        self.dropout = dropout
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.norm_first = bool(norm_first)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.attention_implementation = attention_implementation
        self.seed = seed
        self.rotary = rotary_config(self, rotary)
        if self.rotary is not None and key_dim is not None and key_dim % 2:
            raise _input_error(
                self, "key_dim", "an even size with rotary positions", repr(key_dim)
            )
        self.supports_masking = True

    def _initializers(self):
        # Fresh initializer objects per sub-layer: a shared seeded one would
        # give every sub-layer the same weights.
        return {
            "kernel_initializer": keras.initializers.get(
                keras.initializers.serialize(self.kernel_initializer)
            ),
            "bias_initializer": keras.initializers.get(
                keras.initializers.serialize(self.bias_initializer)
            ),
        }

    def _hidden_dim(self, shape, argument):
        shape = static_shape(shape)
        if len(shape) != 3 or shape[-1] is None:
            raise _input_error(
                self,
                argument,
                "a rank-3 tensor [batch, length, hidden_dim] with a known hidden_dim",
                f"shape {shape}",
            )
        hidden = shape[-1]
        if self.key_dim is None and hidden % self.num_heads:
            raise _input_error(
                self,
                "key_dim",
                f"an explicit key_dim when hidden_dim ({hidden}) is not a "
                f"multiple of num_heads ({self.num_heads})",
                "None",
            )
        head = self.key_dim or hidden // self.num_heads
        if self.rotary is not None and head % 2:
            raise _input_error(
                self,
                "key_dim",
                "an even head size with rotary positions (set key_dim, or a "
                "hidden_dim that is an even multiple of num_heads)",
                f"head size {head} (hidden_dim {hidden}, {self.num_heads} heads)",
            )
        return hidden

    def _attention(self, name, query_shape, value_shape, hidden, rotary=None):
        layer = MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self.key_dim or hidden // self.num_heads,
            dropout=self.dropout,
            implementation=self.attention_implementation,
            seed=self.seed,
            rotary=rotary,
            dtype=self.dtype_policy,
            name=name,
            **self._initializers(),
        )
        layer.build(query_shape, value_shape)
        return layer

    def _norm(self, name, shape):
        layer = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )
        layer.build(shape)
        return layer

    def _dropout(self, name):
        return keras.layers.Dropout(
            self.dropout, seed=self.seed, dtype=self.dtype_policy, name=name
        )

    def _build_feed_forward(self, shape, hidden):
        self.intermediate_dense = keras.layers.Dense(
            self.intermediate_dim,
            activation=self.activation,
            dtype=self.dtype_policy,
            name="intermediate",
            **self._initializers(),
        )
        self.intermediate_dense.build(shape)
        self.output_dense = keras.layers.Dense(
            hidden, dtype=self.dtype_policy, name="output", **self._initializers()
        )
        self.output_dense.build(tuple(shape[:-1]) + (self.intermediate_dim,))
        self.feed_forward_norm = self._norm("feed_forward_norm", shape)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")

    def _residual(self, x, norm, dropout, sublayer, training):
        """One sub-layer with dropout, residual and pre- or post-norm.

        ``sublayer(y)`` returns the sub-layer output, or a tuple whose first
        item is the output (the rest is passed back unchanged).
        """
        y = norm(x) if self.norm_first else x
        result = sublayer(y)
        extra = ()
        if isinstance(result, tuple):
            result, extra = result[0], result[1:]
        x = x + dropout(result, training=training)
        if not self.norm_first:
            x = norm(x)
        return (x, *extra)

    def _feed_forward(self, x, training):
        def ffn(y):
            return self.output_dense(self.intermediate_dense(y))

        return self._residual(
            x, self.feed_forward_norm, self.feed_forward_dropout, ffn, training
        )[0]

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "key_dim": self.key_dim,
            "dropout": self.dropout,
            "activation": keras.activations.serialize(self.activation),
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "norm_first": self.norm_first,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "attention_implementation": self.attention_implementation,
            "seed": self.seed,
            "rotary": self.rotary,
        }


@keras.saving.register_keras_serializable(package="attention_layers")
class TransformerEncoderBlock(_Block):
    """A Transformer encoder block: self-attention and a feed-forward network.

    Post-norm (``norm_first=False``, Vaswani et al. 2017):
    ``x = LN(x + Dropout(MHA(x, x)))``, then ``x = LN(x + Dropout(FFN(x)))``
    with ``FFN(x) = activation(x W_1 + b_1) W_2 + b_2``. Pre-norm
    (``norm_first=True``): ``x = x + Dropout(MHA(LN(x), LN(x)))``, then
    ``x = x + Dropout(FFN(LN(x)))``. The output has the input's shape
    ``[B, T, hidden_dim]``; stack blocks and add positions to the first
    block's input (`SinusoidalPositionEncoding`, `PositionEmbedding`).

    Padded positions attend to nothing and are attended by nothing, and
    their outputs are set to zero (so garbage or NaN stored under padding
    never leaks); the padding mask is passed on as the Keras mask of the
    output.

    Args:
        num_heads: number of attention heads.
        intermediate_dim: width of the feed-forward network's hidden layer.
        key_dim: size of each attention head; ``None`` means
            ``hidden_dim // num_heads``.
        dropout: dropout rate on the attention weights and on every
            sub-layer's output before its residual.
        activation: activation of the feed-forward hidden layer.
        layer_norm_epsilon: epsilon of the layer normalisations.
        norm_first: pre-norm (True) or the paper's post-norm (False).
        kernel_initializer: initializer of every kernel.
        bias_initializer: initializer of every bias.
        attention_implementation: the ``implementation`` of the
            `MultiHeadAttention` sub-layers.
        seed: dropout seed.
        rotary: rotary positions in the self-attention, the ``rotary`` of
            `MultiHeadAttention` (``None``, ``True``, a `RotaryEmbedding` or a
            dict of its arguments); then the inputs need no added positions.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        inputs: ``[B, T, hidden_dim]``.
        padding_mask: ``[B, T]``, True on real tokens. Defaults to the Keras
            mask of ``inputs`` (e.g. from ``Embedding(mask_zero=True)``),
            which Keras passes as ``mask`` (or ``inputs_mask`` when other
            tensors are passed too).
        attention_mask: ``[B, T, T]``, True where query ``i`` may attend key
            ``j``; combined with the padding mask.
        return_attention_scores: also return the attention weights.
        training: whether dropout is active.

    Returns:
        ``outputs`` ``[B, T, hidden_dim]``, or ``(outputs, scores)`` with the
        self-attention weights ``scores`` ``[B, num_heads, T, T]``.

    Example:

    >>> import numpy as np
    >>> block = TransformerEncoderBlock(num_heads=2, intermediate_dim=16)
    >>> x = np.random.rand(2, 5, 8).astype("float32")
    >>> mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    >>> out = np.asarray(block(x, padding_mask=mask))
    >>> out.shape, bool((out[1, 3:] == 0).all())
    ((2, 5, 8), True)

    References:
        Vaswani et al. Attention Is All You Need. NeurIPS 2017.
        https://arxiv.org/abs/1706.03762

        Xiong et al. On Layer Normalization in the Transformer Architecture.
        ICML 2020 (pre-norm). https://arxiv.org/abs/2002.04745
    """

    def build(self, inputs_shape):
        hidden = self._hidden_dim(inputs_shape, "inputs")
        self.self_attention = self._attention(
            "self_attention", inputs_shape, inputs_shape, hidden, self.rotary
        )
        self.self_attention_norm = self._norm("self_attention_norm", inputs_shape)
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self._build_feed_forward(inputs_shape, hidden)

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        mask=None,
        inputs_mask=None,
    ):
        self._hidden_dim(inputs.shape, "inputs")
        check_float(self, "inputs", inputs)
        if padding_mask is None:
            padding_mask = mask if mask is not None else inputs_mask
        batch, length = static_shape(inputs.shape)[:2]
        check_mask_shape(self, "padding_mask", padding_mask, (batch, length))
        check_mask_shape(
            self, "attention_mask", attention_mask, (batch, length, length)
        )
        padding_mask = masking.as_bool(padding_mask)
        x = masking.zero_masked(inputs, padding_mask)

        def attend(y):
            return self.self_attention(
                y,
                y,
                query_mask=padding_mask,
                value_mask=padding_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )

        x, *scores = self._residual(
            x, self.self_attention_norm, self.self_attention_dropout, attend, training
        )
        x = masking.zero_masked(self._feed_forward(x, training), padding_mask)
        return (x, scores[0]) if return_attention_scores else x

    def compute_mask(self, inputs, mask=None):
        return mask


@keras.saving.register_keras_serializable(package="attention_layers")
class TransformerDecoderBlock(_Block):
    """A Transformer decoder block: causal self-attention, optional
    cross-attention over an encoder memory, and a feed-forward network.

    Post-norm (``norm_first=False``, Vaswani et al. 2017):
    ``x = LN(x + Dropout(MHA(x, x, causal)))``,
    ``x = LN(x + Dropout(MHA(x, memory)))`` (with a memory),
    ``x = LN(x + Dropout(FFN(x)))``; pre-norm applies ``LN`` to each
    sub-layer's input instead. The block has cross-attention when it is built
    with an ``encoder_sequence`` (its first call), and is decoder-only
    otherwise.

    For incremental decoding the block takes the caches of its
    `MultiHeadAttention` sub-layers: a self-attention cache
    ``[B, 2, L, num_heads, key_dim]`` (``block.self_attention.empty_cache``)
    written at ``self_attention_cache_update_index``, and a cross-attention
    cache (``block.cross_attention.compute_cache(memory)``, computed once).
    One token at a time through the caches gives the outputs of one causal
    call over the whole sequence. `transformer_step_fn` and
    `transformer_initial_state` in `attention_layers.decoding` wire this to
    the decoders.

    Padded decoder positions get zero outputs, as in
    `TransformerEncoderBlock`.

    Args:
        num_heads: number of attention heads.
        intermediate_dim: width of the feed-forward network's hidden layer.
        key_dim: size of each attention head; ``None`` means
            ``hidden_dim // num_heads``.
        dropout: dropout rate on the attention weights and on every
            sub-layer's output before its residual.
        activation: activation of the feed-forward hidden layer.
        layer_norm_epsilon: epsilon of the layer normalisations.
        norm_first: pre-norm (True) or the paper's post-norm (False).
        kernel_initializer: initializer of every kernel.
        bias_initializer: initializer of every bias.
        attention_implementation: the ``implementation`` of the
            `MultiHeadAttention` sub-layers.
        seed: dropout seed.
        rotary: rotary positions in the self-attention, the ``rotary`` of
            `MultiHeadAttention` (``None``, ``True``, a `RotaryEmbedding` or a
            dict of its arguments); then the inputs need no added positions.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        decoder_sequence: ``[B, T, hidden_dim]``, the target-side inputs.
        encoder_sequence: ``[B, S, D_enc]``, the memory, or None (decoder-only
            block, or with a ``cross_attention_cache``).
        decoder_padding_mask: ``[B, T]``, True on real target tokens.
            Defaults to the Keras mask of ``decoder_sequence``. With a
            self-attention cache it masks the new queries only: the decoded
            prefix in the cache is taken to be unpadded.
        encoder_padding_mask: ``[B, S]``, True on real source tokens.
            Defaults to the Keras mask of ``encoder_sequence``.
        decoder_attention_mask: ``[B, T, T]`` (``[B, T, L]`` with a cache),
            an extra self-attention mask.
        self_attention_cache: ``[B, 2, L, num_heads, key_dim]`` or None.
        self_attention_cache_update_index: where the new tokens are written
            in the self-attention cache (int or scalar int tensor); also
            their position for the causal mask and for ``rotary``.
        cross_attention_cache: ``[B, 2, S, num_heads, key_dim]`` from
            ``block.cross_attention.compute_cache(memory)``, or None.
        use_causal_mask: the causal self-attention mask (True by default).
        return_attention_scores: also return the attention weights.
        training: whether dropout is active.
        mask, decoder_sequence_mask, encoder_sequence_mask: filled by Keras
            from implicit masks; use the padding masks above instead.

    Returns:
        ``outputs`` ``[B, T, hidden_dim]``. With ``return_attention_scores``
        a dict follows: ``"self_attention"`` ``[B, num_heads, T, T or L]``
        and, with cross-attention, ``"cross_attention"``
        ``[B, num_heads, T, S]`` and ``"alignment"`` ``[B, T, S]`` (the
        cross-attention weights averaged over heads). When a cache is given,
        the tuple ends with ``self_attention_cache`` (updated) and
        ``cross_attention_cache`` (as given; either may be None).

    Example:

    >>> import numpy as np
    >>> block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    >>> x = np.random.rand(2, 4, 8).astype("float32")
    >>> memory = np.random.rand(2, 6, 8).astype("float32")
    >>> full = np.asarray(block(x, memory))
    >>> cache = block.self_attention.empty_cache(2, 4)
    >>> cross = block.cross_attention.compute_cache(memory)
    >>> step, cache, cross = block(
    ...     x[:, :1], self_attention_cache=cache,
    ...     self_attention_cache_update_index=0, cross_attention_cache=cross)
    >>> full.shape, bool(np.allclose(step, full[:, :1], atol=1e-5))
    ((2, 4, 8), True)

    References:
        Vaswani et al. Attention Is All You Need. NeurIPS 2017.
        https://arxiv.org/abs/1706.03762
    """

    has_cross_attention = False  # set by build()

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        hidden = self._hidden_dim(decoder_sequence_shape, "decoder_sequence")
        shape = decoder_sequence_shape
        self.self_attention = self._attention(
            "self_attention", shape, shape, hidden, self.rotary
        )
        self.self_attention_norm = self._norm("self_attention_norm", shape)
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.has_cross_attention = encoder_sequence_shape is not None
        if self.has_cross_attention:
            enc = static_shape(encoder_sequence_shape)
            if len(enc) != 3 or enc[-1] is None:
                raise _input_error(
                    self,
                    "encoder_sequence",
                    "a rank-3 tensor [batch, length, dim] with a known dim",
                    f"shape {enc}",
                )
            self.cross_attention = self._attention(
                "cross_attention", shape, encoder_sequence_shape, hidden
            )
            self.cross_attention_norm = self._norm("cross_attention_norm", shape)
            self.cross_attention_dropout = self._dropout("cross_attention_dropout")
        self._build_feed_forward(shape, hidden)

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        decoder_attention_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        use_causal_mask=True,
        return_attention_scores=False,
        training=None,
        mask=None,
        decoder_sequence_mask=None,
        encoder_sequence_mask=None,
    ):
        self._check_call(
            decoder_sequence,
            encoder_sequence,
            self_attention_cache,
            self_attention_cache_update_index,
            cross_attention_cache,
        )
        dec_mask, enc_mask = self._padding_masks(
            decoder_sequence,
            encoder_sequence,
            decoder_padding_mask,
            encoder_padding_mask,
            keras_masks=(mask, decoder_sequence_mask, encoder_sequence_mask),
        )
        x = masking.zero_masked(decoder_sequence, dec_mask)
        x, scores, new_cache = self._self_attend(
            x,
            dec_mask,
            decoder_attention_mask,
            self_attention_cache,
            self_attention_cache_update_index,
            use_causal_mask,
            return_attention_scores,
            training,
        )
        if self.has_cross_attention:
            x, cross_scores = self._cross_attend(
                x,
                encoder_sequence,
                dec_mask,
                enc_mask,
                cross_attention_cache,
                return_attention_scores,
                training,
            )
            scores.update(cross_scores)
        x = masking.zero_masked(self._feed_forward(x, training), dec_mask)
        result = (x,)
        if return_attention_scores:
            result += (scores,)
        if self_attention_cache is not None or cross_attention_cache is not None:
            result += (new_cache, cross_attention_cache)
        return result[0] if len(result) == 1 else result

    def _check_call(
        self,
        decoder_sequence,
        encoder_sequence,
        self_attention_cache,
        self_attention_cache_update_index,
        cross_attention_cache,
    ):
        """Refuse inputs that do not fit the block or each other."""
        self._hidden_dim(decoder_sequence.shape, "decoder_sequence")
        check_float(self, "decoder_sequence", decoder_sequence)
        cross = encoder_sequence is not None or cross_attention_cache is not None
        if cross and not self.has_cross_attention:
            raise _input_error(
                self,
                "encoder_sequence",
                "None: this block was built without cross-attention (build it "
                "with an encoder_sequence on the first call)",
                "a memory",
            )
        if self.has_cross_attention and not cross:
            raise _input_error(
                self,
                "encoder_sequence",
                "a memory or a cross_attention_cache (the block has cross-attention)",
                "None",
            )
        if encoder_sequence is not None:
            check_float(self, "encoder_sequence", encoder_sequence)
        if (self_attention_cache is None) != (
            self_attention_cache_update_index is None
        ):
            raise _input_error(
                self,
                "self_attention_cache_update_index",
                "an index exactly when self_attention_cache is given",
                f"cache {'None' if self_attention_cache is None else 'given'}, "
                f"index {self_attention_cache_update_index!r}",
            )

    def _padding_masks(
        self,
        decoder_sequence,
        encoder_sequence,
        decoder_padding_mask,
        encoder_padding_mask,
        keras_masks,
    ):
        """The decoder and encoder padding masks, shape-checked, as bool.

        Each defaults to the Keras mask of its sequence: ``keras_masks`` is
        ``(mask, decoder_sequence_mask, encoder_sequence_mask)`` as Keras
        filled them.
        """
        mask, decoder_sequence_mask, encoder_sequence_mask = keras_masks
        if decoder_padding_mask is None:
            decoder_padding_mask = (
                mask if decoder_sequence_mask is None else decoder_sequence_mask
            )
        if encoder_padding_mask is None:
            encoder_padding_mask = encoder_sequence_mask
        batch, length = static_shape(decoder_sequence.shape)[:2]
        check_mask_shape(
            self, "decoder_padding_mask", decoder_padding_mask, (batch, length)
        )
        if encoder_sequence is not None:
            check_mask_shape(
                self,
                "encoder_padding_mask",
                encoder_padding_mask,
                static_shape(encoder_sequence.shape)[:2],
            )
        return (
            masking.as_bool(decoder_padding_mask),
            masking.as_bool(encoder_padding_mask),
        )

    def _self_attend(
        self,
        x,
        dec_mask,
        attention_mask,
        cache,
        cache_update_index,
        use_causal_mask,
        return_attention_scores,
        training,
    ):
        """The causal self-attention sub-layer: ``x``, the scores dict (with
        ``"self_attention"`` if asked for) and the updated cache (or None).

        With a cache the keys are the cached prefix and the new tokens, taken
        to be unpadded: the padding mask masks the new queries only.
        """
        cached = cache is not None
        kwargs = {}
        if cached:
            kwargs = {"cache": cache, "cache_update_index": cache_update_index}

        def attend(y):
            return self.self_attention(
                y,
                y,
                query_mask=dec_mask,
                value_mask=None if cached else dec_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                **kwargs,
            )

        x, *rest = self._residual(
            x, self.self_attention_norm, self.self_attention_dropout, attend, training
        )
        scores = {}
        if return_attention_scores:
            scores["self_attention"] = rest.pop(0)
        return x, scores, rest.pop(0) if cached else None

    def _cross_attend(
        self,
        x,
        encoder_sequence,
        dec_mask,
        enc_mask,
        cache,
        return_attention_scores,
        training,
    ):
        """The cross-attention sub-layer over the memory (or its ``cache``):
        ``x`` and the scores dict (``"cross_attention"`` and ``"alignment"``,
        the weights averaged over heads, if asked for)."""

        def attend(y):
            return self.cross_attention(
                y,
                encoder_sequence,
                query_mask=dec_mask,
                value_mask=enc_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                cache=cache,
            )

        x, *rest = self._residual(
            x, self.cross_attention_norm, self.cross_attention_dropout, attend, training
        )
        scores = {}
        if return_attention_scores:
            weights = rest[0]
            scores["cross_attention"] = weights
            scores["alignment"] = ops.mean(weights, axis=1)
        return x, scores

    def compute_mask(self, decoder_sequence, mask=None):
        return mask
