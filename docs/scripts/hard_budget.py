"""Training budget of HardAttention on the marker task: REINFORCE vs Gumbel.

For each seed and estimator, the model of docs/layers/hard.md (mean-pooled
query, ``HardAttention(units=16)``, ``Dense`` classifier; Adam(1e-2), batches
of 64 from 2048 examples, 32 steps per epoch) is trained for ``--epochs``
epochs; after each epoch the fraction of 1000 held-out examples whose argmax
pick is the marked position is printed. REINFORCE trains through
``ReinforceLoss`` (moving-average baseline), Gumbel (``temperature=0.5``) with
the task loss alone.

Usage, from the root of a checkout: ``python docs/scripts/hard_budget.py``
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import keras  # noqa: E402

import attention_layers as al  # noqa: E402
from examples.marker_task import CLASSES, NOISE, T, marker_data  # noqa: E402

SCCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def models(estimator, seed):
    keras.utils.set_random_seed(seed)
    seq = keras.Input((T, 1 + CLASSES + NOISE), name="seq")
    label = keras.Input((), dtype="int32", name="label")
    query = keras.layers.GlobalAveragePooling1D()(seq)
    layer = al.HardAttention(units=16, estimator=estimator, temperature=0.5, seed=seed)
    if estimator == "reinforce":
        context, weights, log_prob, entropy = layer(
            query, seq, return_attention_scores=True, return_log_prob=True
        )
        logits = keras.layers.Dense(CLASSES)(context)
        out = al.ReinforceLoss(SCCE)(label, logits, log_prob, entropy)
        train = keras.Model({"seq": seq, "label": label}, out)
        train.compile(optimizer=keras.optimizers.Adam(1e-2))
    else:
        context, weights = layer(query, seq, return_attention_scores=True)
        logits = keras.layers.Dense(CLASSES)(context)
        train = keras.Model(seq, logits)
        train.compile(optimizer=keras.optimizers.Adam(1e-2), loss=SCCE)
    return train, keras.Model(seq, weights)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    x, y, _ = marker_data(2048, seed=0)
    x_test, _, position = marker_data(1000, seed=1)
    for estimator in ("reinforce", "gumbel"):
        for seed in args.seeds:
            train, infer = models(estimator, seed)
            picks = []
            for _ in range(args.epochs):
                feed = {"seq": x, "label": y} if estimator == "reinforce" else x
                target = None if estimator == "reinforce" else y
                train.fit(feed, target, batch_size=64, epochs=1, verbose=0)
                w = infer.predict(x_test, batch_size=1000, verbose=0)
                picks.append((w.argmax(-1) == position).mean())
            print(
                estimator,
                "seed",
                seed,
                "pick after each epoch:",
                " ".join(f"{p:.2f}" for p in picks),
                flush=True,
            )


if __name__ == "__main__":
    main()
