"""The Transformer encoder block (Vaswani et al., 2017)."""

import keras

from attention_layers import masking
from attention_layers.base import check_float, check_mask_shape, static_shape
from attention_layers.transformer_block import _Block


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
        self._build_attention("self", inputs_shape, inputs_shape, hidden, self.rotary)
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

        x, *scores = self._attend(
            "self",
            x,
            None,
            training,
            query_mask=padding_mask,
            value_mask=padding_mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
        )
        x = masking.zero_masked(self._feed_forward(x, training), padding_mask)
        return (x, scores[0]) if return_attention_scores else x

    def compute_mask(self, inputs, mask=None):
        return mask
