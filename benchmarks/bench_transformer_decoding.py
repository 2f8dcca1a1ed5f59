"""Cached greedy decoding of a 2-layer Transformer decoder against keras-hub.

The model, decoder-only, post-norm, float32, random weights (seed 0):
``Embedding(V=1000, 256)`` + a learned position embedding (64 positions) +
2 decoder blocks (4 heads of 64, feed-forward 1024, ReLU, no dropout) +
``Dense(V)``. Both sides share the token embedding and the output projection
layers; their blocks and position embeddings hold the same weights (ours
copied into keras-hub's with ``set_weights``; the weight layouts are the same).

* ``ours``: ``TransformerDecoderBlock`` x2 and ``PositionEmbedding`` of
  ``attention_layers``, driven by ``greedy_search`` with
  ``transformer_step_fn`` and the self-attention KV caches of
  ``transformer_initial_state`` (``[B, 2, 64, 4, 64]`` per block);
  ``end_id=V``, an id outside the vocabulary, so no sequence ends early;
* ``hub``: ``keras_hub.layers.TransformerDecoder`` x2 and
  ``keras_hub.layers.PositionEmbedding``, driven by
  ``keras_hub.samplers.GreedySampler()`` with ``next(prompt, cache, index)``
  in the style of keras-hub's causal LMs: the input token is
  ``prompt[:, index - 1]`` at position ``index - 1``, the cache is
  ``[B, 2 layers, 2, 64, 4, 64]`` (each layer's slice passed as its
  ``self_attention_cache``), the prompt ``[B, 65]`` holds the start token at
  0 and ``index=1``; ``stop_token_ids=None``, so the sampler runs its
  64 iterations.

Both generate exactly ``B * 64`` tokens from start token 1 (checked: shapes,
and ``lengths == 64`` on our side); the share of identical tokens is reported.
Each candidate is a ``tf.function`` over the whole decode with
``jit_compile=True`` and ``False``; its first call (trace + compile + one
decode) is timed on its own, after one untimed small call that takes the
process's one-time set-up. Then the candidates run in turn, round by round
(order reversed every other round), after warm-up rounds. Ratio: ours
tokens/s over hub tokens/s in the same round (hub time / our time; > 1: ours
faster).

Usage: ``python -m benchmarks.bench_transformer_decoding [--pairs N]
[--batch B] [--jit on|off|both] [--json out]`` (a few minutes).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from benchmarks import paired  # noqa: E402

VOCAB, HIDDEN, HEADS, FFN, LAYERS = 1000, 256, 4, 1024, 2
MAX_LENGTH, START_ID = 64, 1
END_ID = VOCAB  # outside the vocabulary: never picked, no early end
CANDIDATES = ("ours", "hub")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build_models(batch):
    import keras
    import keras_hub
    import numpy as np

    import attention_layers as al

    keras.utils.set_random_seed(0)
    embedding = keras.layers.Embedding(VOCAB, HIDDEN)
    projection = keras.layers.Dense(VOCAB)
    position = al.PositionEmbedding(MAX_LENGTH)
    blocks = [
        al.TransformerDecoderBlock(num_heads=HEADS, intermediate_dim=FFN)
        for _ in range(LAYERS)
    ]
    hub_position = keras_hub.layers.PositionEmbedding(MAX_LENGTH)
    hub_blocks = [
        keras_hub.layers.TransformerDecoder(intermediate_dim=FFN, num_heads=HEADS)
        for _ in range(LAYERS)
    ]
    x = embedding(np.zeros((batch, 1), "int32"))
    projection.build((batch, HIDDEN))
    position(x)
    hub_position(x)
    hub_position.set_weights(position.get_weights())
    for ours, hub in zip(blocks, hub_blocks, strict=True):
        ours(x)
        hub(x)
        hub.set_weights(ours.get_weights())
    return embedding, projection, position, blocks, hub_position, hub_blocks


def make_fns(jit, batch):
    """name -> (tf.function of no arguments, fetch(output) -> tokens [B, L])."""
    import keras_hub
    import tensorflow as tf
    from keras import ops

    from attention_layers.decoding import (
        greedy_search,
        transformer_initial_state,
        transformer_step_fn,
    )

    embedding, projection, position, blocks, hub_position, hub_blocks = build_models(
        batch
    )
    step = transformer_step_fn(embedding, blocks, projection, position)
    state = transformer_initial_state(blocks, batch, MAX_LENGTH)
    start = ops.full((batch,), START_ID, "int32")

    def hub_next(prompt, cache, index):
        ids = ops.slice(prompt, [0, index - 1], [batch, 1])
        x = embedding(ids)
        x = x + hub_position(x, start_index=index - 1)
        caches = []
        for i, block in enumerate(hub_blocks):
            x, c = block(
                x,
                self_attention_cache=cache[:, i],
                self_attention_cache_update_index=index - 1,
            )
            caches.append(c)
        return projection(x[:, 0]), None, ops.stack(caches, axis=1)

    prompt = ops.concatenate(
        [
            ops.full((batch, 1), START_ID, "int32"),
            ops.zeros((batch, MAX_LENGTH), "int32"),
        ],
        axis=1,
    )
    cache0 = ops.zeros((batch, LAYERS, 2, MAX_LENGTH, HEADS, HIDDEN // HEADS))
    sampler = keras_hub.samplers.GreedySampler()

    def ours_fetch(out):
        lengths = out["lengths"].numpy()
        assert (lengths == MAX_LENGTH).all(), f"early end: lengths {lengths}"
        return out["tokens"].numpy()

    def hub_fetch(out):
        return out[:, 1:].numpy()

    return {
        "ours": (
            tf.function(
                lambda: greedy_search(step, state, start, END_ID, MAX_LENGTH),
                jit_compile=jit,
            ),
            ours_fetch,
        ),
        "hub": (
            tf.function(
                lambda: sampler(hub_next, prompt, cache=cache0, index=1),
                jit_compile=jit,
            ),
            hub_fetch,
        ),
    }


def warm_up_compiler(jit):
    import tensorflow as tf

    x = tf.ones((8, 8))
    tf.function(lambda: tf.reduce_sum(tf.matmul(x, x)), jit_compile=jit)().numpy()


def run_mode(jit, batch, pairs, warmup):
    fns = make_fns(jit, batch)
    warm_up_compiler(jit)
    compile_s, tokens = {}, {}
    for name, (fn, fetch) in fns.items():
        t0 = time.perf_counter()
        tokens[name] = fetch(fn())
        compile_s[name] = time.perf_counter() - t0
        log(f"[jit={jit}] first call {name}: {compile_s[name]:.1f} s")
    for name, t in tokens.items():
        assert t.shape == (batch, MAX_LENGTH), f"{name} tokens shape {t.shape}"
    same = tokens["ours"] == tokens["hub"]
    check = {
        "identical_sequences": int(same.all(axis=1).sum()),
        "of": batch,
        "identical_tokens": float(same.mean()),
    }
    timed = {
        name: (lambda fn=fn, fetch=fetch: fetch(fn()))
        for name, (fn, fetch) in fns.items()
    }

    def progress(r, n, last):
        if r % 5 == 0 or r == n:
            t = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in last.items())
            log(f"  [jit={jit} {r}/{n}] ms: {t}")

    wall, cpu = paired.paired_rounds(timed, pairs, 1, warmup, progress)
    n_tokens = batch * MAX_LENGTH
    result = {"check": check}
    for name in CANDIDATES:
        result[name] = {
            "compile_s": compile_s[name],
            "ms": paired.summary([x * 1e3 for x in wall[name]]),
            "tokens_per_s": paired.summary([n_tokens / x for x in wall[name]]),
        }
    result["ours_over_hub"] = paired.summary(paired.ratios(wall["hub"], wall["ours"]))
    result["ours_over_hub_cpu"] = paired.summary(paired.ratios(cpu["hub"], cpu["ours"]))
    log(f"[jit={jit}] ratio ours/hub {paired.fmt_spread(result['ours_over_hub'])}")
    return result


def report(command, env, batch, modes, elapsed):
    out = [
        "# Transformer decoding vs keras-hub TransformerDecoder + GreedySampler",
        "",
        f"Command: `{command}`",
        "",
        f"Decoder-only, {LAYERS} layers, d={HIDDEN}, {HEADS} heads, "
        f"feed-forward {FFN}, V={VOCAB}, learned positions; batch {batch}, "
        f"{MAX_LENGTH} generated tokens per sequence, no early end; float32.",
        "",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        "",
    ]
    rows = []
    for jit, r in modes.items():
        c = r["check"]
        rows.append(
            [
                "on" if jit else "off",
                r["ours"]["ms"]["n"],
                f"{r['ours']['tokens_per_s']['median']:.0f}",
                f"{r['hub']['tokens_per_s']['median']:.0f}",
                paired.fmt_spread(r["ours_over_hub"]),
                f"{r['ours_over_hub_cpu']['median']:.2f}",
                f"{r['ours']['compile_s']:.1f} / {r['hub']['compile_s']:.1f}",
                f"{c['identical_sequences']}/{c['of']} ({c['identical_tokens']:.3f})",
            ]
        )
    out.append(
        paired.markdown_table(
            [
                "XLA",
                "rounds",
                "ours tok/s",
                "hub tok/s",
                "ratio ours/hub (wall)",
                "ratio (CPU time)",
                "first call s ours / hub",
                "identical sequences (tokens)",
            ],
            rows,
        )
    )
    out += ["", f"Total benchmark time: {elapsed:.0f} s"]
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--jit", choices=("on", "off", "both"), default="both")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.batch < 1:
        parser.error("--pairs and --batch must be positive")
    command = "python -m benchmarks.bench_transformer_decoding " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    t0 = time.perf_counter()
    env = paired.environment()
    jits = {"on": [True], "off": [False], "both": [True, False]}[args.jit]
    modes = {jit: run_mode(jit, args.batch, args.pairs, args.warmup) for jit in jits}
    print(report(command.strip(), env, args.batch, modes, time.perf_counter() - t0))
    if args.json:
        paired.write_json(
            args.json,
            command.strip(),
            env,
            modes={str(k): v for k, v in modes.items()},
        )


if __name__ == "__main__":
    main()
