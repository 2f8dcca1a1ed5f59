"""The translation pipeline against a tutorial-style model: time to a good model,
training throughput and serving speed, on the ``dates`` batches.

A user who wants an attention translator would otherwise follow TensorFlow's
"Neural machine translation with attention" tutorial. ``TutorialModel`` is
that model, written here from the tutorial's description: a BiGRU encoder
whose two directions are summed; a GRU decoder started from zeros; one
`keras.layers.MultiHeadAttention` head from the decoder's outputs to the
encoder's, then Add and LayerNormalization (no input feeding); a Dense
output layer. Its export is a greedy ``tf.function`` loop over a fixed
number of steps (here ``max_target_tokens + 1``, ours too; the tutorial's
default is 50) that stops nothing early. Both sides use the same character
tokenizers, the same batches (`pipelines.translation.data.make_dataset`), the
same loss (masked sparse cross-entropy) and the same optimizer (Adam at the
preset's rate and clipnorm).

Candidates: ``ours`` (the ``dates`` preset: Bahdanau, no input feeding);
``ours_feeding`` (``model.input_feeding=true``); ``peer`` (the tutorial
model at ours's decoder width: embeddings 32, 128 units); ``peer_tutorial``
(the tutorial's sizes: 256 and 256); with ``--xla``, ``ours_xla`` (the train
step compiled with XLA on static-shaped batches, ``train.jit_compile=true``).

Measured in one process, candidates alternating (see REFERENCE.md):

1. **Training tokens/s**: each round trains every candidate on the same
   ``--batches`` batches (``train_on_batch``); tokens are the non-padding
   target tokens. Ratios are per round, ours over a peer (> 1: ours faster).
2. **Time to 99% greedy exact match** on the validation split (up to
   ``--eval-size`` dates): the candidates train ``--chunk`` batches each in
   turn (one ``fit`` epoch), then decode greedily; the clock counts training
   only (tracing included), and a candidate stops once it reaches the mark.
3. **Exports**: ours through `pipelines.core.export.publish` (warmup file,
   op audit), once as is and once with its decoding compiled by XLA
   (``ours_xla``: ``export.jit_compile=true``), the peer through
   ``tf.saved_model.save`` plus the same audit; each is loaded back with
   ``tf.saved_model.load`` and its first call timed.
4. **Exported sentences/s**: greedy at batch 1 and 64 (ours with
   ``beam_width=1``), and ours's beam-4 against the peer's greedy; both
   exports of ours. Two warm-up rounds come first (XLA compiles there).
5. **Latency from 8 threads** through TensorFlow's C++ loader
   (`pipelines.cloader.bench`, TF Serving's path): p50 and p99, after
   one untimed request (TF Serving's warmup).

Usage: ``python -m benchmarks.bench_pipeline [--rounds N] [--max-epochs N]
[--xla] [--json out]`` (about 20 minutes on two cores with the defaults).
``--set train.learning_rate=5e-3`` changes the preset for every candidate,
``--peer-learning-rate 3e-3`` adds the peer at that rate as ``peer@0.003``,
and ``--candidates`` keeps only the named ones (``ours`` and ``peer``
always).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from benchmarks import paired  # noqa: E402

PEERS = {"peer": (32, 128), "peer_tutorial": (256, 256)}  # embedding, units


def is_peer(name: str) -> bool:
    """``peer``, ``peer_tutorial``, or one of them at another learning rate
    (``peer@0.003``, from ``--peer-learning-rate``)."""
    return name.partition("@")[0] in PEERS


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class TutorialModel:
    """The tutorial's encoder-decoder; ``trainer`` maps ``{"source",
    "target_in"}`` to logits like ours, ``greedy`` decodes strings."""

    def __init__(self, source_vocab: int, target_vocab: int, embedding: int, units):
        import keras
        from keras import layers, ops

        self.units = units
        self.source_embedding = layers.Embedding(
            source_vocab, embedding, mask_zero=True
        )
        self.encoder = layers.Bidirectional(
            layers.GRU(units, return_sequences=True), merge_mode="sum"
        )
        self.target_embedding = layers.Embedding(
            target_vocab, embedding, mask_zero=True
        )
        self.decoder = layers.GRU(units, return_sequences=True, return_state=True)
        self.attention = layers.MultiHeadAttention(num_heads=1, key_dim=units)
        self.add = layers.Add()
        self.norm = layers.LayerNormalization()
        self.projection = layers.Dense(target_vocab)
        source = keras.Input((None,), dtype="int32", name="source")
        target_in = keras.Input((None,), dtype="int32", name="target_in")
        context = self.encode(source)
        outputs, _ = self.decoder(self.target_embedding(target_in))
        logits = self.read(outputs, context, ops.not_equal(source, 0))
        self.trainer = keras.Model(
            {"source": source, "target_in": target_in}, logits, name="tutorial"
        )

    def encode(self, source):
        return self.encoder(self.source_embedding(source))

    def read(self, outputs, context, source_mask):
        from keras import ops

        mask = ops.expand_dims(source_mask, 1)  # [B, 1, S], broadcast over T
        mask = ops.logical_and(mask, ops.ones_like(outputs[..., :1], dtype="bool"))
        attended = self.attention(query=outputs, value=context, attention_mask=mask)
        return self.projection(self.norm(self.add([outputs, attended])))

    def greedy(self, source_ids, max_length: int):
        """``[B, max_length]`` ids: argmax at every step, ``[PAD]`` after ``[END]``."""
        import tensorflow as tf

        from pipelines.core.text import END, PAD, START

        context = self.encode(source_ids)
        source_mask = tf.not_equal(source_ids, PAD)
        batch = tf.shape(source_ids)[0]
        token = tf.fill([batch], START)
        state = tf.zeros([batch, self.units])
        done = tf.zeros([batch], tf.bool)
        tokens = tf.TensorArray(tf.int32, size=max_length)
        for t in tf.range(max_length):
            x = self.target_embedding(token[:, None])
            x, state = self.decoder(x, initial_state=state)
            logits = self.read(x, context, source_mask)[:, 0]
            token = tf.argmax(logits, -1, output_type=tf.int32)
            token = tf.where(done, PAD, token)
            done = done | tf.equal(token, END)
            tokens = tokens.write(t, token)
        return tf.transpose(tokens.stack())


def peer_module(model, tokenizers, max_source: int, max_length: int):
    """The peer's export: strings in, greedy translations out."""
    import tensorflow as tf

    from pipelines.core.serving import ServingModule

    class PeerTranslator(ServingModule):
        def __init__(self):
            super().__init__(model.trainer, name="tutorial_translator")
            self.tokenizers = tokenizers

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="source")])
        def translate(self, source):
            ids = tokenizers.source.tokenize(source)[:, :max_source].to_tensor(0)
            tokens = model.greedy(ids, max_length)
            return {"translation": tokenizers.target.detokenize(tokens)}

        def signatures(self):
            return {"serving_default": self.translate}

    return PeerTranslator()


# -- set-up ------------------------------------------------------------------


def setup(xla: bool, overrides=(), peer_rates=()):
    from pipelines import registry
    from pipelines.core import config as config_lib
    from pipelines.core.run_dir import RunDir

    task = registry.get("translation")
    config = config_lib.apply_overrides(
        config_lib.preset(task.presets(), "dates"), list(overrides)
    )
    data = task.load_data(config)
    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    tokenizers = task.preprocessors(RunDir(tmp / "run"), data, config, create=False)
    configs = {"ours": config}
    configs["ours_feeding"] = config_lib.apply_overrides(
        config, ["model.input_feeding=true"]
    )
    if xla:
        configs["ours_xla"] = config_lib.apply_overrides(
            config, ["train.jit_compile=true"]
        )
    for name in PEERS:
        configs[name] = config
    for rate in peer_rates:
        configs[f"peer@{rate:g}"] = config_lib.apply_overrides(
            config, [f"train.learning_rate={rate}"]
        )
    return task, config, configs, data, tokenizers, tmp


def build_models(task, configs, tokenizers) -> dict:
    """Every candidate, freshly initialised (seed 0) and compiled."""
    import keras
    import tensorflow as tf

    from pipelines.core.trainer import build_compiled

    strategy = tf.distribute.get_strategy()
    models = {}
    for name, c in configs.items():
        keras.utils.set_random_seed(0)
        if not is_peer(name):
            models[name] = build_compiled(task, c, tokenizers, strategy)
            continue
        embedding, units = PEERS[name.partition("@")[0]]
        peer = TutorialModel(
            tokenizers.source.vocab_size, tokenizers.target.vocab_size, embedding, units
        )
        peer.trainer.compile(
            optimizer=keras.optimizers.Adam(
                c.train.learning_rate, clipnorm=c.train.clipnorm
            ),
            **task.compile_arguments(c),
        )
        models[name] = peer
    return models


def datasets(task, configs, data, tokenizers):
    """Each candidate's training batches (the static-shaped ones for XLA)."""
    return {
        name: task.make_dataset(data.train, tokenizers, c, True)
        for name, c in configs.items()
    }


def target_tokens(batch) -> int:
    import numpy as np

    return int(np.count_nonzero(batch[1].numpy()))


# -- 1. training throughput ---------------------------------------------------


def training_throughput(models, train_sets, batches: int, rounds: int) -> dict:
    import itertools

    chunks = {
        name: list(itertools.islice(iter(dataset), batches))
        for name, dataset in train_sets.items()
    }
    tokens = sum(target_tokens(b) for b in chunks["ours"])

    def trainer(name):
        model = models[name].trainer
        chunk = chunks[name]

        def run():
            for x, y in chunk:
                model.train_on_batch(x, y)

        return run

    log(f"training: {len(models)} candidates x {batches} batches ({tokens} tokens)")
    wall, cpu = paired.paired_rounds(
        {name: trainer(name) for name in models},
        rounds,
        warmup=2,
        progress=lambda r, n, last: log(
            f"  round {r}/{n}: "
            + ", ".join(f"{k} {tokens / v:,.0f} tok/s" for k, v in last.items())
        ),
    )
    out = {
        "tokens_per_round": tokens,
        "tokens_per_s": {
            n: paired.summary([tokens / t for t in w]) for n, w in wall.items()
        },
        "cpu_s": {n: paired.summary(c) for n, c in cpu.items()},
    }
    out["ratios"] = {
        f"{a}/{b}": paired.summary(paired.ratios(wall[b], wall[a]))
        for a in models
        if a.startswith("ours")
        for b in models
        if is_peer(b)
    }
    return out


# -- 2. time to 99% exact match -------------------------------------------------


def greedy_functions(task, configs, models, tokenizers):
    """name -> tf.function(strings) -> translations (greedy), in process."""
    import tensorflow as tf

    from pipelines.translation.serving import Translator

    max_source = configs["ours"].tokenizer.max_source_tokens
    max_length = configs["ours"].tokenizer.max_target_tokens + 1
    out = {}
    for name, model in models.items():
        if is_peer(name):
            module = peer_module(model, tokenizers, max_source, max_length)
            out[name] = lambda s, m=module: m.translate(s)["translation"]
        else:
            translate = Translator(
                model, tokenizers.source, tokenizers.target, configs[name]
            ).traced_translate()
            out[name] = lambda s, f=translate: f(s, tf.constant(1), tf.constant(0.0))[
                "translation"
            ]
    return out


def exact_match(fn, pairs, batch: int = 256) -> float:
    import tensorflow as tf

    from pipelines.core.metrics import exact_match as score

    hypotheses = []
    for start in range(0, len(pairs), batch):
        chunk = [s for s, _ in pairs[start : start + batch]]
        hypotheses += [h.decode("utf-8") for h in fn(tf.constant(chunk)).numpy()]
    return score(hypotheses, [t for _, t in pairs])["exact_match"]


def epoch_clock():
    """A Keras callback whose ``seconds`` sums, over the epochs, the time from
    the start of an epoch's first step to the end of its last: the steps (the
    first one's tracing included), not fit's set-up around them nor the
    making of the epoch's iterator."""
    import keras

    class EpochClock(keras.callbacks.Callback):
        seconds = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                self.t0 = self.last = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.last = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds += self.last - self.t0

    return EpochClock()


def time_to_quality(models, train_sets, greedy, held_out, max_epochs, chunk, mark=0.99):
    """Train each candidate ``chunk`` batches at a time, in turns, decoding
    the held-out dates greedily after each chunk, until it reaches ``mark`` or
    has had ``max_epochs`` epochs. Each chunk is one ``fit`` epoch over the
    candidate's next batches (fit is how both our trainer and the tutorial
    train: its step is traced once, for the dataset's shapes, not once more
    for a second batch shape as ``train_on_batch`` is). The clock counts the
    training steps only."""
    import tensorflow as tf

    names = [n for n in models if n != "ours_xla"]  # XLA: throughput only
    epoch_batches = {n: sum(1 for _ in train_sets[n]) for n in names}
    iterators = {n: iter(train_sets[n].repeat()) for n in names}
    clocks = {n: epoch_clock() for n in names}
    steps = {n: 0 for n in names}
    history = {n: [] for n in names}
    reached = {}
    turn = 0
    while len(reached) < len(names):
        active = [n for n in names if n not in reached]
        active = [n for n in active if steps[n] < max_epochs * epoch_batches[n]]
        if not active:
            break
        for name in active if turn % 2 == 0 else reversed(active):
            batches = [next(iterators[name]) for _ in range(chunk)]
            chunk_data = tf.data.Dataset.from_generator(
                lambda b=batches: iter(b),
                output_signature=train_sets[name].element_spec,
            ).apply(tf.data.experimental.assert_cardinality(chunk))
            models[name].trainer.fit(
                chunk_data, epochs=1, verbose=0, callbacks=[clocks[name]]
            )
            seconds = clocks[name].seconds
            steps[name] += chunk
            em = exact_match(greedy[name], held_out)
            epochs = round(steps[name] / epoch_batches[name], 2)
            history[name].append(
                {"epochs": epochs, "train_s": round(seconds, 1), "exact_match": em}
            )
            log(f"  {name}: {epochs} epochs, {seconds:.0f} s, EM {em:.4f}")
            if em >= mark:
                reached[name] = {"epochs": epochs, "train_s": round(seconds, 1)}
        turn += 1
    ratios = {}
    for name in names:
        for peer in filter(is_peer, names):
            if name.startswith("ours") and name in reached and peer in reached:
                ratios[f"{name}/{peer}"] = round(
                    reached[name]["train_s"] / reached[peer]["train_s"], 3
                )
    return {
        "mark": mark,
        "chunk_batches": chunk,
        "epoch_batches": epoch_batches,
        "reached": reached,
        "history": history,
        "ratios": ratios,
    }


# -- 3-5. exports ---------------------------------------------------------------


def export_both(task, config, models, tokenizers, base: Path) -> dict:
    import tensorflow as tf

    from pipelines.core import config as config_lib
    from pipelines.core.export import audit_ops, publish

    out = {}
    # Ours as is, and with its decoding compiled by XLA (export.jit_compile).
    xla_config = config_lib.apply_overrides(config, ["export.jit_compile=true"])
    for name, c in (("ours", config), ("ours_xla", xla_config)):
        t0 = time.perf_counter()
        module = task.serving_module(models["ours"], tokenizers, c)
        path = publish(
            module,
            module.signatures(),
            base,
            name,
            warmup=("serving_default", module.warmup_requests()),
        )
        seconds = round(time.perf_counter() - t0, 2)
        out[name] = {"path": str(path), "export_s": seconds}
    t0 = time.perf_counter()
    peer = peer_module(
        models["peer"],
        tokenizers,
        config.tokenizer.max_source_tokens,
        config.tokenizer.max_target_tokens + 1,
    )
    peer_path = base / "peer" / "1"
    tf.saved_model.save(peer, str(peer_path), signatures=peer.signatures())
    saved = time.perf_counter() - t0
    t1 = time.perf_counter()
    unknown = audit_ops(peer_path)["unknown"]
    out["peer"] = {
        "path": str(peer_path),
        "export_s": round(saved, 2),
        "audit_s": round(time.perf_counter() - t1, 2),
        "unknown_ops": unknown,
    }
    # TF2's loader wants every input; TF Serving fills the defaults in.
    out["ours"]["length_penalty"] = config.decode.length_penalty
    out["ours_xla"]["length_penalty"] = config.decode.length_penalty
    for name in ("ours", "ours_xla", "peer"):
        t0 = time.perf_counter()
        fn = tf.saved_model.load(out[name]["path"]).signatures[_signature(out[name])]
        fn(source=tf.constant(["9 mars 1987"]), **_options(out[name], 1))
        out[name]["first_call_s"] = round(time.perf_counter() - t0, 2)
    return out


def _signature(export: dict) -> str:
    """Ours take per-request options in ``with_options``; the peer has none."""
    return "with_options" if "length_penalty" in export else "serving_default"


def _options(export: dict, beam_width: int) -> dict:
    import tensorflow as tf

    if "length_penalty" not in export:
        return {}
    return {
        "beam_width": tf.constant(beam_width),
        "length_penalty": tf.constant(export["length_penalty"]),
    }


def serving_throughput(exports: dict, held_out, rounds: int) -> dict:
    import tensorflow as tf

    ours = tf.saved_model.load(exports["ours"]["path"]).signatures["with_options"]
    xla = tf.saved_model.load(exports["ours_xla"]["path"])
    xla = xla.signatures["with_options"]
    peer = tf.saved_model.load(exports["peer"]["path"]).signatures["serving_default"]
    sources = [s for s, _ in held_out]
    greedy, beam = _options(exports["ours"], 1), _options(exports["ours"], 4)
    out = {}
    for batch in (1, 64):
        texts = tf.constant((sources * 64)[:batch])
        reps = 20 if batch == 1 else 3
        fns = {
            "ours_greedy": lambda t=texts: ours(source=t, **greedy),
            "ours_beam4": lambda t=texts: ours(source=t, **beam),
            "ours_xla_greedy": lambda t=texts: xla(source=t, **greedy),
            "ours_xla_beam4": lambda t=texts: xla(source=t, **beam),
            "peer_greedy": lambda t=texts: peer(source=t),
        }
        wall, _ = paired.paired_rounds(fns, rounds, reps=reps, warmup=2)
        out[f"batch {batch}"] = {
            "sentences_per_s": {
                n: paired.summary([batch / t for t in w]) for n, w in wall.items()
            },
            "greedy_ratio": paired.summary(
                paired.ratios(wall["peer_greedy"], wall["ours_greedy"])
            ),
            "beam4_ratio": paired.summary(
                paired.ratios(wall["peer_greedy"], wall["ours_beam4"])
            ),
            "xla_greedy_ratio": paired.summary(
                paired.ratios(wall["peer_greedy"], wall["ours_xla_greedy"])
            ),
            "xla_beam4_ratio": paired.summary(
                paired.ratios(wall["peer_greedy"], wall["ours_xla_beam4"])
            ),
        }
        log(
            f"  batch {batch}: greedy ratio "
            f"{paired.fmt_spread(out[f'batch {batch}']['greedy_ratio'])}, beam-4 "
            f"{paired.fmt_spread(out[f'batch {batch}']['beam4_ratio'])}"
        )
    return out


def c_loader_latency(exports: dict, rounds: int, requests: int) -> dict:
    import numpy as np

    from pipelines import cloader

    one = np.array(["9 mars 1987"], dtype=object)
    feeds = {
        "ours_greedy": ("ours", {"source": one, "beam_width": np.int32(1)}),
        "ours_beam4": ("ours", {"source": one, "beam_width": np.int32(4)}),
        "ours_xla_greedy": ("ours_xla", {"source": one, "beam_width": np.int32(1)}),
        "ours_xla_beam4": ("ours_xla", {"source": one, "beam_width": np.int32(4)}),
        "peer_greedy": ("peer", {"source": one}),
    }
    results = {name: [] for name in feeds}
    for r in range(rounds):
        for name in feeds if r % 2 == 0 else reversed(list(feeds)):
            export, request = feeds[name]
            results[name].append(
                cloader.bench(exports[export]["path"], request, 8, requests)
            )
    out = {}
    for name, rows in results.items():
        out[name] = {key: paired.summary([row[key] for row in rows]) for key in rows[0]}
    return out


# -- every task: a row each -------------------------------------------------------


def task_row(spec: str, batches: int, requests: int, tmp: Path) -> dict:
    """Training examples/s on the task's default preset (``NAME:PRESET`` for
    another, ``NAME:PRESET@KEY=VALUE,KEY=VALUE`` with overrides, e.g. a
    variant of the model; an untrained model, timed on a second pass over ``batches``
    batches, so that every batch shape is traced first) and the C loader's
    latency for one request of that model's export, 8 threads. Untrained
    decoders run to their length cap, so the latency of a generative task
    is an upper bound. A task whose data is missing gets its error."""
    import itertools

    import numpy as np
    import tensorflow as tf

    from pipelines import cloader, registry
    from pipelines.core import config as config_lib
    from pipelines.core.errors import PipelineError
    from pipelines.core.export import publish
    from pipelines.core.trainer import build_compiled

    spec, _, overrides = spec.partition("@")
    name, _, preset_name = spec.partition(":")
    task = registry.get(name)
    config = config_lib.preset(task.presets(), preset_name or task.default_preset)
    overrides = [o for o in overrides.split(",") if o]
    config = config_lib.apply_overrides(config, overrides)
    try:
        data = task.load_data(config)
    except PipelineError as error:
        log(f"  {spec}: {error}")
        return {"task": name, "preset": config.name, "error": str(error)[:200]}
    preprocessors = task.preprocessors(None, data, config, create=False)
    model = build_compiled(task, config, preprocessors, tf.distribute.get_strategy())
    task.start_phase(model, config, 0)
    dataset = task.make_dataset(data.train, preprocessors, config, True)
    chunk = list(itertools.islice(iter(dataset), batches))
    for x, y in chunk:  # traces every shape
        model.trainer.train_on_batch(x, y)
    rows = sum(int(tf.nest.flatten(x)[0].shape[0]) for x, _ in chunk)
    t0 = time.perf_counter()
    for x, y in chunk:
        model.trainer.train_on_batch(x, y)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    module = task.serving_module(model, preprocessors, config)
    path = publish(module, module.signatures(), tmp / "tasks", name)
    export_s = time.perf_counter() - t0
    feed = task.contract.requests(config)[0]
    one = {k: v[:1] if np.ndim(v) else v for k, v in feed.items()}
    latency = cloader.bench(path, one, 8, requests)
    row = {
        "task": name,
        "preset": config.name,
        "overrides": overrides,
        "batch_size": config.train.batch_size,
        "train_examples_per_s": round(rows / train_s, 1),
        "export_s": round(export_s, 1),
        **{k: round(v, 2) for k, v in latency.items()},
    }
    log(f"  {row}")
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=8, help="per training round")
    parser.add_argument("--max-epochs", type=int, default=5)
    parser.add_argument("--eval-size", type=int, default=1000)
    parser.add_argument("--chunk", type=int, default=25, help="batches between checks")
    parser.add_argument("--requests", type=int, default=300, help="per C thread")
    parser.add_argument("--xla", action="store_true", help="add ours_xla")
    parser.add_argument("--train-size", type=int, help="train on this many (a check)")
    parser.add_argument(
        "--tasks",
        nargs="*",
        help="a row per task, NAME, NAME:PRESET or NAME:PRESET@KEY=VALUE,... "
        "(default: all)",
    )
    parser.add_argument("--skip", action="append", default=[],
                        choices=["training", "quality", "serving"])  # fmt: skip
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override the dates preset for every candidate "
        "(e.g. train.learning_rate=5e-3)",
    )
    parser.add_argument(
        "--peer-learning-rate",
        type=float,
        action="append",
        default=[],
        help="add the peer at this rate too, as candidate peer@RATE",
    )
    parser.add_argument(
        "--candidates",
        nargs="+",
        help="train only these (ours and peer are always kept)",
    )
    args = parser.parse_args(argv)

    t_start = time.time()
    if args.tasks is not None:
        from pipelines import registry

        names = args.tasks or [n for n in registry.names() if n != "locale"]
        tmp = Path(tempfile.mkdtemp(prefix="bench-tasks-"))
        try:
            rows = [task_row(n, args.batches, args.requests, tmp) for n in names]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for row in rows:
            print(row)
        if args.json:
            paired.write_json(
                args.json,
                "python -m benchmarks.bench_pipeline " + " ".join(argv or sys.argv[1:]),
                paired.environment(),
                tasks=rows,
            )
        return 0
    task, config, configs, data, tokenizers, tmp = setup(
        args.xla, args.set, args.peer_learning_rate
    )
    if args.candidates:
        unknown = set(args.candidates) - set(configs)
        if unknown:
            parser.error(
                f"--candidates: unknown {sorted(unknown)}, known {list(configs)}"
            )
        # ours and peer serve the exports; peer@RATE was asked for by name.
        keep = {"ours", "peer", *args.candidates, *(n for n in configs if "@" in n)}
        configs = {n: c for n, c in configs.items() if n in keep}
    if args.train_size:
        data.train = data.train[: args.train_size]
    train_sets = datasets(task, configs, data, tokenizers)
    held_out = list(data.valid[: args.eval_size])
    results = {}
    try:
        if "training" not in args.skip:
            models = build_models(task, configs, tokenizers)
            results["training"] = training_throughput(
                models, train_sets, args.batches, args.rounds
            )
        # Fresh models: the quality clock starts from the first step.
        models = build_models(task, configs, tokenizers)
        if "quality" not in args.skip:
            greedy = greedy_functions(task, configs, models, tokenizers)
            results["time_to_99"] = time_to_quality(
                models, train_sets, greedy, held_out, args.max_epochs, args.chunk
            )
        if "serving" not in args.skip:
            exports = export_both(task, config, models, tokenizers, tmp / "serving")
            results["exports"] = exports
            log("serving: exported greedy and beam-4, in process")
            results["serving"] = serving_throughput(exports, held_out, args.rounds)
            log("serving: C loader, 8 threads")
            results["c_loader"] = c_loader_latency(exports, 3, args.requests)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["seconds"] = round(time.time() - t_start)
    print(report(results))
    if args.json:
        paired.write_json(
            args.json,
            "python -m benchmarks.bench_pipeline " + " ".join(argv or sys.argv[1:]),
            paired.environment(),
            **results,
        )
    return 0


def report(results: dict) -> str:
    lines = []
    if "training" in results:
        t = results["training"]
        lines.append("training tokens/s (median):")
        for name, s in t["tokens_per_s"].items():
            lines.append(f"  {name:<16} {s['median']:>10,.0f}")
        for pair, s in t["ratios"].items():
            lines.append(f"  {pair:<28} {paired.fmt_spread(s)}")
    if "time_to_99" in results:
        q = results["time_to_99"]
        lines.append("time to 99% greedy exact match (training seconds, epochs):")
        for name, hist in q["history"].items():
            got = q["reached"].get(name)
            where = (
                f"{got['train_s']} s, {got['epochs']} epochs" if got else "not reached"
            )
            ems = " ".join(f"{h['exact_match']:.3f}" for h in hist)
            lines.append(f"  {name:<16} {where:<24} EM by chunk: {ems}")
        for pair, r in q["ratios"].items():
            lines.append(f"  {pair:<28} {r}")
    if "exports" in results:
        for name, e in results["exports"].items():
            lines.append(
                f"export {name}: {e['export_s']} s"
                + (f" (+ audit {e['audit_s']} s)" if "audit_s" in e else "")
                + f", load and first call {e['first_call_s']} s"
            )
    for batch, s in results.get("serving", {}).items():
        sps = ", ".join(
            f"{n} {v['median']:,.1f}" for n, v in s["sentences_per_s"].items()
        )
        lines.append(f"exported, {batch}: sentences/s {sps}")
        lines.append(f"  greedy ours/peer {paired.fmt_spread(s['greedy_ratio'])}")
        lines.append(
            f"  beam-4 ours / peer greedy {paired.fmt_spread(s['beam4_ratio'])}"
        )
        lines.append(
            f"  XLA export: greedy / peer {paired.fmt_spread(s['xla_greedy_ratio'])}, "
            f"beam-4 / peer greedy {paired.fmt_spread(s['xla_beam4_ratio'])}"
        )
    for name, s in results.get("c_loader", {}).items():
        lines.append(
            f"C loader, 8 threads, batch 1, {name}: "
            + ", ".join(f"{k} {v['median']:.2f}" for k, v in s.items())
        )
    lines.append(f"({results['seconds']} s in all)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
