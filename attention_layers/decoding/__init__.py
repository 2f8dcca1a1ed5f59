"""In-graph decoding: greedy search, beam search (GNMT penalties), sampling.

Every decoder drives a step function ``step_fn(token_ids [N] int32, state) ->
(logits [N, V], new_state, alignment [N, S] or None)``; `rnn_step_fn` builds
one from an embedding, an `AttentionRNNCell` and a projection, and
`transformer_step_fn` from `TransformerDecoderBlock` layers. The decoders
use ``keras.ops`` only and loop with ``keras.ops.while_loop`` over static
buffers, so they run on every backend and compile with XLA.
"""

from attention_layers.decoding.beam import (
    beam_search,
    gnmt_coverage_penalty,
    gnmt_length_penalty,
)
from attention_layers.decoding.common import rnn_step_fn, tile_beams
from attention_layers.decoding.greedy import greedy_search
from attention_layers.decoding.sampling import filter_logits, sample
from attention_layers.decoding.transformer import (
    transformer_initial_state,
    transformer_step_fn,
)

__all__ = [
    "beam_search",
    "filter_logits",
    "gnmt_coverage_penalty",
    "gnmt_length_penalty",
    "greedy_search",
    "rnn_step_fn",
    "sample",
    "tile_beams",
    "transformer_initial_state",
    "transformer_step_fn",
]
