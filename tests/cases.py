"""The public layers under contract, each in the configurations worth checking."""

from functools import partial

import keras

import attention_layers as al
from tests.cases_hard import CASES as HARD_CASES
from tests.cases_local import CASES as LOCAL_CASES
from tests.cases_multi_head import CASES as MULTI_HEAD_CASES
from tests.contract import Case

CASES = [
    Case(
        "bahdanau",
        partial(al.BahdanauAttention, units=8),
        bad_ctor=[({"units": 0}, "units"), ({"dropout": 1.5}, "dropout")],
    ),
    Case("bahdanau_normalized", partial(al.BahdanauAttention, units=8, normalize=True)),
    # A tiny block budget forces the blocked evaluation over query rows.
    Case("bahdanau_blocked", partial(al.BahdanauAttention, units=8, block_elements=40)),
    # The accelerators' evaluation: one fused piece, the gradient written out.
    Case(
        "bahdanau_fused",
        partial(al.BahdanauAttention, units=8, implementation="fused"),
        bad_ctor=[
            ({"implementation": "chunked"}, "implementation"),
            ({"block_elements": 0}, "block_elements"),
        ],
    ),
    # Coverage (See et al. 2017), called without `coverage`: the first step.
    Case(
        "bahdanau_coverage",
        partial(al.BahdanauAttention, units=8, use_coverage=True),
    ),
    Case(
        "luong_dot",
        partial(al.LuongAttention, score_mode="dot"),
        query_dim=6,
        bad_ctor=[({"score_mode": "bilinear"}, "score_mode")],
    ),
    Case(
        "luong_general",
        partial(al.LuongAttention, score_mode="general", use_scale=True),
    ),
    Case("luong_concat", partial(al.LuongAttention, score_mode="concat", units=5)),
    Case(
        "luong_location",
        partial(al.LuongAttention, score_mode="location", max_value_length=7),
        bad_ctor=[({"max_value_length": None}, "max_value_length")],
    ),
    Case(
        "scaled_dot_product",
        al.ScaledDotProductAttention,
        query_dim=6,
        bad_ctor=[({"scale": -1.0}, "scale")],
    ),
    Case(
        "attention_pooling",
        partial(al.AttentionPooling, units=8),
        kind="pool",
        bad_ctor=[({"units": -2}, "units")],
    ),
]


def attention_decoder(
    cell=None, dtype=None, input_feeding=True, context_gate=False, **kwargs
):
    """An AttentionDecoder whose sublayers share its dtype policy."""
    if cell is None:
        cell = al.AttentionRNNCell(
            keras.layers.GRUCell(8, dtype=dtype),
            al.BahdanauAttention(units=4, dtype=dtype),
            output_units=7,
            input_feeding=input_feeding,
            context_gate=context_gate,
            dtype=dtype,
        )
    return al.AttentionDecoder(cell, dtype=dtype, **kwargs)


CASES += [
    Case(
        "attention_decoder",
        attention_decoder,
        query_dim=5,
        kind="decoder",
        output_is_context=False,
        bad_ctor=[({"cell": keras.layers.GRUCell(3)}, "cell")],
    ),
    Case(
        # No input feeding: the attention runs once over all decoder states.
        "attention_decoder_no_feeding",
        partial(attention_decoder, input_feeding=False),
        query_dim=5,
        kind="decoder",
        output_is_context=False,
    ),
    Case(
        # Show, Attend and Tell's gate beta_i on the context.
        "attention_decoder_gated",
        partial(attention_decoder, context_gate=True),
        query_dim=5,
        kind="decoder",
        output_is_context=False,
    ),
    Case(
        "attention_decoder_learned_state",
        partial(attention_decoder, learn_initial_state=True),
        query_dim=5,
        kind="decoder",
        output_is_context=False,
    ),
]
CASES += LOCAL_CASES + HARD_CASES + MULTI_HEAD_CASES
# Dropout on the weights: in ScoreAttention (every score layer shares it) and
# in MultiHeadAttention's direct path.
CASES += [
    Case(
        "luong_general_dropout",
        partial(al.LuongAttention, score_mode="general", dropout=0.5, seed=1),
        deterministic_training=False,
    ),
    Case(
        "multi_head_dropout",
        partial(al.MultiHeadAttention, num_heads=2, key_dim=3, dropout=0.5, seed=1),
        query_dim=6,
        heads_axis=1,
        deterministic_training=False,
    ),
]

SCORE_CASES = [c for c in CASES if c.kind == "score"]
DROPOUT_CASES = [c for c in CASES if c.id.endswith("_dropout")]


def ids(cases):
    return [c.id for c in cases]
