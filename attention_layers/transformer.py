"""Transformer encoder and decoder blocks (Vaswani et al., 2017).

Each block is attention plus a position-wise feed-forward network, each
sub-layer wrapped in dropout, a residual connection and layer normalisation,
either after the residual (``norm_first=False``, the paper's post-norm) or
before the sub-layer (``norm_first=True``, pre-norm, which trains deep stacks
without warm-up; end a pre-norm stack with a ``LayerNormalization``). Each
block lives in its own module; this one keeps both importable from here.
"""

from attention_layers.transformer_decoder_block import TransformerDecoderBlock
from attention_layers.transformer_encoder_block import TransformerEncoderBlock

__all__ = ["TransformerDecoderBlock", "TransformerEncoderBlock"]
