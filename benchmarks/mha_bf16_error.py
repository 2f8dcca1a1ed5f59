"""Error of multi-head attention under mixed_bfloat16, ours against the peer.

What the speed ratios under ``mixed_bfloat16`` leave out: whether the two
sides lose the same to bfloat16. Both normalise the scores in float32: ours
by the layer contract (the tiled path through TensorFlow's native bfloat16
softmax where that kernel computes in float32, see
``attention_layers.ops.tiles.native_softmax_is_float32``), the peer because
``keras.ops.dot_product_attention``, which it calls, casts the scores to
float32 on TensorFlow. Both run the products with the weights in bfloat16
(ours takes the scores themselves in float32 under XLA, below). Self-attention of ``x``
``[B=2, T, 512]`` (random normal) with 8 heads of 64: our
``MultiHeadAttention`` (``implementation="auto"``: the tiled path at T=2048)
and the peer, both under ``mixed_bfloat16`` with the same weights, against
the peer in float64 with those weights as the reference. Reported: the
largest and the root-mean-square error of the output and of the gradient of
``sum(output * r)`` (``r`` a fixed random tensor) with respect to ``x``, each
relative to the reference's largest absolute value.

Eagerly by default (TensorFlow without XLA: on oneDNN machines ours takes
the native bfloat16 softmax); ``--xla`` runs both sides compiled with XLA
(ours then takes float32 score products and the cast softmax).

Usage: ``python -m benchmarks.mha_bf16_error [--seq 512,2048] [--xla]``
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

B, D, HEADS, KEY_DIM = 2, 512, 8, 64


def errors(t, xla=False):
    """``{name: {"output": (max, rms), "grad_x": (max, rms)}}`` at length ``t``."""
    import keras
    import numpy as np
    import tensorflow as tf

    import attention_layers as al

    keras.utils.set_random_seed(0)  # the same weights in every run
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B, t, D))
    r = rng.normal(size=(B, t, D))
    layers = {
        "ours": al.MultiHeadAttention(
            num_heads=HEADS, key_dim=KEY_DIM, dtype="mixed_bfloat16"
        ),
        "peer": keras.layers.MultiHeadAttention(
            num_heads=HEADS, key_dim=KEY_DIM, dtype="mixed_bfloat16"
        ),
        "reference": keras.layers.MultiHeadAttention(
            num_heads=HEADS, key_dim=KEY_DIM, dtype="float64"
        ),
    }
    for layer in layers.values():
        layer(x[:, :4], x[:, :4])
    weights = layers["ours"].get_weights()
    for layer in layers.values():
        layer.set_weights(weights)

    def run(layer):
        dtype = "float64" if layer is layers["reference"] else "float32"

        def step(xt):
            with tf.GradientTape() as tape:
                tape.watch(xt)
                out = tf.cast(layer(xt, xt), dtype)
                loss = tf.reduce_sum(out * tf.constant(r, dtype))
            return out, tape.gradient(loss, xt)

        if xla and layer is not layers["reference"]:
            step = tf.function(step, jit_compile=True)
        out, grad = step(tf.constant(x, dtype))
        return np.asarray(out, "float64"), np.asarray(grad, "float64")

    want = run(layers["reference"])
    result = {}
    for name in ("ours", "peer"):
        got = run(layers[name])
        result[name] = {
            what: (
                float(np.max(np.abs(g - w)) / np.max(np.abs(w))),
                float(np.sqrt(np.mean((g - w) ** 2)) / np.max(np.abs(w))),
            )
            for what, g, w in zip(("output", "grad_x"), got, want, strict=True)
        }
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", default="512,2048")
    parser.add_argument("--xla", action="store_true", help="compile with XLA")
    args = parser.parse_args(argv)
    print("| T | tensor | ours max | peer max | ours rms | peer rms |")
    print("|---|---|---|---|---|---|")
    for t in (int(s) for s in args.seq.split(",")):
        res = errors(t, args.xla)
        for what in ("output", "grad_x"):
            o, p = res["ours"][what], res["peer"][what]
            print(
                f"| {t} | {what} | {o[0]:.1e} | {p[0]:.1e} | {o[1]:.1e} | {p[1]:.1e} |"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
