"""Contract cases of MultiHeadAttention (added to tests/cases.CASES).

Its weights are ``[B, H, Tq, Tv]`` (``heads_axis=1``). The output bias starts
at zero, so a fully masked row's output (the bias alone) is zero as the
contract wants, while a non-zero context would show through the random output
kernel.
"""

from functools import partial

import attention_layers as al
from tests.contract import Case

CASES = [
    # Self-attention shapes: the query and the memory have the same width.
    Case(
        "multi_head_self",
        partial(al.MultiHeadAttention, num_heads=2, key_dim=3),
        query_dim=6,
        heads_axis=1,
        bad_ctor=[
            ({"num_heads": 0}, "num_heads"),
            ({"implementation": "flash"}, "implementation"),
            ({"key_dim": -1}, "key_dim"),
            ({"dropout": 1.0}, "dropout"),
            ({"block_size": 0}, "block_size"),
        ],
    ),
    Case(
        "multi_head_cross",
        partial(al.MultiHeadAttention, num_heads=3, key_dim=2, value_dim=4),
        heads_axis=1,
    ),
    # Rotary positions on queries and keys, both counted from 0 (the causal
    # mask's alignment, Keras'), on the contract's cross-shaped inputs.
    Case(
        "multi_head_rotary",
        partial(
            al.MultiHeadAttention,
            num_heads=2,
            key_dim=4,
            rotary={"max_wavelength": 100, "interleaved": False},
        ),
        heads_axis=1,
        bad_ctor=[
            ({"rotary": "yes"}, "rotary"),
            ({"key_dim": 3}, "key_dim"),
        ],
    ),
    # tile_threshold=1 sends every call that returns no scores (the XLA and
    # tf.distribute training steps) through the tiled path, 2 x 2 tiles over
    # lengths 4 and 5; calls that return scores fall back to the direct path.
    Case(
        "multi_head_tiled",
        partial(
            al.MultiHeadAttention,
            num_heads=2,
            key_dim=3,
            tile_threshold=1,
            block_size=2,
        ),
        heads_axis=1,
    ),
]
