"""Contract cases of the hard attention layers (added to tests/cases.CASES).

The contract checks the deterministic inference path (``training`` unset);
its training clauses (``jit_compile`` fit, MirroredStrategy) use a plain task
loss, which trains the score weights only with the Gumbel estimator. The
REINFORCE estimator, which needs a ``ReinforceLoss`` in the model, gets the
same training checks in tests/test_hard.py.
"""

from functools import partial

import attention_layers as al
from tests.contract import Case

CASES = [
    Case(
        "hard_argmax",
        partial(al.HardAttention, units=8, estimator="gumbel", seed=3),
        continuous_in_values=False,
        deterministic_training=False,  # Gumbel samples in training
        bad_ctor=[
            ({"units": 8, "estimator": "score"}, "estimator"),
            ({"units": 8, "inference": "sample"}, "inference"),
            ({"units": 8, "temperature": 0.0}, "temperature"),
            ({"units": 0}, "units"),
        ],
    ),
    Case(
        "hard_soft_normalized",
        partial(
            al.HardAttention,
            units=8,
            estimator="gumbel",
            inference="soft",
            temperature=0.5,
            normalize=True,
        ),
        deterministic_training=False,
    ),
]
