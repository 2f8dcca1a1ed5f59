"""The attention RNN decoder: a recurrent cell whose context changes at every step.

`AttentionRNNCell` (one step) and `AttentionDecoder` (the cell over a target
sequence) live in their own modules; this one keeps both importable from here.
"""

from attention_layers.attention_decoder import AttentionDecoder
from attention_layers.attention_rnn_cell import AttentionRNNCell

__all__ = ["AttentionDecoder", "AttentionRNNCell"]
