"""Train, export and use a date-normalising encoder-decoder with Bahdanau attention.

Multi-locale dates ("9 de marzo de 1987", "Montag, 9. März 1987") are read
character by character by a bidirectional GRU; a GRU decoder attends over the
encoder states with `attention_layers.BahdanauAttention` and writes the ISO
date ("1987-03-09"). The run trains with Keras progress bars, reports exact
match on held-out dates, saves a ``.keras`` file, exports a SavedModel, and
then, in a fresh process that never imports this library, loads the SavedModel
with TensorFlow alone and normalises sample dates, drawing the alignment.

    python examples/dates_demo.py --out runs/dates
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import attention_layers as al  # noqa: E402

LOCALES = ["en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "pt_BR", "nl_NL"]
FORMATS = ["short", "medium", "long", "full"]
TARGET_CHARS = "0123456789-"
PAD, START, END = 0, 1, 2  # target ids; characters start at 3
TARGET_LENGTH = 10  # "YYYY-MM-DD"


def render(date: datetime.date, rng: random.Random) -> str:
    from babel.dates import format_date

    locale = rng.choice(LOCALES)
    formats = FORMATS[1:] if locale == "en_US" else FORMATS  # 3/9/87 is ambiguous
    return format_date(date, format=rng.choice(formats), locale=locale).lower()


def make_pairs(n: int, seed: int, exclude: set | None = None):
    """``n`` (text, iso) pairs of distinct dates in 1950-2049 not in ``exclude``."""
    rng = random.Random(seed)
    start, days = datetime.date(1950, 1, 1), 365 * 100 + 24
    pairs, seen = [], set(exclude or ())
    while len(pairs) < n:
        date = start + datetime.timedelta(days=rng.randrange(days))
        if date in seen:
            continue
        seen.add(date)
        pairs.append((render(date, rng), date.isoformat()))
    return pairs, seen


class CharVocab:
    """Character vocabulary of the source side; id 0 pads, 1 is unknown."""

    def __init__(self, texts):
        self.chars = sorted({c for t in texts for c in t})
        self.index = {c: i + 2 for i, c in enumerate(self.chars)}

    def __len__(self):
        return len(self.chars) + 2

    def encode(self, texts, length):
        ids = np.zeros((len(texts), length), "int32")
        for row, text in enumerate(texts):
            for col, ch in enumerate(text[:length]):
                ids[row, col] = self.index.get(ch, 1)
        return ids


def encode_targets(isos):
    ids = np.array([[3 + TARGET_CHARS.index(c) for c in s] for s in isos], "int32")
    start = np.full((len(isos), 1), START, "int32")
    end = np.full((len(isos), 1), END, "int32")
    return np.concatenate([start, ids], 1), np.concatenate([ids, end], 1)


def build_model(source_vocab: int, target_vocab: int, units: int = 96):
    source = keras.Input((None,), dtype="int32", name="source")
    target_in = keras.Input((None,), dtype="int32", name="target_in")
    x = keras.layers.Embedding(source_vocab, 48, mask_zero=True)(source)
    memory = keras.layers.Bidirectional(
        keras.layers.GRU(units, return_sequences=True), name="encoder"
    )(x)
    y = keras.layers.Embedding(target_vocab, 32, mask_zero=True)(target_in)
    state = keras.layers.GRU(2 * units, return_sequences=True, name="decoder")(y)
    context, alignment = al.BahdanauAttention(units, name="attention")(
        state, memory, return_attention_scores=True
    )
    hidden = keras.layers.Concatenate()([state, context])
    hidden = keras.layers.Dense(2 * units, activation="tanh")(hidden)
    logits = keras.layers.Dense(target_vocab, name="logits")(hidden)
    inputs = {"source": source, "target_in": target_in}
    # Two views of the same layers: one to train, one that also shows alignments.
    return (
        keras.Model(inputs, logits),
        keras.Model(inputs, {"logits": logits, "alignment": alignment}),
    )


def greedy(predict, source_ids):
    """Decode the 10 ISO characters one at a time; ``predict`` maps feeds to dicts."""
    batch = source_ids.shape[0]
    target = np.full((batch, 1), START, "int32")
    for _ in range(TARGET_LENGTH):
        out = predict({"source": source_ids, "target_in": target})
        nxt = np.argmax(out["logits"][:, -1], -1).astype("int32")
        target = np.concatenate([target, nxt[:, None]], 1)
    texts = [
        "".join(TARGET_CHARS[i - 3] if i >= 3 else "?" for i in row)
        for row in target[:, 1:]
    ]
    return texts, out["alignment"]


def export(model, path):
    """SavedModel with named inputs ``source``/``target_in`` and named outputs."""
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serving_default",
        fn=lambda source, target_in: model(
            {"source": source, "target_in": target_in}, training=False
        ),
        input_signature=[
            tf.TensorSpec((None, None), tf.int32, name="source"),
            tf.TensorSpec((None, None), tf.int32, name="target_in"),
        ],
    )
    tmp = path + ".partial"
    archive.write_out(tmp, verbose=False)
    os.replace(tmp, path)  # never a half-written export directory


def serve_main(export_dir: str, vocab_path: str, png: str):
    """Normalise sample dates with the SavedModel alone (this library blocked)."""
    sys.modules["attention_layers"] = None
    import tensorflow as tf

    with open(vocab_path) as f:
        meta = json.load(f)
    vocab = CharVocab([])
    vocab.chars = meta["chars"]
    vocab.index = {c: i + 2 for i, c in enumerate(vocab.chars)}
    fn = tf.saved_model.load(export_dir).signatures["serving_default"]

    def predict(feed):
        out = fn(**{k: tf.constant(v) for k, v in feed.items()})
        return {k: v.numpy() for k, v in out.items()}

    samples = [
        "montag, 9. märz 1987",
        "9 de marzo de 1987",
        "march 9, 1987",
        "lunedì 31 dicembre 2029",
        "12.07.54",
    ]
    texts, alignment = greedy(predict, vocab.encode(samples, meta["source_length"]))
    print("\nNormalised by the exported SavedModel (library not importable):")
    for s, t in zip(samples, texts, strict=True):
        print(f"  {s!r:32} -> {t}")
    plot_alignment(samples[0], texts[0], alignment[0], png)
    print(f"Alignment heatmap: {png}")


def plot_alignment(source: str, target: str, weights, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, len(source) * 0.3), 3.5))
    ax.imshow(weights[: len(target), : len(source)], cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(source)), list(source))
    ax.set_yticks(range(len(target)), list(target))
    ax.set_xlabel("source characters")
    ax.set_ylabel("ISO output")
    ax.set_title("BahdanauAttention alignment")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/dates", help="output folder")
    parser.add_argument("--train", type=int, default=20000, help="training pairs")
    parser.add_argument("--test", type=int, default=1000, help="held-out pairs")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--serve", nargs=3, metavar=("EXPORT", "VOCAB", "PNG"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.serve:
        return serve_main(*args.serve)

    keras.utils.set_random_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    train, seen = make_pairs(args.train + args.test, args.seed)
    test, train = train[: args.test], train[args.test :]
    vocab = CharVocab([s for s, _ in train])
    length = max(len(s) for s, _ in train) + 2
    print(
        f"Data: {len(train)} training and {len(test)} held-out dates (disjoint), "
        f"{len(LOCALES)} locales, {len(vocab)} source symbols, max length {length}."
    )
    x_train = vocab.encode([s for s, _ in train], length)
    t_in, t_out = encode_targets([d for _, d in train])
    trainer, model = build_model(len(vocab), 3 + len(TARGET_CHARS))
    trainer.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    trainer.fit(
        {"source": x_train, "target_in": t_in},
        t_out,
        batch_size=128,
        epochs=args.epochs,
        validation_split=0.05,
        callbacks=[
            keras.callbacks.EarlyStopping(
                monitor="val_loss", patience=2, restore_best_weights=True
            )
        ],
        verbose=2,
    )
    x_test = vocab.encode([s for s, _ in test], length)
    predicted, _ = greedy(lambda f: model.predict(f, verbose=0, batch_size=500), x_test)
    exact = np.mean([p == d for p, (_, d) in zip(predicted, test, strict=True)])
    print(f"Held-out exact match: {exact:.2%} ({len(test)} dates)")

    keras_path = os.path.join(args.out, "dates.keras")
    model.save(keras_path)
    export_dir = os.path.join(args.out, "export", "1")
    if os.path.exists(export_dir):
        import shutil

        shutil.rmtree(export_dir)
    os.makedirs(os.path.dirname(export_dir), exist_ok=True)
    export(model, export_dir)
    vocab_path = os.path.join(args.out, "vocab.json")
    with open(vocab_path, "w") as f:
        json.dump({"chars": vocab.chars, "source_length": length}, f)
    print(f"Saved {keras_path} and SavedModel {export_dir} in {time.time() - t0:.0f} s")
    png = os.path.join(args.out, "alignment.png")
    subprocess.run(
        [sys.executable, __file__, "--serve", export_dir, vocab_path, png], check=True
    )
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump({"exact_match": exact, "test_size": len(test)}, f)
    return exact


if __name__ == "__main__":
    main()
