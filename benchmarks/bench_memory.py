"""Peak memory of multi-head attention forward + backward as the length grows.

Self-attention of ``x`` ``[B=1, T, d=512]`` with 8 heads of ``key_dim=64``,
float32, for T in {1024, 4096, 8192}: one training-like pass (``sum(output)``
and its gradient with respect to ``x`` and the trainable weights, in
``tf.function``, ``jit_compile=False`` by default). Candidates:

* ``ours``: ``attention_layers.MultiHeadAttention(implementation="tiled")``:
  tiles of 256 queries x 256 keys with an online softmax and a tiled backward
  pass (``attention_layers/ops/tiled.py``), so memory should grow linearly in T;
* ``peer``: ``keras.layers.MultiHeadAttention``, which materialises the
  ``[B, 8, T, T]`` scores (``8 * T * T * 4`` bytes: 2 GiB at T=8192) and keeps
  what the backward pass needs of them, so memory should grow with T^2.

Each point runs in a fresh child process (``paired.run_worker``): build,
trace, then the peak resident memory (``VmHWM``, reset just before the calls)
of ``--calls`` passes minus the resident memory just before them
(``paired.measure_peak``). A point whose estimate (4 score-sized tensors for
the peer) exceeds ``--limit-gb`` or the memory available now is not run, and
the report says so with the reason. Growth = peak at 2T / peak at T, per
doubling of the length (4x for quadratic, 2x for linear).

Usage: ``python -m benchmarks.bench_memory [--seq 1024,4096,8192]
[--calls N] [--limit-gb 12] [--jit on|off] [--json out]`` (a few minutes).
"""

import argparse
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from benchmarks import paired  # noqa: E402

B, D, HEADS, KEY_DIM = 1, 512, 8, 64
IMPLS = ("ours", "peer")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def scores_bytes(t):
    return B * HEADS * t * t * 4


def estimate_bytes(impl, t):
    """A rough upper estimate of a point's peak, to decide whether to run it."""
    activations = 12 * B * t * D * 4
    if impl == "peer":  # scores, weights, their gradients
        return 4 * scores_bytes(t) + activations
    return activations + 4 * B * HEADS * 128 * t * 4


def available_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def worker(impl, t, calls, jit):
    import keras
    import numpy as np
    import tensorflow as tf

    import attention_layers as al

    keras.utils.set_random_seed(0)
    if impl == "ours":
        layer = al.MultiHeadAttention(HEADS, KEY_DIM, implementation="tiled")
    else:
        layer = keras.layers.MultiHeadAttention(HEADS, KEY_DIM)
    tiny = np.zeros((1, 2, D), "float32")
    layer(tiny, tiny)
    x = tf.random.normal((B, t, D), seed=3)

    @tf.function(input_signature=[tf.TensorSpec((B, t, D))], jit_compile=jit)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, x))
        return loss, tape.gradient(loss, [x, *layer.trainable_weights])

    step.get_concrete_function()  # trace before the baseline

    def call():
        return [v.numpy() for v in tf.nest.flatten(step(x))]

    t0 = time.perf_counter()
    result = paired.measure_peak(call, calls)
    result["seconds_per_call"] = (time.perf_counter() - t0) / calls
    paired.emit({"impl": impl, "T": t, **result})


def run(seqs, calls, limit_gb, jit):
    results = {}
    for t in seqs:
        for impl in IMPLS:
            est = estimate_bytes(impl, t)
            avail = available_bytes()
            reason = None
            if est > limit_gb * 2**30:
                reason = (
                    f"estimated {est / 2**30:.1f} GiB > limit {limit_gb} GiB"
                    f" ({scores_bytes(t) / 2**30:.1f} GiB per score tensor)"
                )
            elif avail is not None and est > 0.8 * avail:
                reason = (
                    f"estimated {est / 2**30:.1f} GiB > 80% of the "
                    f"{avail / 2**30:.1f} GiB available now"
                )
            if reason:
                log(f"[{impl} T={t}] not run: {reason}")
                results[(impl, t)] = {"not_run": reason}
                continue
            args = ["--worker", impl, str(t), "--calls", str(calls)]
            args += ["--jit", "on" if jit else "off"]
            t0 = time.perf_counter()
            try:
                r = paired.run_worker("benchmarks.bench_memory", args, timeout=900)
            except Exception as e:  # a crash (e.g. out of memory) is a result too
                log(f"[{impl} T={t}] failed: {str(e)[-500:]}")
                results[(impl, t)] = {"not_run": f"failed: {str(e)[-200:]}"}
                continue
            results[(impl, t)] = r
            log(
                f"[{impl} T={t}] peak +{paired.mib(r['peak_bytes']):.0f} MiB, "
                f"{r['seconds_per_call']:.1f} s/call "
                f"({time.perf_counter() - t0:.0f} s)"
            )
    return results


def growth(results, impl, seqs):
    """(T_prev, T, factor per doubling) between consecutive measured lengths."""
    out = []
    done = [t for t in seqs if "peak_bytes" in results[(impl, t)]]
    for a, b in zip(done, done[1:], strict=False):
        pa, pb = results[(impl, a)]["peak_bytes"], results[(impl, b)]["peak_bytes"]
        doublings = math.log2(b / a)
        out.append((a, b, (pb / pa) ** (1 / doublings)))
    return out


def report(command, env, seqs, results, calls, jit):
    out = [
        "# Peak memory: MultiHeadAttention(tiled) vs keras MultiHeadAttention",
        "",
        f"Command: `{command}`",
        "",
        f"Self-attention forward + backward, B={B}, d={D}, {HEADS} heads of "
        f"key_dim {KEY_DIM}, float32, jit_compile={jit}; one child process per "
        f"point; peak RSS (VmHWM) of {calls} passes minus the RSS before them.",
        "",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        "",
    ]
    rows = []
    for t in seqs:
        row = [t, f"{paired.mib(scores_bytes(t)):.0f}"]
        for impl in IMPLS:
            r = results[(impl, t)]
            if "not_run" in r:
                row += ["not run: " + r["not_run"], ""]
            else:
                row += [
                    f"{paired.mib(r['peak_bytes']):.0f}",
                    f"{r['seconds_per_call']:.1f}",
                ]
        rows.append(row)
    out.append(
        paired.markdown_table(
            [
                "T",
                "one score tensor MiB",
                "ours MiB",
                "ours s/pass",
                "peer MiB",
                "peer s/pass",
            ],
            rows,
        )
    )
    out += ["", "Growth of the peak per doubling of T (linear: 2.0, T^2: 4.0):", ""]
    rows = []
    for impl in IMPLS:
        for a, b, g in growth(results, impl, seqs):
            rows.append([impl, f"{a} -> {b}", f"{g:.2f}"])
    out.append(paired.markdown_table(["candidate", "T", "factor per 2x T"], rows))
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", default="1024,4096,8192", help="lengths T")
    parser.add_argument("--calls", type=int, default=2, help="passes per point")
    parser.add_argument("--limit-gb", type=float, default=12.0)
    parser.add_argument("--jit", choices=("on", "off"), default="off")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--worker", nargs=2, metavar=("IMPL", "T"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    jit = args.jit == "on"
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.calls, jit)
        return
    seqs = [int(v) for v in args.seq.split(",") if v]
    command = "python -m benchmarks.bench_memory " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    t0 = time.perf_counter()
    env = paired.environment()
    results = run(seqs, args.calls, args.limit_gb, jit)
    text = report(command.strip(), env, seqs, results, args.calls, jit)
    print(text + f"\n\nTotal benchmark time: {time.perf_counter() - t0:.0f} s")
    if args.json:
        paired.write_json(
            args.json,
            command.strip(),
            env,
            results=[{"impl": i, "T": t, **r} for (i, t), r in results.items()],
        )


if __name__ == "__main__":
    main()
