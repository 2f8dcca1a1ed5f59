"""MultiHeadAttention against keras.layers.MultiHeadAttention, same weights.

Self-attention of ``x`` ``[B=8, T, d=512]`` (random normal) with 8 heads of
``key_dim=64``, for T in {128, 512, 2048}, under the ``float32`` and
``mixed_bfloat16`` dtype policies, in ``tf.function`` with
``jit_compile=True`` (XLA) and ``False``, with fixed input signatures. Two
passes: the forward pass, and forward + backward (``tf.GradientTape`` of
``sum(output)`` with respect to the trainable weights and to ``x``).

``ours`` is ``attention_layers.MultiHeadAttention(num_heads=8, key_dim=64)``
with ``implementation="auto"`` (``--impls`` adds other implementations as
further candidates); ``peer`` is ``keras.layers.MultiHeadAttention`` with the
same arguments, given our weights with ``set_weights`` (the layouts are the
same); the largest output difference is reported per point.

For every (dtype, XLA, T, pass) the candidates and a 1024x1024 ``tf.matmul``
in the compute dtype (float32 or bfloat16, without XLA) run in turn, round by
round, in one process (order reversed every other round), after warm-up
rounds; the report gives the median and spread of the per-round ratio
peer time / our time (> 1: ours faster) and the efficiency against the
matmul of the same round. Each candidate's first call (trace, compile, one
pass) is timed on its own.

FLOPs counted per forward pass (matrix products only, the same for both): the
four projections ``8*B*T*d*d`` (query, key, value and output, ``H*key_dim =
d``), the scores and the context ``4*B*T*T*d``. Forward + backward counts 3x
the forward.

Usage: ``python -m benchmarks.bench_multi_head [--seq 128,512,2048]
[--dtypes float32,mixed_bfloat16] [--jit on,off] [--passes fwd,fwd+bwd]
[--pairs N] [--pairs-large N] [--impls auto,...] [--skip DTYPE:JIT:T:PASS]
[--causal] [--json out]``; ``--causal`` runs causal self-attention on both
sides (the FLOP count and efficiency stay those of full attention). The
defaults take about 20 minutes on 2 shared cores, most of it in the T=2048
points; a quick run: ``--seq 128,512 --pairs 5``. T >= 2048 runs
``--pairs-large`` rounds after one warm-up round.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from benchmarks import paired  # noqa: E402

B, D, HEADS, KEY_DIM = 8, 512, 8, 64
PASSES = ("fwd", "fwd+bwd")
LARGE_T = 2048
DEFAULT_SKIP = ()  # e.g. "float32:off:2048:fwd+bwd" to leave a slow point out


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def flops(t, mode):
    fwd = 8 * B * t * D * D + 4 * B * t * t * D
    return fwd if mode == "fwd" else 3 * fwd


def build(dtype, impls):
    """name -> layer (ours per implementation, then the peer), same weights."""
    import keras
    import numpy as np

    import attention_layers as al

    keras.utils.set_random_seed(0)
    layers = {}
    for impl in impls:
        name = "ours" if impl == "auto" else f"ours_{impl}"
        layers[name] = al.MultiHeadAttention(
            num_heads=HEADS, key_dim=KEY_DIM, implementation=impl, dtype=dtype
        )
    layers["peer"] = keras.layers.MultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, dtype=dtype
    )
    tiny = np.zeros((1, 2, D), "float32")
    for layer in layers.values():
        layer(tiny, tiny)  # build on a tiny input
    weights = layers["ours"].get_weights() if "ours" in layers else None
    weights = weights or next(iter(layers.values())).get_weights()
    for layer in layers.values():
        layer.set_weights(weights)
    return layers


def compiled(layer, t, mode, jit, causal=False):
    import tensorflow as tf

    sig = [tf.TensorSpec((B, t, D), tf.float32)]

    def attend(x):
        return layer(x, x, use_causal_mask=causal)

    if mode == "fwd":
        return tf.function(attend, input_signature=sig, jit_compile=jit)

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.cast(attend(x), tf.float32))
        return loss, tape.gradient(loss, [x, *layer.trainable_weights])

    return tf.function(step, input_signature=sig, jit_compile=jit)


def run_point(dtype, jit, t, passes, impls, pairs, warmup, skip, causal=False):
    import numpy as np
    import tensorflow as tf

    layers = build(dtype, impls)
    x = tf.random.normal((B, t, D), seed=3)
    compute = "bfloat16" if "bfloat16" in dtype else "float32"
    mm, mm_flops = paired.matmul_peak(dtype=compute)
    results = {}
    for mode in passes:
        key = f"{dtype}:{'on' if jit else 'off'}:{t}:{mode}"
        if key in skip:
            log(f"[{key}] skipped")
            results[mode] = {"skipped": True}
            continue
        fns, first, outputs = {}, {}, {}
        for name, layer in layers.items():
            fn = compiled(layer, t, mode, jit, causal)
            t0 = time.perf_counter()
            out = fn(x)
            out = out if mode == "fwd" else out[0]
            outputs[name] = np.asarray(tf.cast(out, tf.float32))
            first[name] = time.perf_counter() - t0
            fns[name] = lambda fn=fn: [v.numpy() for v in tf.nest.flatten(fn(x))]
        diff = {
            name: float(np.max(np.abs(outputs[name] - outputs["peer"])))
            for name in layers
            if name != "peer"
        }
        fns["matmul"] = lambda: mm().numpy()
        log(
            f"[{key}] first calls "
            + ", ".join(f"{k} {v:.1f} s" for k, v in first.items())
            + f"; {warmup} warm-up + {pairs} rounds"
        )

        def progress(r, n, last, key=key):
            if r % 5 == 0 or r == n:
                msg = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in last.items())
                log(f"  [{key} {r}/{n}] ms: {msg}")

        wall, cpu = paired.paired_rounds(fns, pairs, 1, warmup, progress)
        mm_gf = [mm_flops / s / 1e9 for s in wall["matmul"]]
        entry = {
            "flops": flops(t, mode),
            "matmul_gflops": paired.summary(mm_gf),
            "max_abs_diff_vs_peer": diff,
        }
        for name in layers:
            gf = [flops(t, mode) / s / 1e9 for s in wall[name]]
            entry[name] = {
                "first_call_s": first[name],
                "ms": paired.summary([s * 1e3 for s in wall[name]]),
                "gflops": paired.summary(gf),
                "efficiency": paired.summary(
                    [a / b for a, b in zip(gf, mm_gf, strict=True)]
                ),
                "tokens_per_s": paired.summary([B * t / s for s in wall[name]]),
            }
            if name != "peer":
                entry[name]["ratio_peer_over"] = paired.summary(
                    paired.ratios(wall["peer"], wall[name])
                )
                entry[name]["cpu_ratio_peer_over"] = paired.summary(
                    paired.ratios(cpu["peer"], cpu[name])
                )
        results[mode] = entry
        r = entry["ours"]["ratio_peer_over"] if "ours" in entry else None
        if r:
            log(f"[{key}] ratio peer/ours {paired.fmt_spread(r)}")
    return results


def report(command, env, points, impls, elapsed, causal=False):
    ours = ["ours" if i == "auto" else f"ours_{i}" for i in impls]
    out = [
        "# MultiHeadAttention vs keras.layers.MultiHeadAttention",
        "",
        f"Command: `{command}`",
        "",
        f"{'Causal self' if causal else 'Self'}-attention, B={B}, d={D}, "
        f"{HEADS} heads of key_dim {KEY_DIM}; "
        "tf.function with fixed input signatures; ratio = peer time / our time "
        "per round (> 1: ours faster); efficiency = GFLOP/s over the 1024^3 "
        "matmul GFLOP/s (compute dtype) of the same round.",
        "",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        "",
    ]
    headers = [
        "dtype",
        "XLA",
        "T",
        "pass",
        "rounds",
        *(f"ratio peer/{n} (wall)" for n in ours),
        "ratio peer/ours (CPU)",
        *(f"{n} ms" for n in ours),
        "peer ms",
        "matmul GFLOP/s",
        *(f"{n} eff." for n in ours),
        "peer eff.",
        "ours tokens/s",
        "max abs diff",
        "first call s ours / peer",
    ]
    rows = []
    for (dtype, jit, t), res in points.items():
        for mode, e in res.items():
            if e.get("skipped"):
                rows.append(
                    [dtype, jit, t, mode, "not run"] + [""] * (len(headers) - 5)
                )
                continue
            main = ours[0]
            rows.append(
                [
                    dtype,
                    "on" if jit else "off",
                    t,
                    mode,
                    e["peer"]["ms"]["n"],
                    *(paired.fmt_spread(e[n]["ratio_peer_over"]) for n in ours),
                    f"{e[main]['cpu_ratio_peer_over']['median']:.2f}",
                    *(f"{e[n]['ms']['median']:.1f}" for n in ours),
                    f"{e['peer']['ms']['median']:.1f}",
                    f"{e['matmul_gflops']['median']:.0f}",
                    *(f"{e[n]['efficiency']['median']:.0%}" for n in ours),
                    f"{e['peer']['efficiency']['median']:.0%}",
                    f"{e[main]['tokens_per_s']['median']:.0f}",
                    f"{max(e['max_abs_diff_vs_peer'].values()):.1e}",
                    f"{e[main]['first_call_s']:.1f} / {e['peer']['first_call_s']:.1f}",
                ]
            )
    out.append(paired.markdown_table(headers, rows))
    out += ["", f"Total benchmark time: {elapsed:.0f} s"]
    return "\n".join(out)


def _list(text, cast=str):
    return [cast(v) for v in text.split(",") if v]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", default="128,512,2048", help="lengths T")
    parser.add_argument("--dtypes", default="float32,mixed_bfloat16")
    parser.add_argument("--jit", default="on,off", help="on, off or on,off")
    parser.add_argument("--passes", default="fwd,fwd+bwd")
    parser.add_argument("--impls", default="auto", help="our implementations")
    parser.add_argument("--pairs", type=int, default=15, help="rounds, T < 2048")
    parser.add_argument("--pairs-large", type=int, default=5, help="rounds, T>=2048")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds")
    parser.add_argument(
        "--skip",
        default=",".join(DEFAULT_SKIP),
        help="DTYPE:JIT:T:PASS points to leave out (comma-separated; '' for none)",
    )
    parser.add_argument(
        "--causal",
        action="store_true",
        help="causal self-attention (use_causal_mask=True) on both sides",
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    seqs = _list(args.seq, int)
    impls = _list(args.impls)
    if "auto" not in impls:
        impls = ["auto", *impls]
    skip = set(_list(args.skip))
    command = "python -m benchmarks.bench_multi_head " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    t0 = time.perf_counter()
    env = paired.environment()
    points = {}
    for dtype in _list(args.dtypes):
        for jit in [j == "on" for j in _list(args.jit)]:
            for t in seqs:
                pairs = args.pairs_large if t >= LARGE_T else args.pairs
                points[(dtype, jit, t)] = run_point(
                    dtype,
                    jit,
                    t,
                    _list(args.passes),
                    impls,
                    pairs,
                    args.warmup if t < LARGE_T else 1,
                    skip,
                    args.causal,
                )
    elapsed = time.perf_counter() - t0
    print(report(command.strip(), env, points, impls, elapsed, args.causal))
    if args.json:
        paired.write_json(
            args.json,
            command.strip(),
            env,
            points=[
                {"dtype": d, "jit": j, "T": t, "results": r}
                for (d, j, t), r in points.items()
            ],
        )


if __name__ == "__main__":
    main()
