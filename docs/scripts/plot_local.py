"""Plot the local-p weights of a toy input: docs/images/local_attention.png.

Run from the root of a checkout: ``python docs/scripts/plot_local.py``.
The predictive weights are set by hand so that p_t sweeps the source from
start to end, as a trained local-p alignment roughly does; the 20 source
positions have 4 padded ones at the end, so p_t runs up to the real length 16.
"""

import pathlib

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import attention_layers as al  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent.parent / "images" / "local_attention.png"
TQ, TV, DIM, WINDOW, REAL = 12, 20, 8, 3, 16


def toy_weights():
    rng = np.random.default_rng(0)
    query = rng.normal(scale=0.3, size=(1, TQ, DIM)).astype("float32")
    query[0, :, 0] = np.linspace(-1.2, 1.2, TQ)  # the decoder's progress
    value = rng.normal(size=(1, TV, DIM)).astype("float32")
    value_mask = np.arange(TV)[None] < REAL
    layer = al.LocalAttention(mode="predictive", window=WINDOW, score_mode="dot")
    layer(query, value, value_mask=value_mask)  # build
    w_p = np.zeros((DIM, DIM), "float32")
    w_p[0, 0] = 1.0
    v_p = np.zeros(DIM, "float32")
    v_p[0] = 3.5
    layer.W_p.assign(w_p)  # p_t = S sigmoid(3.5 tanh(h_t[0]))
    layer.v_p.assign(v_p)
    _, weights, p = layer(
        query,
        value,
        value_mask=value_mask,
        return_attention_scores=True,
        return_positions=True,
    )
    return np.asarray(weights)[0], np.asarray(p)[0]


def main():
    weights, p = toy_weights()
    fig, ax = plt.subplots(figsize=(7, 4.4), dpi=110)
    image = ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0)
    steps = np.arange(TQ)
    ax.errorbar(
        p,
        steps,
        xerr=WINDOW,
        fmt="o",
        color="w",
        markersize=3,
        elinewidth=0.8,
        capsize=3,
        label=r"$p_t$ and $[p_t - D, p_t + D]$",
    )
    ax.axvspan(
        REAL - 0.5,
        TV - 0.5,
        facecolor="none",
        hatch="//",
        edgecolor="0.7",
        label="padding (S = 16 real positions)",
    )
    ax.set_xlim(-0.5, TV - 0.5)
    ax.set_xlabel("source position s")
    ax.set_ylabel("decoder step t")
    ax.set_title(
        rf"local-p weights, D={WINDOW}: softmax in $[p_t-D, p_t+D]$"
        r" $\times\ \exp(-(s-p_t)^2 / 2\sigma^2)$"
    )
    ax.legend(loc="lower left", fontsize=8, framealpha=0.6)
    fig.colorbar(image, ax=ax, label="weight")
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT)
    print(f"wrote {OUT.name}: p_t from {p.min():.1f} to {p.max():.1f}")


if __name__ == "__main__":
    main()
