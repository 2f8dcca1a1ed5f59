"""The layers on an accelerator (JAX backend) against Keras and keras-hub, one process.

Points (``--smoke`` shrinks every shape so that it runs on a CPU in about a
minute, which is how the script is prepared):

* ``matmul``: an 8192^3 product in bfloat16 and in float32, the ceilings that
  the TFLOP/s of the attention points are read against.
* ``mha``: ``attention_layers.MultiHeadAttention(8 heads of 64)`` on
  ``[B, T, 512]`` self-attention against ``keras.layers.MultiHeadAttention``
  with the same weights, ``mixed_bfloat16`` at T = 512, 2048, 8192, 32768
  and ``float32`` at T = 512, 2048, 8192, 32768; ours by ``"auto"`` and, in
  float32, also forced ``"tiled"`` and ``"pallas"`` (where JAX's kernel runs).
* ``bahdanau``: ``BahdanauAttention(units=256)`` (``"auto"``: fused on a GPU,
  and forced ``"blocks"``) against ``Dense + Dense + AdditiveAttention`` with
  the same weights, B=64, Tq=64, S=256, float32 and ``mixed_bfloat16``.
* ``decoding``: cached greedy and beam-4 decoding of a 2-layer d256 decoder
  (``TransformerDecoderBlock``, ``transformer_step_fn``) against keras-hub's
  ``TransformerDecoder`` driven by its ``GreedySampler`` and ``BeamSampler``,
  same weights, tokens/s; skipped where keras-hub cannot be imported.

Every candidate is ``jax.jit``-compiled through ``stateless_call`` (forward,
and forward + backward with respect to the weights and inputs); the
candidates of a point then run in turn, round by round (the order reversed
every other round), and the report gives each peer's time over ours per
round (> 1: ours faster) as median [min-max], our TFLOP/s and its share of
the matmul ceiling of the same dtype, and each candidate's compiled temporary
memory (``memory_analysis().temp_size_in_bytes``). A point that fails (out of
memory, say) records its error and the run goes on; a point that runs past
``--point-timeout`` ends the run with what was measured so far.

Results: one JSON line per point on stdout as it finishes, then
``bench_gpu.json`` and ``bench_gpu.md`` in ``--out`` (default ``$OUT`` or
the working folder).

On the lent GPU machine (JAX there, no TensorFlow, no network), carry the
keras, namex and optree wheels (and keras-hub's for the decoding point) and
run ``KERAS_BACKEND=jax python -m benchmarks.bench_gpu`` from the repository
root (docs/benchmarks.md, "On a GPU").

Usage: ``python -m benchmarks.bench_gpu [--smoke] [--only mha,bahdanau,...]
[--out DIR] [--rounds N] [--point-timeout S]``.
"""

import argparse
import json
import os
import sys
import threading
import time
import traceback

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.paired import markdown_table, summary  # noqa: E402

POINTS = ("matmul", "mha", "bahdanau", "decoding")
FULL = {
    "matmul": 8192,
    "mha": {"d": 512, "heads": 8, "key_dim": 64, "bf16": [(512, 8), (2048, 8),
            (8192, 2), (32768, 1)], "f32": [(512, 8), (2048, 8), (8192, 2),
            (32768, 1)]},
    "bahdanau": [(64, 64, 256, 256)],  # B, Tq, S, units
    "decoding": {"vocab": 1000, "hidden": 256, "heads": 4, "ffn": 1024,
                 "layers": 2, "length": 64, "batch": 64, "beams": 4},
    "target_s": 0.05,  # seconds per timed sample
}  # fmt: skip
SMOKE = {
    "matmul": 256,
    "mha": {"d": 32, "heads": 2, "key_dim": 16, "bf16": [(64, 2)],
            "f32": [(64, 2)]},
    "bahdanau": [(2, 4, 8, 16)],
    "decoding": {"vocab": 50, "hidden": 32, "heads": 2, "ffn": 64, "layers": 2,
                 "length": 8, "batch": 2, "beams": 4},
    "target_s": 0.002,
}  # fmt: skip


class Run:
    """The results so far, written out at the end or when a point stalls."""

    def __init__(self, args, shapes):
        self.args, self.shapes = args, shapes
        self.results, self.started = [], time.time()
        self.current = None  # (point name, start time) of the point running

    def say(self, **record):
        record["t"] = round(time.time() - self.started, 1)
        print(json.dumps(record), flush=True)
        self.results.append(record)

    def point(self, name, fn, *args):
        """Run one point; record its error instead of stopping the run."""
        self.current = (name, time.time())
        try:
            fn(*args)
        except Exception as error:  # an OOM or an unsupported kernel
            self.say(point=name, error=f"{type(error).__name__}: {error}"[:400])
            traceback.print_exc(file=sys.stderr)
        self.current = None

    def watch(self, limit):
        """End the run, writing what it has, if one point runs past ``limit``
        seconds (an XLA compilation that stalls, say)."""

        def loop():
            while True:
                time.sleep(5)
                current = self.current
                if current and time.time() - current[1] > limit:
                    self.say(point=current[0], error=f"stalled past {limit} s")
                    self.write()
                    os._exit(3)

        threading.Thread(target=loop, daemon=True).start()

    def write(self):
        out = self.args.out or os.environ.get("OUT") or "."
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "bench_gpu.json"), "w") as f:
            json.dump(self.results, f, indent=1)
        with open(os.path.join(out, "bench_gpu.md"), "w") as f:
            f.write(report(self.results, self.command()))

    def command(self):
        return "python -m benchmarks.bench_gpu " + " ".join(sys.argv[1:])


# -- timing ----------------------------------------------------------------------
def block(x):
    import jax

    return jax.block_until_ready(x)


def sample_time(fn, args, iters):
    start = time.perf_counter()
    out = None
    for _ in range(iters):
        out = fn(*args)
    block(out)
    return (time.perf_counter() - start) / iters


def temp_bytes(fn, args):
    try:
        return int(fn.lower(*args).compile().memory_analysis().temp_size_in_bytes)
    except Exception:
        return None


def paired(candidates, rounds, target_s):
    """``{name: [seconds per call, per round]}``, ``{name: compile s}`` and
    ``{name: temp bytes}`` of ``{name: (jitted fn, args)}``, or an error
    text for a candidate that failed to compile or run."""
    times, compile_s, temp, iters = {}, {}, {}, {}
    for name, (fn, args) in candidates.items():
        try:
            temp[name] = temp_bytes(fn, args)
            start = time.perf_counter()
            block(fn(*args))
            compile_s[name] = round(time.perf_counter() - start, 2)
            once = sample_time(fn, args, 1)
            iters[name] = max(1, int(target_s / max(once, 1e-6)))
            times[name] = []
        except Exception as error:
            times[name] = f"{type(error).__name__}: {str(error).splitlines()[0]}"[:300]
    live = [n for n, t in times.items() if not isinstance(t, str)]
    for r in range(rounds):
        for name in live if r % 2 == 0 else live[::-1]:
            fn, args = candidates[name]
            times[name].append(sample_time(fn, args, iters[name]))
    return times, compile_s, temp


def spread(values, digits=3):
    s = summary(values)
    return [
        round(s["min"], digits),
        round(s["median"], digits),
        round(s["max"], digits),
    ]


def record_pair(run, name, kind, candidates, flops=None, peak=None):
    """Time ``candidates`` (``ours`` first) and record ratios, TFLOP/s, memory."""
    times, compile_s, temp = paired(candidates, run.args.rounds, run.shapes["target_s"])
    rec = {"point": name, "pass": kind, "compile_s": compile_s}
    rec["temp_MiB"] = {
        k: None if v is None else round(v / 2**20, 1) for k, v in temp.items()
    }
    for cand, t in times.items():
        if isinstance(t, str):
            rec[f"error_{cand}"] = t
        else:
            rec[f"ms_{cand}"] = round(1e3 * summary(t)["median"], 4)
    ours = times.get("ours")
    if isinstance(ours, list):
        for cand, t in times.items():
            if cand != "ours" and isinstance(t, list):
                rec[f"ratio_{cand}"] = spread(
                    [a / b for a, b in zip(t, ours, strict=True)]
                )
        if flops:
            tflops = flops / summary(ours)["median"] / 1e12
            rec["tflops_ours"] = round(tflops, 1)
            if peak:
                rec["of_matmul_peak"] = round(tflops / peak, 3)
    run.say(**rec)


# -- models ----------------------------------------------------------------------
def jitted(model):
    """``(forward, forward + backward)`` of ``model``, jitted over its weights."""
    import jax
    import jax.numpy as jnp

    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]

    def forward(weights, x):
        return model.stateless_call(weights, frozen, x)[0]

    def loss(weights, x):
        return jnp.sum(forward(weights, x).astype("float32"))

    return trainable, jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1)))


def candidates_of(models, x):
    fwd, both = {}, {}
    for name, model in models.items():
        weights, f, g = jitted(model)
        fwd[name], both[name] = (f, (weights, x)), (g, (weights, x))
    return fwd, both


# -- points ----------------------------------------------------------------------
PEAKS = {}


def matmul_point(run):
    import jax
    import jax.numpy as jnp

    n = run.shapes["matmul"]
    for dtype in ("bfloat16", "float32"):
        a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
        product = jax.jit(lambda x: x @ x)
        block(product(a))
        seconds = min(sample_time(product, (a,), 10) for _ in range(3))
        PEAKS[dtype] = 2 * n**3 / seconds / 1e12
        run.say(point=f"matmul_{n}_{dtype}", tflops=round(PEAKS[dtype], 1))
    del jnp


def mha_models(shape, dtype, batch, length):
    import keras

    import attention_layers as al

    keras.utils.set_random_seed(0)
    x = keras.Input((length, shape["d"]), batch_size=batch)
    heads, key_dim = shape["heads"], shape["key_dim"]

    def model(layer):
        return keras.Model(x, layer(x, x))

    ours = al.MultiHeadAttention(heads, key_dim, dtype=dtype)
    models = {"ours": model(ours)}
    peer = keras.layers.MultiHeadAttention(heads, key_dim, dtype=dtype)
    models["keras"] = model(peer)
    peer.set_weights(ours.get_weights())
    if dtype == "float32":
        from attention_layers.ops import devices

        forced = ["tiled"]
        if devices.pallas_attention_available() or devices.platform() == "cpu":
            forced.append("pallas")  # interpreted on a CPU (--smoke)
        for impl in forced:
            layer = al.MultiHeadAttention(
                heads, key_dim, dtype=dtype, implementation=impl
            )
            models[f"ours_{impl}"] = model(layer)
            layer.set_weights(ours.get_weights())
    return models


def mha_point(run, dtype, length, batch):
    import jax
    import numpy as np

    shape = run.shapes["mha"]
    models = mha_models(shape, dtype, batch, length)
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, length, shape["d"]))
    if length == min(t for t, _ in shape["f32"]):  # the same function, checked once
        ours = np.asarray(models["ours"](x), "float32")
        peer = np.asarray(models["keras"](x), "float32")
        run.say(
            point=f"mha_{dtype}_check", max_abs_diff=float(np.abs(ours - peer).max())
        )
    d = shape["d"]
    flops = 8 * batch * length * d * d + 4 * batch * length * length * d
    peak = PEAKS.get("float32" if dtype == "float32" else "bfloat16")
    fwd, both = candidates_of(models, x)
    name = f"mha_{dtype}_T{length}_B{batch}"
    record_pair(run, name, "fwd", fwd, flops, peak)
    record_pair(run, name, "fwd+bwd", both, 3 * flops, peak)


def bahdanau_models(dtype, batch, tq, s, units):
    import keras

    import attention_layers as al

    keras.utils.set_random_seed(0)
    q_in = keras.Input((tq, units), batch_size=batch)
    v_in = keras.Input((s, units), batch_size=batch)
    ours = al.BahdanauAttention(units=units, dtype=dtype)
    models = {"ours": keras.Model([q_in, v_in], ours(q_in, v_in))}
    blocks = al.BahdanauAttention(units=units, dtype=dtype, implementation="blocks")
    models["ours_blocks"] = keras.Model([q_in, v_in], blocks(q_in, v_in))
    blocks.set_weights(ours.get_weights())
    wq = keras.layers.Dense(units, use_bias=False, dtype=dtype)
    wk = keras.layers.Dense(units, use_bias=False, dtype=dtype)
    att = keras.layers.AdditiveAttention(dtype=dtype)
    models["keras"] = keras.Model([q_in, v_in], att([wq(q_in), v_in, wk(v_in)]))
    for dst, src in zip(
        (wq.kernel, wk.kernel, att.scale),
        (ours.query_dense.kernel, ours.key_dense.kernel, ours.v),
        strict=True,
    ):
        dst.assign(src)
    return models


def bahdanau_point(run, dtype, batch, tq, s, units):
    import jax
    import numpy as np

    models = bahdanau_models(dtype, batch, tq, s, units)
    x = [
        jax.random.normal(jax.random.PRNGKey(2), (batch, tq, units)),
        jax.random.normal(jax.random.PRNGKey(3), (batch, s, units)),
    ]
    ours = np.asarray(models["ours"](x), "float32")
    peer = np.asarray(models["keras"](x), "float32")
    name = f"bahdanau_{dtype}_B{batch}_Tq{tq}_S{s}_U{units}"
    run.say(point=f"{name}_check", max_abs_diff=float(np.abs(ours - peer).max()))
    flops = 2 * batch * (tq + s) * units * units + 4 * batch * tq * s * units
    flops += 5 * batch * tq * s + 2 * batch * tq * s * units
    peak = PEAKS.get("float32" if dtype == "float32" else "bfloat16")
    fwd, both = candidates_of(models, x)
    record_pair(run, name, "fwd", fwd, flops, peak)
    record_pair(run, name, "fwd+bwd", both, 3 * flops, peak)


def decoding_point(run):
    try:
        import keras_hub
    except Exception as error:
        run.say(point="decoding", skipped=f"keras-hub not importable: {error}"[:200])
        return
    import jax
    import keras
    import numpy as np
    from keras import ops

    import attention_layers as al
    from attention_layers.decoding import (
        beam_search,
        greedy_search,
        transformer_initial_state,
        transformer_step_fn,
    )

    c = run.shapes["decoding"]
    batch, length, beams, layers = c["batch"], c["length"], c["beams"], c["layers"]
    end_id = c["vocab"]  # outside the vocabulary: every sequence runs full length
    keras.utils.set_random_seed(0)
    embedding = keras.layers.Embedding(c["vocab"], c["hidden"])
    projection = keras.layers.Dense(c["vocab"])
    position = al.PositionEmbedding(length)
    ours = [
        al.TransformerDecoderBlock(num_heads=c["heads"], intermediate_dim=c["ffn"])
        for _ in range(layers)
    ]
    hub_position = keras_hub.layers.PositionEmbedding(length)
    hub = [
        keras_hub.layers.TransformerDecoder(c["ffn"], c["heads"]) for _ in range(layers)
    ]
    x = embedding(np.zeros((batch, 1), "int32"))
    projection.build((batch, c["hidden"]))
    position(x)
    hub_position(x)
    hub_position.set_weights(position.get_weights())
    for a, b in zip(ours, hub, strict=True):
        a(x)
        b(x)
        b.set_weights(a.get_weights())
    step = transformer_step_fn(embedding, ours, projection, position)
    start = ops.full((batch,), 1, "int32")
    head = c["hidden"] // c["heads"]

    def hub_next(prompt, cache, index):
        n = ops.shape(prompt)[0]
        ids = ops.slice(prompt, [0, index - 1], [n, 1])
        h = embedding(ids)
        h = h + hub_position(h, start_index=index - 1)
        caches = []
        for i, block_ in enumerate(hub):
            h, new = block_(
                h,
                self_attention_cache=cache[:, i],
                self_attention_cache_update_index=index - 1,
            )
            caches.append(new)
        return projection(h[:, 0]), None, ops.stack(caches, axis=1)

    prompt = ops.concatenate(
        [ops.full((batch, 1), 1, "int32"), ops.zeros((batch, length), "int32")], 1
    )
    cache = ops.zeros((batch, layers, 2, length, c["heads"], head))
    greedy_state = transformer_initial_state(ours, batch, length)
    beam_state = transformer_initial_state(ours, batch * beams, length)
    runs = {
        "greedy": {
            "ours": lambda: greedy_search(step, greedy_state, start, end_id, length),
            "hub": lambda: keras_hub.samplers.GreedySampler()(
                hub_next, prompt, cache=cache, index=1
            ),
        },
        "beam": {
            "ours": lambda: beam_search(
                step, beam_state, start, end_id, length, beam_width=beams
            ),
            "hub": lambda: keras_hub.samplers.BeamSampler(num_beams=beams)(
                hub_next, prompt, cache=cache, index=1
            ),
        },
    }
    for search, fns in runs.items():
        candidates = {name: (jax.jit(fn), ()) for name, fn in fns.items()}
        times, compile_s, _ = paired(
            candidates, run.args.rounds, run.shapes["target_s"]
        )
        rec = {"point": f"decoding_{search}", "batch": batch, "length": length}
        rec["compile_s"] = compile_s
        tokens = batch * length
        for name, t in times.items():
            if isinstance(t, str):
                rec[f"error_{name}"] = t
            else:
                rec[f"tokens_per_s_{name}"] = round(tokens / summary(t)["median"])
        if all(isinstance(t, list) for t in times.values()):
            rec["ratio_hub"] = spread(
                [h / o for h, o in zip(times["hub"], times["ours"], strict=True)]
            )
            if search == "greedy":
                ours_tokens = np.asarray(candidates["ours"][0]()["tokens"])
                hub_tokens = np.asarray(candidates["hub"][0]())[:, 1:]
                rec["identical_tokens"] = float((ours_tokens == hub_tokens).mean())
        run.say(**rec)


# -- report ----------------------------------------------------------------------
def report(results, command):
    lines = [f"Command: `{command}`", ""]
    env = next((r for r in results if r.get("point") == "environment"), {})
    if env:
        lines += [
            ", ".join(f"{k}={v}" for k, v in env.items() if k not in ("point", "t")),
            "",
        ]
    rows = []
    for r in results:
        name = r.get("point", "")
        if "pass" not in r and not name.startswith(("decoding_", "matmul_")):
            if "error" in r or "skipped" in r:
                rows.append([name, "", r.get("error") or r.get("skipped"), "", "", ""])
            continue
        if name.startswith("matmul_"):
            rows.append([name, "", f"{r['tflops']} TFLOP/s", "", "", ""])
            continue
        if name.startswith("decoding_"):
            ours = r.get("tokens_per_s_ours", r.get("error_ours"))
            hub = r.get("tokens_per_s_hub", r.get("error_hub"))
            rows.append([name, "", f"ours {ours} tokens/s", f"keras-hub {hub}",
                         _ratio(r, "hub"), ""])  # fmt: skip
            continue
        peers = [k[6:] for k in r if k.startswith("ratio_")]
        ratios = "; ".join(f"{p}: {_ratio(r, p)}" for p in peers)
        mem = ", ".join(f"{k} {v}" for k, v in r["temp_MiB"].items())
        tflops = r.get("tflops_ours", "")
        if "of_matmul_peak" in r:
            tflops = f"{tflops} ({r['of_matmul_peak']:.0%} of matmul)"
        times = ", ".join(f"{k[3:]} {v}" for k, v in r.items() if k.startswith("ms_"))
        errors = "; ".join(
            f"{k[6:]}: {v}" for k, v in r.items() if k.startswith("error_")
        )
        rows.append([name, r["pass"], times + (f" ({errors})" if errors else ""),
                     ratios, tflops, mem])  # fmt: skip
    headers = ["point", "pass", "ms (median)", "peer time / ours [min-median-max]",
               "ours TFLOP/s", "temp MiB"]  # fmt: skip
    return "\n".join(lines + [markdown_table(headers, rows), ""])


def _ratio(r, peer):
    s = r.get(f"ratio_{peer}")
    return "" if s is None else f"{s[1]:.2f} [{s[0]:.2f}-{s[2]:.2f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU)")
    parser.add_argument("--only", help=f"comma-separated points of {POINTS}")
    parser.add_argument("--out", help="folder for bench_gpu.json and bench_gpu.md")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per point")
    parser.add_argument("--point-timeout", type=float, default=240.0)
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(POINTS)
    if only - set(POINTS):
        parser.error(f"--only takes {POINTS}; received {sorted(only - set(POINTS))}")
    import jax
    import keras

    if keras.backend.backend() != "jax":
        parser.error("run with KERAS_BACKEND=jax")
    run = Run(args, SMOKE if args.smoke else FULL)
    run.watch(args.point_timeout)
    from attention_layers.ops import devices

    run.say(point="environment", devices=[str(d) for d in jax.devices()],
            jax=jax.__version__, keras=keras.__version__, smoke=args.smoke,
            platform=devices.platform(),
            pallas=devices.pallas_attention_available())  # fmt: skip
    if "matmul" in only:
        run.point("matmul", matmul_point, run)
    if "mha" in only:
        shape = run.shapes["mha"]
        for dtype, key in (("mixed_bfloat16", "bf16"), ("float32", "f32")):
            for length, batch in shape[key]:
                run.point(
                    f"mha_{dtype}_T{length}", mha_point, run, dtype, length, batch
                )
    if "bahdanau" in only:
        for dtype in ("float32", "mixed_bfloat16"):
            for dims in run.shapes["bahdanau"]:
                run.point(f"bahdanau_{dtype}", bahdanau_point, run, dtype, *dims)
    if "decoding" in only:
        run.point("decoding", decoding_point, run)
    run.say(point="done", seconds=round(time.time() - run.started, 1))
    run.write()
    print(report(run.results, run.command()))


if __name__ == "__main__":
    main()
