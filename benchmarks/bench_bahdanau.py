"""BahdanauAttention(units=256) against Dense + keras.layers.AdditiveAttention.

Teacher-forced scoring of B=32 queries of Tq=128 steps over Tv=128 memory
states of dimension 256 (random normal float32), in ``tf.function`` without
XLA and with fixed input signatures, for a forward pass and for a forward and
backward pass (``tf.GradientTape`` w.r.t. the trainable weights). The peer is
what Keras offers for the same score: ``AdditiveAttention()`` (whose learned
``scale`` plays the role of ``v``) after two ``Dense(256, use_bias=False)``
projections of the query and the key.

Speed: the two candidates and a 1024x1024 float32 ``tf.matmul`` run in turn,
round by round, in one process; the report gives the median and spread of the
per-round ratio peer/ours (> 1: ours is faster) and the efficiency against the
matmul of the same round. Memory: one child process per (implementation, mode)
reports its peak RSS growth over the RSS just before its first call (see
``paired.measure_peak``).

FLOPs counted per forward pass (the same for both, which compute the same
function): the projections ``2*B*(Tq+Tv)*D*U``; the score ``4*B*Tq*Tv*U``
(add, tanh counted as 1, multiply by v, sum over U); the softmax
``5*B*Tq*Tv``; the context ``2*B*Tq*Tv*D``. A backward pass is counted as
twice the forward, so forward+backward is 3x. Most of the score work is the
elementwise tanh, which is memory- and transcendental-bound, not a matmul, so
the efficiency against the matmul peak is low by nature.

Usage: ``python -m benchmarks.bench_bahdanau [--pairs N] [--json out.json]``.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import paired  # noqa: E402

B, TQ, TV, D, UNITS = 32, 128, 128, 256, 256
IMPLS = ("ours", "peer")
MODES = ("fwd", "fwd+bwd")
# Memory only: Model.fit on tf.data batches whose lengths vary (96, 112, 128
# steps, B=32), so the train step is traced with lengths unknown, as under a
# pipeline's length bucketing.
FIT = "fit, varying lengths"
MEMORY_MODES = (*MODES, FIT)


def flops(mode):
    """FLOPs of one pass, as counted in the module docstring."""
    fwd = (
        2 * B * (TQ + TV) * D * UNITS
        + 4 * B * TQ * TV * UNITS
        + 5 * B * TQ * TV
        + 2 * B * TQ * TV * D
    )
    return fwd if mode == "fwd" else 3 * fwd


def inputs():
    import tensorflow as tf

    query = tf.random.normal((B, TQ, D), seed=11)
    value = tf.random.normal((B, TV, D), seed=12)
    return query, value


def build(impl, options=None):
    """``(call(query, value) -> context, [W1, W2, v])`` of one candidate."""
    import keras
    import numpy as np

    import attention_layers as al

    keras.utils.set_random_seed(0)
    if impl == "ours":
        layer = al.BahdanauAttention(units=UNITS, **(options or {}))

        def call(query, value):
            return layer(query, value)

    else:
        wq = keras.layers.Dense(UNITS, use_bias=False, name="wq")
        wk = keras.layers.Dense(UNITS, use_bias=False, name="wk")
        att = keras.layers.AdditiveAttention()

        def call(query, value):
            return att([wq(query), value, wk(value)])

    # Build the weights on tiny inputs: a full-size eager pass would raise the
    # memory baseline and cost time; the weights depend only on D.
    call(np.zeros((1, 2, D), "float32"), np.zeros((1, 3, D), "float32"))
    if impl == "ours":
        weights = [layer.query_dense.kernel, layer.key_dense.kernel, layer.v]
    else:
        weights = [wq.kernel, wk.kernel, att.scale]
    return call, weights


def compiled(call, weights, mode):
    """The ``tf.function`` of one pass, traced once for the fixed shapes."""
    import tensorflow as tf

    sig = [
        tf.TensorSpec((B, TQ, D), tf.float32),
        tf.TensorSpec((B, TV, D), tf.float32),
    ]
    if mode == "fwd":
        return tf.function(call, input_signature=sig, jit_compile=False)

    def step(query, value):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(call(query, value))
        return loss, tape.gradient(loss, weights)

    return tf.function(step, input_signature=sig, jit_compile=False)


def check_same_function():
    """Max |ours - peer| of the contexts with the peer given our weights."""
    import numpy as np

    ours, ours_w = build("ours")
    peer, peer_w = build("peer")
    for src, dst in zip(ours_w, peer_w, strict=True):
        dst.assign(src)
    query, value = inputs()
    return float(np.max(np.abs(ours(query, value) - peer(query, value))))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# -- speed ---------------------------------------------------------------------
def speed(pairs, reps, warmup, options=None):
    query, value = inputs()
    mm, mm_flops = paired.matmul_peak()
    results = {}
    for mode in MODES:
        fns = {}
        for impl in IMPLS:
            fn = compiled(*build(impl, options), mode)
            fns[impl] = lambda fn=fn: fn(query, value)
        fns["matmul"] = mm
        log(f"[speed {mode}] {warmup} warm-up rounds, {pairs} timed rounds")

        def progress(r, n, last, mode=mode):
            t = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in last.items())
            log(f"  [{mode} {r}/{n}] {t}")

        times, cpu = paired.paired_rounds(fns, pairs, reps, warmup, progress)
        gflops_mm = [mm_flops / t / 1e9 for t in times["matmul"]]
        entry = {
            "ratio_peer_over_ours": paired.summary(
                paired.ratios(times["peer"], times["ours"])
            ),
            "cpu_ratio_peer_over_ours": paired.summary(
                paired.ratios(cpu["peer"], cpu["ours"])
            ),
            "matmul_gflops": paired.summary(gflops_mm),
            "flops_per_pass": flops(mode),
        }
        for impl in IMPLS:
            gf = [flops(mode) / t / 1e9 for t in times[impl]]
            entry[impl] = {
                "ms": paired.summary([t * 1e3 for t in times[impl]]),
                "cpu_ms": paired.summary([t * 1e3 for t in cpu[impl]]),
                "gflops": paired.summary(gf),
                "efficiency": paired.summary(
                    [a / b for a, b in zip(gf, gflops_mm, strict=True)]
                ),
                "query_steps_per_s": paired.summary([B * TQ / t for t in times[impl]]),
            }
        results[mode] = entry
    return results


# -- memory --------------------------------------------------------------------
def fit_worker(impl, calls, options=None):
    """Child process: peak RSS growth of ``calls`` steps of ``Model.fit``."""
    import keras
    import tensorflow as tf

    call, _ = build(impl, options)
    query_in, value_in = keras.Input((None, D)), keras.Input((None, D))
    model = keras.Model([query_in, value_in], call(query_in, value_in))
    model.compile(optimizer="adam", loss=lambda _, context: keras.ops.mean(context**2))
    spec = tf.TensorSpec((B, None, D), tf.float32)

    def batches():
        for step in range(10**6):
            tq, tv = (96, 112, 128)[step % 3], (128, 96, 112)[step % 3]
            query = tf.random.normal((B, tq, D), seed=step)
            yield (query, tf.random.normal((B, tv, D), seed=step + 1)), 0.0

    data = tf.data.Dataset.from_generator(
        batches, output_signature=((spec, spec), tf.TensorSpec((), tf.float32))
    )
    model.fit(data, steps_per_epoch=3, verbose=0)  # traced before the baseline
    result = paired.measure_peak(
        lambda: model.fit(data, steps_per_epoch=3, verbose=0), calls
    )
    paired.emit({"impl": impl, "mode": FIT, **result})


def worker(impl, mode, calls, options=None):
    """Child process: build, then the peak RSS growth of ``calls`` passes."""
    if mode == FIT:
        return fit_worker(impl, calls, options)
    query, value = inputs()
    fn = compiled(*build(impl, options), mode)
    # Trace (and build the graph) before the baseline: the trace is not a pass.
    fn.get_concrete_function()
    result = paired.measure_peak(lambda: fn(query, value), calls)
    paired.emit({"impl": impl, "mode": mode, **result})


def memory(calls, options=None):
    results = {}
    for mode in MEMORY_MODES:
        for impl in IMPLS:
            args = ["--worker", impl, mode, "--calls", str(calls)]
            for name, value in (options or {}).items():
                args += [f"--{name.replace('_', '-')}", str(value)]
            t0 = time.perf_counter()
            r = paired.run_worker("benchmarks.bench_bahdanau", args)
            results[f"{impl} {mode}"] = r
            log(
                f"[memory] {impl} {mode}: peak +{paired.mib(r['peak_bytes']):.0f} MiB"
                f" ({time.perf_counter() - t0:.0f} s)"
            )
    return results


# -- report --------------------------------------------------------------------
def report(command, env, diff, spd, mem):
    out = [
        "# BahdanauAttention vs Dense + AdditiveAttention",
        "",
        f"Command: `{command}`",
        "",
        f"Shapes: B={B}, Tq={TQ}, Tv={TV}, D={D}, units={UNITS}, float32, "
        "tf.function(jit_compile=False), fixed input signature.",
        f"Same function check: max |ours - peer| with shared weights = {diff:.2e}",
        "",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        "",
    ]
    if spd:
        n = spd["fwd"]["ratio_peer_over_ours"]["n"]
        out += [
            f"## Speed ({n} alternating rounds; median [IQR; min-max])",
            "",
            "Ratio = peer time / our time per round (> 1: ours faster). "
            "Efficiency = GFLOP/s over the 1024^3 fp32 matmul GFLOP/s of the "
            "same round.",
            "",
        ]
        ratio_rows, rate_rows = [], []
        for mode in MODES:
            e, o, p = spd[mode], spd[mode]["ours"], spd[mode]["peer"]
            ratio_rows.append(
                [
                    mode,
                    paired.fmt_spread(e["ratio_peer_over_ours"]),
                    paired.fmt_spread(e["cpu_ratio_peer_over_ours"]),
                    f"{o['ms']['median']:.1f}",
                    f"{p['ms']['median']:.1f}",
                ]
            )
            rate_rows.append(
                [
                    mode,
                    f"{e['flops_per_pass'] / 1e9:.2f}",
                    f"{e['matmul_gflops']['median']:.1f}",
                    f"{o['gflops']['median']:.1f}",
                    f"{p['gflops']['median']:.1f}",
                    f"{o['efficiency']['median']:.1%}",
                    f"{p['efficiency']['median']:.1%}",
                    f"{o['query_steps_per_s']['median']:.0f}",
                    f"{p['query_steps_per_s']['median']:.0f}",
                ]
            )
        out += [
            paired.markdown_table(
                [
                    "pass",
                    "ratio peer/ours (wall)",
                    "ratio peer/ours (CPU time)",
                    "ours ms",
                    "peer ms",
                ],
                ratio_rows,
            ),
            "",
            "Throughput (medians over rounds):",
            "",
            paired.markdown_table(
                [
                    "pass",
                    "GFLOP/pass",
                    "matmul GFLOP/s",
                    "ours GFLOP/s",
                    "peer GFLOP/s",
                    "ours eff.",
                    "peer eff.",
                    "ours query steps/s",
                    "peer query steps/s",
                ],
                rate_rows,
            ),
        ]
        out.append("")
    if mem:
        out += [
            "## Peak memory (child process per point; peak RSS - RSS before "
            "the first pass)",
            "",
        ]
        rows = []
        for mode in (m for m in MEMORY_MODES if f"ours {m}" in mem):
            o, p = mem[f"ours {mode}"], mem[f"peer {mode}"]
            rows.append(
                [
                    mode,
                    f"{paired.mib(o['peak_bytes']):.0f}",
                    f"{paired.mib(p['peak_bytes']):.0f}",
                    f"{o['peak_bytes'] / p['peak_bytes']:.3f}",
                    f"{paired.mib(o['baseline_bytes']):.0f} / "
                    f"{paired.mib(p['baseline_bytes']):.0f}",
                    "yes" if o["new_peak"] and p["new_peak"] else "no (upper bound)",
                ]
            )
        out.append(
            paired.markdown_table(
                [
                    "pass",
                    "ours MiB",
                    "peer MiB",
                    "ratio ours/peer",
                    "baseline RSS MiB ours / peer",
                    "peak exceeded baseline",
                ],
                rows,
            )
        )
        out += [
            "",
            f"The peer's [B, Tq, Tv, units] float32 tensor alone is "
            f"{paired.mib(B * TQ * TV * UNITS * 4):.0f} MiB.",
        ]
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20, help="timed rounds")
    parser.add_argument("--reps", type=int, default=1, help="calls per sample")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds")
    parser.add_argument("--calls", type=int, default=3, help="passes per memory run")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--block-elements", type=int, help="our block budget (default: the library's)"
    )
    parser.add_argument(
        "--implementation",
        choices=("auto", "blocks", "fused"),
        help="our score's evaluation (default: the layer's, auto)",
    )
    parser.add_argument(
        "--worker", nargs=2, metavar=("IMPL", "MODE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    options = {
        k: v
        for k, v in (
            ("block_elements", args.block_elements),
            ("implementation", args.implementation),
        )
        if v is not None
    }
    if args.worker:
        worker(*args.worker, args.calls, options)
        return
    if args.pairs < 1:
        parser.error("--pairs must be positive")

    command = "python -m benchmarks.bench_bahdanau " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    t0 = time.perf_counter()
    env = {**paired.environment(), **options}
    diff = check_same_function()
    spd = (
        None if args.skip_speed else speed(args.pairs, args.reps, args.warmup, options)
    )
    mem = None if args.skip_memory else memory(args.calls, options)
    text = report(command.strip(), env, diff, spd, mem)
    text += f"\n\nTotal benchmark time: {time.perf_counter() - t0:.0f} s"
    print(text)
    if args.json:
        paired.write_json(
            args.json,
            command.strip(),
            env,
            max_abs_diff=diff,
            speed=spd,
            memory=mem,
        )


if __name__ == "__main__":
    main()
