"""The public layers under contract, each in the configurations worth checking."""

from functools import partial

import attention_layers as al
from tests.cases_hard import CASES as HARD_CASES
from tests.cases_local import CASES as LOCAL_CASES
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
    Case(
        "luong_dot",
        partial(al.LuongAttention, score_mode="dot"),
        query_dim=6,
        bad_ctor=[({"score_mode": "bilinear"}, "score_mode")],
    ),
    Case("luong_general", partial(al.LuongAttention, score_mode="general", scale=True)),
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

CASES += LOCAL_CASES + HARD_CASES

SCORE_CASES = [c for c in CASES if c.kind == "score"]


def ids(cases):
    return [c.id for c in cases]
