"""Contract cases of the local attention layers (added to tests/cases.CASES)."""

from functools import partial

import keras

import attention_layers as al
from tests.contract import Case

CASES = [
    Case(
        "local_m_dot",
        partial(al.LocalAttention, mode="monotonic", window=1, score_mode="dot"),
        query_dim=6,
        bad_ctor=[
            ({"mode": "local-x"}, "mode"),
            ({"window": 0}, "window"),
            ({"score_mode": "location"}, "score_mode"),
            ({"units": 0}, "units"),
        ],
    ),
    Case(
        "local_m_general",
        partial(
            al.LocalAttention,
            mode="monotonic",
            window=2,
            score_mode="general",
            use_scale=True,
        ),
    ),
    # D = Tv - 1: every window reaches the last source position.
    Case(
        "local_p_general",
        partial(al.LocalAttention, mode="predictive", window=4, score_mode="general"),
        weights_sum_to_one=False,
    ),
    # Narrower windows; seeded weights, so that the causal clause (the last
    # query must reach the last source position) does not depend on chance.
    Case(
        "local_p_concat",
        partial(
            al.LocalAttention,
            mode="predictive",
            window=2,
            score_mode="concat",
            units=5,
            kernel_initializer=keras.initializers.GlorotUniform(seed=3),
        ),
        weights_sum_to_one=False,
    ),
]
