"""LocalAttention (local-p) against global LuongAttention, one decoder step.

One decoder step: a rank-2 query ``[B, d]`` over ``S`` encoder states
``[B, S, d]`` (B=32, d=256, random normal float32, no mask), for S in
{50, 200, 1000}, each candidate a ``tf.function`` (no XLA) with a fixed input
signature, forward pass only, returning the context:

* ``local``: ``LocalAttention(mode="predictive", window=10, score_mode="general")``,
  which gathers the ``2D + 1 = 21`` window states and scores only those, and
  applies ``W_a`` to the query (``O(d^2 + D d)`` per step);
* ``global``: ``LuongAttention(score_mode="general")``, which scores every
  state and applies ``W_a`` to all of them on each call (``O(S d^2)``);
* ``global_dot``: ``LuongAttention(score_mode="dot")``, global attention with
  no projection at all (``O(S d)``): the floor of any global score.

All six (candidate, S) functions run in turn, round by round, in one process
(the order reversed every other round), after warm-up rounds; each sample is
the mean of ``--reps`` calls. The report gives, per S, the median and spread
of the per-round ratio global / local (> 1: local faster) and of each
candidate's per-round time relative to its own time at the smallest S of the
same round (1.0: flat in S).

Usage: ``python -m benchmarks.bench_local [--pairs N] [--reps R] [--json out]``.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import paired  # noqa: E402

B, D_MODEL, WINDOW = 32, 256, 10
LENGTHS = (50, 200, 1000)
CANDIDATES = ("local", "global", "global_dot")


def make_layer(name):
    import attention_layers as al

    if name == "local":
        return al.LocalAttention(mode="predictive", window=WINDOW, score_mode="general")
    return al.LuongAttention(score_mode="dot" if name == "global_dot" else "general")


def compiled(layer, length):
    """``fn()`` running one traced step of ``layer`` over ``length`` states."""
    import tensorflow as tf

    query = tf.random.normal((B, D_MODEL), seed=1)
    value = tf.random.normal((B, length, D_MODEL), seed=2)
    sig = [
        tf.TensorSpec((B, D_MODEL), tf.float32),
        tf.TensorSpec((B, length, D_MODEL), tf.float32),
    ]
    fn = tf.function(lambda q, v: layer(q, v), input_signature=sig, jit_compile=False)
    fn(query, value)  # trace and build
    return lambda: fn(query, value).numpy()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def speed(pairs, reps, warmup):
    import keras

    keras.utils.set_random_seed(0)
    layers = {name: make_layer(name) for name in CANDIDATES}
    fns = {(name, s): compiled(layers[name], s) for name in CANDIDATES for s in LENGTHS}
    keyed = {f"{name}@{s}": fn for (name, s), fn in fns.items()}
    log(f"[speed] {warmup} warm-up rounds, {pairs} timed rounds, {reps} calls each")

    def progress(r, n, last):
        if r % 5 == 0 or r == n:
            t = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in last.items())
            log(f"  [{r}/{n}] ms: {t}")

    times, cpu = paired.paired_rounds(keyed, pairs, reps, warmup, progress)
    results = {}
    for s in LENGTHS:
        entry = {}
        for name in CANDIDATES:
            t = times[f"{name}@{s}"]
            entry[name] = {
                "ms": paired.summary([x * 1e3 for x in t]),
                "steps_per_s": paired.summary([B / x for x in t]),
                "vs_first_length": paired.summary(
                    paired.ratios(t, times[f"{name}@{LENGTHS[0]}"])
                ),
            }
        for name in ("global", "global_dot"):
            entry[f"{name}_over_local"] = paired.summary(
                paired.ratios(times[f"{name}@{s}"], times[f"local@{s}"])
            )
            if cpu is not None:
                entry[f"{name}_over_local_cpu"] = paired.summary(
                    paired.ratios(cpu[f"{name}@{s}"], cpu[f"local@{s}"])
                )
        results[s] = entry
    return results


def report(command, env, results, elapsed):
    n = results[LENGTHS[0]]["local"]["ms"]["n"]
    out = [
        "# LocalAttention (local-p) vs global LuongAttention, one decoder step",
        "",
        f"Command: `{command}`",
        "",
        f"One step: query [B={B}, d={D_MODEL}], S encoder states [B, S, d], "
        f"float32, no mask; local-p D={WINDOW} (21 states), score general; "
        "tf.function(jit_compile=False), fixed input signature, forward only.",
        "",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        "",
        f"## Per-round ratios ({n} alternating rounds; median [IQR; min-max])",
        "",
        "global/local > 1: local faster. 'x S=50': the candidate's time over its "
        "own time at S=50 in the same round (1.00: flat in S).",
        "",
    ]
    with_cpu = "global_over_local_cpu" in results[LENGTHS[0]]
    rows = []
    for s in LENGTHS:
        e = results[s]
        row = [
            s,
            f"{e['local']['ms']['median']:.2f}",
            f"{e['global']['ms']['median']:.2f}",
            f"{e['global_dot']['ms']['median']:.2f}",
            paired.fmt_spread(e["global_over_local"]),
            paired.fmt_spread(e["global_dot_over_local"]),
            paired.fmt_spread(e["local"]["vs_first_length"]),
            paired.fmt_spread(e["global"]["vs_first_length"]),
        ]
        if with_cpu:
            row.append(f"{e['global_over_local_cpu']['median']:.2f}")
        rows.append(row)
    headers = [
        "S",
        "local ms",
        "global ms",
        "global dot ms",
        "ratio global/local",
        "ratio global dot/local",
        "local x S=50",
        "global x S=50",
    ]
    if with_cpu:
        headers.append("global/local CPU time")
    out.append(paired.markdown_table(headers, rows))
    out += ["", f"Total benchmark time: {elapsed:.0f} s"]
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=30, help="timed rounds (>= 15)")
    parser.add_argument("--reps", type=int, default=5, help="calls per sample")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.reps < 1:
        parser.error("--pairs and --reps must be positive")
    command = "python -m benchmarks.bench_local " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    t0 = time.perf_counter()
    env = paired.environment()
    results = speed(args.pairs, args.reps, args.warmup)
    print(report(command.strip(), env, results, time.perf_counter() - t0))
    if args.json:
        paired.write_json(args.json, command.strip(), env, speed=results)


if __name__ == "__main__":
    main()
