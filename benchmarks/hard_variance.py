"""Variance of the REINFORCE gradient of HardAttention, with and without baseline.

The marker task of docs/layers/hard.md: ``T = 8`` vectors per example, one
marked; the target is the label stored at the marked position. For each seed
a model (mean-pooled query, ``HardAttention(units=16)``, ``Dense`` classifier,
``ReinforceLoss`` with the moving-average and the learned baseline) is trained
with ``fit`` for ``--steps`` steps, then frozen: that is the fixed point of
training where the gradient is studied.

At that point, on one fixed batch of ``--batch`` examples, ``--draws``
independent sets of samples are drawn; for each draw the score-function
gradient ``mean_b (L_b - b_b) grad log p(s_b)`` w.r.t. the attention weights
(``W1``, ``W2``, ``v``) is computed with three baselines on the *same* samples:
``b = 0`` (none), the moving average, and moving average + learned. The
variance of an estimator is the trace of the covariance of its draws (the sum
over the weights of each weight's variance); the paired difference of the
mean gradients is printed against its noise level, to show that every baseline
estimates the same gradient (a baseline changes the variance, not the
expectation).

Usage: ``python -m benchmarks.hard_variance [--seeds 0 1 2] [--draws 300]``
(TensorFlow backend; about a minute on two cores).
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import attention_layers as al  # noqa: E402
from attention_layers.hard import reinforce_surrogate  # noqa: E402
from examples.marker_task import CLASSES, NOISE, T, marker_data  # noqa: E402

VARIANTS = ("none", "moving", "moving+learned")


def build(seed):
    keras.utils.set_random_seed(seed)
    seq = keras.Input((T, 1 + CLASSES + NOISE), name="seq")
    label = keras.Input((), dtype="int32", name="label")
    query = keras.layers.GlobalAveragePooling1D()(seq)
    attention = al.HardAttention(units=16, seed=seed)
    context, weights, log_prob, entropy = attention(
        query, seq, return_attention_scores=True, return_log_prob=True
    )
    logits = keras.layers.Dense(CLASSES)(context)
    reinforce = al.ReinforceLoss(
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        learned_baseline=True,
    )
    out = reinforce(label, logits, log_prob, entropy, baseline_features=query)
    train = keras.Model({"seq": seq, "label": label}, out)
    train.compile(optimizer=keras.optimizers.Adam(1e-2))
    parts = keras.Model(seq, [logits, log_prob, query, weights])
    return train, parts, attention, reinforce


def gradient_draws(parts, attention, reinforce, x, y, draws):
    """``{variant: [draws, n_weights]}`` score-function gradients."""
    import tensorflow as tf

    weights = attention.trainable_variables
    moving = reinforce.moving_baseline()
    task = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def one_draw():
        with tf.GradientTape(persistent=True) as tape:
            logits, log_prob, query, _ = parts(x, training=True)
            loss = task.call(y, logits)
            learned = reinforce.baseline_dense(query)[:, 0]
            baselines = {
                "none": 0.0,
                "moving": moving,
                "moving+learned": moving + learned,
            }
            surrogates = {
                k: tf.reduce_mean(reinforce_surrogate(loss, log_prob, b))
                for k, b in baselines.items()
            }
        out = {}
        for k, s in surrogates.items():
            grads = tape.gradient(s, weights)
            out[k] = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
        return out

    result = {k: [] for k in VARIANTS}
    for _ in range(draws):
        for k, g in one_draw().items():
            result[k].append(g.numpy())
    return {k: np.stack(v) for k, v in result.items()}


def run(seed, steps, batch, draws):
    x, y, position = marker_data(steps * 64, seed=seed)
    train, parts, attention, reinforce = build(seed)
    train.fit({"seq": x, "label": y}, batch_size=64, epochs=1, verbose=0)
    x_eval, y_eval, position_eval = marker_data(batch, seed=1000 + seed)
    picked = (parts.predict(x_eval, verbose=0)[3].argmax(-1) == position_eval).mean()
    grads = gradient_draws(parts, attention, reinforce, x_eval, y_eval, draws)
    variance = {k: float(g.var(0, ddof=1).sum()) for k, g in grads.items()}
    # Paired difference with the no-baseline estimator: if both estimate the
    # same gradient, |mean diff|^2 matches its noise level tr(Cov(diff)) / draws.
    agreement = {}
    for k in VARIANTS[1:]:
        diff = grads["none"] - grads[k]
        agreement[k] = (
            float((diff.mean(0) ** 2).sum()),
            float(diff.var(0, ddof=1).sum() / draws),
        )
    return {
        "seed": seed,
        "picked": float(picked),
        "baseline": float(reinforce.moving_baseline()),
        "variance": variance,
        "agreement": agreement,
    }


def table(rows):
    head = (
        "| seed | pick acc. | var, no baseline | var, moving avg. | "
        "var, moving + learned | ratio none / moving | ratio none / learned |"
    )
    lines = [head, "|" + "---|" * 7]

    def line(name, picked, v):
        return (
            f"| {name} | {picked:.2f} | {v['none']:.3g} | {v['moving']:.3g} | "
            f"{v['moving+learned']:.3g} | {v['none'] / v['moving']:.1f} | "
            f"{v['none'] / v['moving+learned']:.1f} |"
        )

    for r in rows:
        lines.append(line(str(r["seed"]), r["picked"], r["variance"]))
    mean = {k: np.mean([r["variance"][k] for r in rows]) for k in VARIANTS}
    lines.append(line("mean", np.mean([r["picked"] for r in rows]), mean))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=12, help="training steps")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--draws", type=int, default=300)
    args = parser.parse_args()
    start = time.time()
    rows = [run(s, args.steps, args.batch, args.draws) for s in args.seeds]
    print(
        f"REINFORCE gradient w.r.t. HardAttention's weights after {args.steps} "
        f"training steps; {args.draws} draws on a batch of {args.batch}.\n"
    )
    print(table(rows))
    print(
        "\nSame expectation: |mean(g_none - g_b)|^2 against its noise level "
        "tr(Cov(g_none - g_b)) / draws (equal in expectation when both are "
        "unbiased):"
    )
    for r in rows:
        parts = [f"{k} {a:.2g} vs {n:.2g}" for k, (a, n) in r["agreement"].items()]
        print(
            f"  seed {r['seed']}: "
            + ", ".join(parts)
            + f" (moving baseline b = {r['baseline']:.3f})"
        )
    print(f"\n{time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
