"""Draw docs/images/hard_attention.png: HardAttention's weights on the marker task.

Trains the marker-task model of docs/layers/hard.md with REINFORCE (a few
seconds) and shows, for 12 held-out examples, the attention distribution
``p`` before training, when half of the picks first become right, and after
training (``inference="soft"``), then the position picked after training
(``inference="argmax"``); the marked position of each example is circled.

Usage, from the root of a checkout: ``python docs/scripts/plot_hard.py``.
"""

import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import attention_layers as al  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from examples.marker_task import CLASSES, NOISE, T, marker_data  # noqa: E402

EPOCHS = 4
OUT = pathlib.Path(__file__).resolve().parents[1] / "images" / "hard_attention.png"


def soft_weights(layer, x):
    """``p``: the layer's weights with ``inference="soft"``."""
    soft = al.HardAttention.from_config({**layer.get_config(), "inference": "soft"})
    query = x.mean(1)
    soft(query, x)
    soft.set_weights(layer.get_weights())
    return keras.ops.convert_to_numpy(soft(query, x, return_attention_scores=True)[1])


def main():
    keras.utils.set_random_seed(0)
    seq = keras.Input((T, 1 + CLASSES + NOISE), name="seq")
    label = keras.Input((), dtype="int32", name="label")
    query = keras.layers.GlobalAveragePooling1D()(seq)
    attention = al.HardAttention(units=16, seed=0)
    context, weights, log_prob, entropy = attention(
        query, seq, return_attention_scores=True, return_log_prob=True
    )
    logits = keras.layers.Dense(CLASSES)(context)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    out = al.ReinforceLoss(loss)(label, logits, log_prob, entropy)
    train = keras.Model({"seq": seq, "label": label}, out)
    train.compile(optimizer=keras.optimizers.Adam(1e-2))
    infer = keras.Model(seq, weights)

    x, y, _ = marker_data(2048, seed=0)
    x_test, _, position = marker_data(12, seed=1)
    x_check, _, position_check = marker_data(500, seed=2)
    before = soft_weights(attention, x_test)
    middle = None
    for epoch in range(EPOCHS):
        for chunk in range(0, len(x), 512):  # evaluate every 8 steps
            part = slice(chunk, chunk + 512)
            train.fit({"seq": x[part], "label": y[part]}, batch_size=64, verbose=0)
            picked = infer.predict(x_check, verbose=0).argmax(-1)
            if middle is None and (picked == position_check).mean() >= 0.5:
                step = (epoch * len(x) + chunk + 512) // 64
                middle = step, soft_weights(attention, x_test)
    after = soft_weights(attention, x_test)
    picked = infer.predict(x_test, verbose=0)

    panels = [
        ("p before training", before),
        (f"p after {middle[0]} steps\n(half the picks right)", middle[1]),
        (f'p after {EPOCHS * len(x) // 64} steps\n(inference="soft")', after),
        ('position picked\n(inference="argmax")', picked),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(13, 4.6), sharey=True)
    for ax, (title, w) in zip(axes, panels, strict=True):
        image = ax.imshow(w, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.scatter(
            position,
            np.arange(len(position)),
            s=160,
            facecolors="none",
            edgecolors="red",
            linewidths=1.5,
        )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("position j")
        ax.set_xticks(range(T))
    axes[0].set_ylabel("held-out example")
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(
        "HardAttention trained with REINFORCE on the marker task "
        "(red circle: marked position)",
        y=1.03,
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110, bbox_inches="tight")
    print(f"wrote {OUT.relative_to(OUT.parents[2])}")


if __name__ == "__main__":
    main()
