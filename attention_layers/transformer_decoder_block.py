"""The Transformer decoder block (Vaswani et al., 2017), with caches for
incremental decoding."""

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import check_float, check_mask_shape, static_shape
from attention_layers.base import input_error as _input_error
from attention_layers.transformer_block import _Block


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
        num_heads: as in `TransformerEncoderBlock`, and so are
            ``intermediate_dim``, ``key_dim``, ``dropout``, ``activation``,
            ``layer_norm_epsilon``, ``norm_first``, ``kernel_initializer``,
            ``bias_initializer``, ``attention_implementation``, ``seed``,
            ``rotary`` and ``**kwargs``.

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
        self._build_attention("self", shape, shape, hidden, self.rotary)
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
            self._build_attention("cross", shape, encoder_sequence_shape, hidden)
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

        x, *rest = self._attend(
            "self",
            x,
            None,
            training,
            query_mask=dec_mask,
            value_mask=None if cached else dec_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            return_attention_scores=return_attention_scores,
            **kwargs,
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

        x, *rest = self._attend(
            "cross",
            x,
            encoder_sequence,
            training,
            query_mask=dec_mask,
            value_mask=enc_mask,
            return_attention_scores=return_attention_scores,
            cache=cache,
        )
        scores = {}
        if return_attention_scores:
            weights = rest[0]
            scores["cross_attention"] = weights
            scores["alignment"] = ops.mean(weights, axis=1)
        return x, scores

    def compute_mask(self, decoder_sequence, mask=None):
        return mask
