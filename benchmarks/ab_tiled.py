"""Versions of ``attention_layers/ops/tiled.py`` against each other and the peer.

Day-to-day drift on these machines is as large as the changes one makes to the
tiled path (ratios against the peer move by up to 0.1 between days), so a
change is measured here in one process against the code before it. Each
version is loaded from its own file (its tiles, where it imports them, from
``attention_layers/ops/tiles.py``) and traced into its own
``MultiHeadAttention(implementation="tiled")`` (the kernels' call to
``tiled_attention`` is pointed at that version while its ``tf.function``
traces), all with the same weights, then timed in alternating rounds with
``keras.layers.MultiHeadAttention`` (same setup as ``bench_multi_head``:
self-attention, B=8, d=512, 8 heads).
Prints each version's median time, its ratio peer / version, and the largest
difference of its output (forward) or gradient with respect to ``x``
(forward + backward) from the first version's.

Usage::

    mkdir -p runs
    git show HEAD~1:attention_layers/ops/tiled.py > runs/tiled_before.py
    python -m benchmarks.ab_tiled runs/tiled_before.py attention_layers/ops/tiled.py \\
        --dtype mixed_bfloat16 --jit off --pass fwd+bwd --rounds 7
"""

import argparse
import importlib.util
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from benchmarks import paired  # noqa: E402
from benchmarks.bench_multi_head import HEADS, KEY_DIM, B, D, compiled  # noqa: E402


def load(path):
    """``tiled_attention`` of the module in the file ``path``."""
    name = "tiled_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tiled_attention


def run(paths, t, dtype, jit, mode, rounds):
    """``{label: {"ms", "ratio_peer_over", "max_diff"}}`` for each version."""
    import keras
    import numpy as np
    import tensorflow as tf

    import attention_layers as al
    from attention_layers.ops import attention as kernels

    versions = {f"{i}:{os.path.basename(p)}": load(p) for i, p in enumerate(paths)}
    keras.utils.set_random_seed(0)
    layers = {
        label: al.MultiHeadAttention(
            num_heads=HEADS, key_dim=KEY_DIM, implementation="tiled", dtype=dtype
        )
        for label in versions
    }
    layers["peer"] = keras.layers.MultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, dtype=dtype
    )
    tiny = np.zeros((1, 2, D), "float32")
    for layer in layers.values():
        layer(tiny, tiny)
    weights = next(iter(layers.values())).get_weights()
    for layer in layers.values():
        layer.set_weights(weights)

    x = tf.random.normal((B, t, D), seed=3)
    fns, checked = {}, {}
    original = kernels.tiled_attention
    for label, layer in layers.items():
        fn = compiled(layer, t, mode, jit)
        kernels.tiled_attention = versions.get(label, original)
        try:
            out = fn(x)  # traces with this version
        finally:
            kernels.tiled_attention = original
        checked[label] = np.asarray(
            tf.cast(out if mode == "fwd" else out[1][0], tf.float32)
        )
        fns[label] = lambda fn=fn: [v.numpy() for v in tf.nest.flatten(fn(x))]
    wall, _ = paired.paired_rounds(fns, rounds, warmup=1)
    first = checked[next(iter(versions))]
    return {
        label: {
            "ms": paired.summary([s * 1e3 for s in wall[label]]),
            "ratio_peer_over": paired.summary(paired.ratios(wall["peer"], wall[label])),
            "max_diff": float(np.max(np.abs(checked[label] - first))),
        }
        for label in versions
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="tiled.py versions, first = base")
    parser.add_argument("--seq", type=int, default=2048, help="length T")
    parser.add_argument("--dtype", default="mixed_bfloat16")
    parser.add_argument("--jit", default="off", choices=["on", "off"])
    parser.add_argument("--pass", dest="mode", default="fwd+bwd")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    results = run(
        args.paths, args.seq, args.dtype, args.jit == "on", args.mode, args.rounds
    )
    what = "output" if args.mode == "fwd" else "grad x"
    print(f"T={args.seq} {args.dtype} XLA {args.jit} {args.mode}, {args.rounds} rounds")
    for label, r in results.items():
        print(
            f"{label}: {r['ms']['median']:.0f} ms, peer/this "
            f"{paired.fmt_spread(r['ratio_peer_over'])}, "
            f"max |{what} - first's| {r['max_diff']:.1e}"
        )
    print(f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
