"""In-graph greedy and beam-4 decoding against keras-hub's samplers, same model.

The model: ``Embedding(V=1000, 128)`` + ``AttentionRNNCell(GRUCell(256),
BahdanauAttention(units=256), output_units=256)`` (input feeding, so the state
is ``[z, o]``, two ``[N, 256]`` tensors) + ``Dense(V)``, random weights (seed
0), float32, over a random source memory ``[B=32, S=40, 256]``. Every
candidate drives the same step (``rnn_step_fn``) for exactly ``max_length=40``
steps from start token 1:

* ``ours``: ``greedy_search`` / ``beam_search(beam_width=4)`` with
  ``end_id=V``, an id outside the vocabulary that no argmax or top-k can pick,
  so no sequence ever ends and both loops run all 40 steps;
* ``ours_noalign``: the same with the step's alignment dropped (``None``), so
  the decoder keeps no ``[N, 40, S]`` alignment buffer and no coverage: the
  work keras-hub's samplers do;
* ``hub``: ``keras_hub.samplers.GreedySampler()`` / ``BeamSampler(num_beams=4)``
  with ``next(prompt, cache, index)`` over the same step: the input token is
  ``prompt[:, index - 1]``, the cache is the RNN state packed into one
  ``[N, 512]`` tensor, the prompt is ``[B, 41]`` (the start token at 0,
  ``index=1``) and ``stop_token_ids=None``, so the sampler runs its
  ``max_length - index = 40`` iterations. ``BeamSampler`` repeats the prompt
  and the cache ``num_beams`` times itself (``ops.repeat`` on axis 0, the
  layout of ``tile_beams``), so the beam step closes over the memory tiled
  with ``tile_beams``.

Each candidate is a ``tf.function`` over the whole decode, with
``jit_compile=True`` and then ``False`` (``--jit on|off`` for one only); its
first call (trace + compile + one decode) is timed on its own, after one
untimed small call that takes the process's one-time set-up. Greedy tokens
must be identical on both sides (asserted); for beam the best hypotheses are
compared and the share of identical ones reported (not asserted: keras-hub
scores with ``log(softmax)`` and an unsorted ``top_k``, we with
``log_softmax``, so near-ties may break differently).

All candidates of a jit mode then run in turn, round by round, in one process
(order reversed every other round), after warm-up rounds. Tokens/s counts the
``B * 40`` output tokens (the best hypothesis for beam). Ratios are ours over
hub in tokens/s (hub time / our time, per round): > 1 means ours is faster.

Usage: ``python -m benchmarks.bench_decoding [--pairs N] [--jit on|off|both]
[--json out]`` (about a minute with the defaults).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from benchmarks import paired  # noqa: E402

B, S, D_MEMORY = 32, 40, 256
VOCAB, EMBED, UNITS = 1000, 128, 256
MAX_LENGTH, BEAMS, START_ID = 40, 4, 1
END_ID = VOCAB  # outside the vocabulary: never picked, no early end
SEARCHES = ("greedy", "beam")
CANDIDATES = ("ours", "ours_noalign", "hub")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build_model():
    import keras

    import attention_layers as al
    from attention_layers.recurrent import AttentionRNNCell

    keras.utils.set_random_seed(0)
    embedding = keras.layers.Embedding(VOCAB, EMBED)
    cell = AttentionRNNCell(
        keras.layers.GRUCell(UNITS),
        al.BahdanauAttention(units=UNITS),
        output_units=UNITS,
    )
    projection = keras.layers.Dense(VOCAB)
    memory = keras.random.normal((B, S, D_MEMORY), seed=1)
    embedding.build((B,))
    cell.build((B, EMBED), None, memory.shape)
    projection.build((B, UNITS))
    return embedding, cell, projection, memory


def make_fns(jit):
    """name -> (tf.function of no arguments, fetch(output) -> tokens [B, L])."""
    import keras_hub
    import tensorflow as tf
    from keras import ops

    from attention_layers.decoding import (
        beam_search,
        greedy_search,
        rnn_step_fn,
        tile_beams,
    )

    embedding, cell, projection, memory = build_model()
    sizes = [int(s) for s in cell.state_size]
    start = ops.full((B,), START_ID, "int32")

    def steps(width):
        mem = memory if width == 1 else tile_beams(memory, width)
        step = rnn_step_fn(embedding, cell, projection, mem)

        def step_noalign(ids, state):
            logits, new_state, _ = step(ids, state)
            return logits, new_state, None

        def hub_next(prompt, cache, index):
            ids = ops.take(prompt, index - 1, axis=1)
            state = ops.split(cache, [sizes[0]], axis=-1)
            logits, new_state, _ = step(ids, state)
            return logits, None, ops.concatenate(new_state, axis=-1)

        return step, step_noalign, hub_next

    prompt = ops.concatenate(
        [ops.full((B, 1), START_ID, "int32"), ops.zeros((B, MAX_LENGTH), "int32")],
        axis=1,
    )
    cache0 = ops.zeros((B, sum(sizes)), "float32")
    greedy_sampler = keras_hub.samplers.GreedySampler()
    beam_sampler = keras_hub.samplers.BeamSampler(num_beams=BEAMS)

    g_step, g_noalign, g_next = steps(1)
    b_step, b_noalign, b_next = steps(BEAMS)
    g_state = cell.get_initial_state(B)
    b_state = tile_beams(cell.get_initial_state(B), BEAMS)

    def ours_greedy(step):
        return lambda: greedy_search(step, g_state, start, END_ID, MAX_LENGTH)

    def ours_beam(step):
        return lambda: beam_search(
            step, b_state, start, END_ID, MAX_LENGTH, beam_width=BEAMS
        )

    def wrap(fn):
        return tf.function(fn, jit_compile=jit)

    def greedy_tokens(out):
        return out["tokens"].numpy()

    def beam_tokens(out):
        return out["tokens"][:, 0].numpy()

    def hub_tokens(out):
        return out[:, 1:].numpy()

    return {
        ("greedy", "ours"): (wrap(ours_greedy(g_step)), greedy_tokens),
        ("greedy", "ours_noalign"): (wrap(ours_greedy(g_noalign)), greedy_tokens),
        ("greedy", "hub"): (
            wrap(lambda: greedy_sampler(g_next, prompt, cache=cache0, index=1)),
            hub_tokens,
        ),
        ("beam", "ours"): (wrap(ours_beam(b_step)), beam_tokens),
        ("beam", "ours_noalign"): (wrap(ours_beam(b_noalign)), beam_tokens),
        ("beam", "hub"): (
            wrap(lambda: beam_sampler(b_next, prompt, cache=cache0, index=1)),
            hub_tokens,
        ),
    }


def warm_up_compiler(jit):
    """One small untimed call, so that no candidate's first call pays for the
    one-time set-up of tf.function (and XLA) in this process."""
    import tensorflow as tf

    x = tf.ones((8, 8))
    tf.function(lambda: tf.reduce_sum(tf.matmul(x, x)), jit_compile=jit)().numpy()


def run_mode(jit, pairs, reps, warmup):
    fns = make_fns(jit)
    warm_up_compiler(jit)
    compile_s, tokens = {}, {}
    for key, (fn, fetch) in fns.items():
        t0 = time.perf_counter()
        tokens[key] = fetch(fn())
        compile_s[key] = time.perf_counter() - t0
        log(f"[jit={jit}] first call {key}: {compile_s[key]:.1f} s")

    checks = {}
    for search in SEARCHES:
        hub = tokens[(search, "hub")]
        for name in ("ours", "ours_noalign"):
            same = (tokens[(search, name)] == hub).all(axis=1)
            checks[f"{search}_{name}_vs_hub"] = {
                "identical_sequences": int(same.sum()),
                "of": int(same.size),
                "identical_tokens": float((tokens[(search, name)] == hub).mean()),
            }
        if search == "greedy":
            for name in ("ours", "ours_noalign"):
                c = checks[f"greedy_{name}_vs_hub"]
                assert c["identical_sequences"] == c["of"], (
                    f"greedy tokens differ ({name} vs hub, jit={jit}): {c}"
                )

    timed = {}
    for (search, name), (fn, fetch) in fns.items():
        timed[f"{search}/{name}"] = lambda fn=fn, fetch=fetch: fetch(fn())
    log(f"[jit={jit}] {warmup} warm-up rounds, {pairs} timed rounds, {reps} calls")

    def progress(r, n, last):
        if r % 5 == 0 or r == n:
            t = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in last.items())
            log(f"  [{r}/{n}] ms: {t}")

    wall, cpu = paired.paired_rounds(timed, pairs, reps, warmup, progress)
    n_tokens = B * MAX_LENGTH
    results = {}
    for search in SEARCHES:
        entry = {}
        for name in CANDIDATES:
            t = wall[f"{search}/{name}"]
            entry[name] = {
                "compile_s": compile_s[(search, name)],
                "ms": paired.summary([x * 1e3 for x in t]),
                "tokens_per_s": paired.summary([n_tokens / x for x in t]),
            }
        hub = f"{search}/hub"
        for name in ("ours", "ours_noalign"):
            mine = f"{search}/{name}"
            entry[f"{name}_over_hub"] = paired.summary(
                paired.ratios(wall[hub], wall[mine])
            )
            entry[f"{name}_over_hub_cpu"] = paired.summary(
                paired.ratios(cpu[hub], cpu[mine])
            )
        results[search] = entry
    return {"results": results, "checks": checks}


def report(command, env, modes, elapsed):
    out = [
        "# Decoding vs keras-hub samplers",
        "",
        f"Command: `{command}`",
        "",
        f"RNN decoder with attention: Embedding({VOCAB}, {EMBED}) + "
        f"AttentionRNNCell(GRUCell({UNITS}), BahdanauAttention(units={UNITS}), "
        f"output_units={UNITS}) + Dense({VOCAB}); random weights; batch {B}, "
        f"memory [{B}, {S}, {D_MEMORY}]; {MAX_LENGTH} steps, no early end; "
        f"beam width {BEAMS}; float32.",
        "",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        "",
        "## First call (trace + compile + one decode), seconds",
        "",
    ]
    rows = []
    for jit, mode in modes.items():
        for search in SEARCHES:
            r = mode["results"][search]
            rows.append(
                [jit, search] + [f"{r[name]['compile_s']:.1f}" for name in CANDIDATES]
            )
    out.append(paired.markdown_table(["jit_compile", "search", *CANDIDATES], rows))
    n = next(iter(modes.values()))["results"]["greedy"]["ours"]["ms"]["n"]
    out += [
        "",
        f"## Steady state ({n} alternating rounds; median [IQR; min-max])",
        "",
        "Ratio = ours tokens/s over hub tokens/s in the same round (> 1: ours "
        "faster); tokens/s counts the B x 40 output tokens.",
        "",
    ]
    rows = []
    for jit, mode in modes.items():
        for search in SEARCHES:
            r = mode["results"][search]
            rows.append(
                [
                    jit,
                    search,
                    *(
                        f"{r[name]['tokens_per_s']['median']:.0f}"
                        for name in CANDIDATES
                    ),
                    paired.fmt_spread(r["ours_over_hub"]),
                    f"{r['ours_over_hub_cpu']['median']:.2f}",
                    paired.fmt_spread(r["ours_noalign_over_hub"]),
                ]
            )
    headers = [
        "jit_compile",
        "search",
        "ours tok/s",
        "ours no-align tok/s",
        "hub tok/s",
        "ratio ours/hub",
        "ratio (CPU time)",
        "ratio ours no-align/hub",
    ]
    out.append(paired.markdown_table(headers, rows))
    out += ["", "## Outputs: ours against hub", ""]
    rows = []
    for jit, mode in modes.items():
        for key, c in mode["checks"].items():
            rows.append(
                [
                    jit,
                    key.replace("_vs_hub", ""),
                    f"{c['identical_sequences']}/{c['of']}",
                    f"{c['identical_tokens']:.4f}",
                ]
            )
    out.append(
        paired.markdown_table(
            ["jit_compile", "search / ours", "identical sequences", "identical tokens"],
            rows,
        )
    )
    out += ["", f"Total benchmark time: {elapsed:.0f} s"]
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=30, help="timed rounds (>= 15)")
    parser.add_argument("--reps", type=int, default=1, help="calls per sample")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds")
    parser.add_argument(
        "--jit", choices=("on", "off", "both"), default="both", help="jit_compile"
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.reps < 1:
        parser.error("--pairs and --reps must be positive")
    command = "python -m benchmarks.bench_decoding " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    t0 = time.perf_counter()
    env = paired.environment()
    jits = {"on": [True], "off": [False], "both": [True, False]}[args.jit]
    modes = {jit: run_mode(jit, args.pairs, args.reps, args.warmup) for jit in jits}
    print(report(command.strip(), env, modes, time.perf_counter() - t0))
    if args.json:
        paired.write_json(
            args.json,
            command.strip(),
            env,
            modes={str(k): v for k, v in modes.items()},
        )


if __name__ == "__main__":
    main()
