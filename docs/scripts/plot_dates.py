"""Train the dates example longer, plot an alignment: docs/images/dates_alignment.png.

Run from the root of a checkout (TensorFlow backend, a few minutes on a CPU):

    python docs/scripts/plot_dates.py

The model is the one of docs/examples/dates.md (a bidirectional GRU encoder, an
`AttentionDecoder` with Bahdanau attention trained with teacher forcing,
`greedy_search` to decode); only the data size and the number of epochs
differ. It prints the exact match on held-out dates (dates never seen in
training) and draws the alignment of one of them.
"""

import argparse
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")

import keras  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attention_layers.decoding import greedy_search, rnn_step_fn  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from dates_demo import (  # noqa: E402
    END,
    START,
    TARGET_CHARS,
    CharVocab,
    encode_targets,
    make_pairs,
)
from seq2seq import build_seq2seq  # noqa: E402

OUT = ROOT / "docs" / "images" / "dates_alignment.png"
SAMPLE = "montag, 9. märz 1987"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    pairs, _ = make_pairs(args.train + args.test, seed=0)
    test, train = pairs[: args.test], pairs[args.test :]
    vocab = CharVocab([text for text, _ in train])
    length = max(len(text) for text, _ in pairs)
    x_train = vocab.encode([text for text, _ in train], length)
    t_in, t_out = encode_targets([iso for _, iso in train])

    model, encoder, target_embedding, decoder, projection = build_seq2seq(
        len(vocab), 3 + len(TARGET_CHARS), args.units
    )
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3, clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit([x_train, t_in], t_out, batch_size=64, epochs=args.epochs, verbose=2)

    def normalise(texts):
        source_ids = vocab.encode(texts, length)
        memory, state = encoder.predict(source_ids, verbose=0, batch_size=500)
        batch = len(texts)
        step_fn = rnn_step_fn(
            target_embedding, decoder.cell, projection, memory, source_ids != 0
        )
        out = greedy_search(
            step_fn,
            decoder.initial_states(batch, [state]),
            np.full((batch,), START, "int32"),
            end_id=END,
            max_length=len("YYYY-MM-DD") + 1,
        )
        tokens = np.asarray(out["tokens"])
        isos = ["".join(TARGET_CHARS[i - 3] for i in row if i >= 3) for row in tokens]
        return isos, np.asarray(out["alignments"])

    predicted, _ = normalise([text for text, _ in test])
    exact = np.mean([p == iso for p, (_, iso) in zip(predicted, test, strict=True)])
    print(f"Held-out exact match: {exact:.1%} ({len(test)} dates)")

    (iso,), alignments = normalise([SAMPLE])
    weights = alignments[0, : len(iso), : len(SAMPLE)]
    fig, ax = plt.subplots(figsize=(7.5, 3.8), dpi=120)
    ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0.0)
    ax.set_xticks(range(len(SAMPLE)), [c if c != " " else "␣" for c in SAMPLE])
    ax.set_yticks(range(len(iso)), list(iso))
    ax.set_xlabel("source characters")
    ax.set_ylabel("ISO output (greedy_search)")
    ax.set_title(f"{SAMPLE!r} -> {iso}: BahdanauAttention alignment")
    fig.tight_layout()
    fig.savefig(args.out)
    plt.close(fig)
    print(f"Wrote {args.out}")
    return exact


if __name__ == "__main__":
    main()
