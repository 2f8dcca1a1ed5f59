"""The translation pipeline's steps: train, evaluate, export.

A run lives in one folder (``run_dir``)::

    config.yaml                 the resolved configuration
    data_summary.txt            what the corpus looked like after filtering
    source_tokenizer.json       vocabularies learned from the training split
    target_tokenizer.json
    backup/                     BackupAndRestore state: a rerun resumes here
    checkpoints/best.weights.h5 best validation loss so far
    model.weights.h5            the final weights (written last, atomically)
    logs/                       TensorBoard
    history.csv                 one row per epoch
    metrics.json, translations.tsv, plots/   from evaluate
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from pipelines.core import config as config_lib
from pipelines.core.strategy import is_chief, make_strategy
from pipelines.core.text import END, PAD, START, learn_tokenizer, load_tokenizer
from pipelines.data import filter_length, load_corpus, split_pairs, summarize
from pipelines.translation.model import build_model
from pipelines.translation.translator import Translator

SOURCE_TOKENIZER = "source_tokenizer.json"
TARGET_TOKENIZER = "target_tokenizer.json"
WEIGHTS = "model.weights.h5"


class PipelineError(RuntimeError):
    """A run cannot go on; the message says what to fix."""


def load_splits(config: config_lib.TranslationConfig):
    """The filtered, deterministic train/valid/test splits of the corpus."""
    data = config.data
    pairs = load_corpus(data.corpus)
    if data.limit:
        pairs = pairs[: data.limit]
    pairs = filter_length(pairs, data.max_source_words, data.max_target_words)
    if not pairs:
        raise PipelineError(
            f"data: no pairs left in {data.corpus!r} after the length filter "
            f"({data.max_source_words} / {data.max_target_words} words)."
        )
    return split_pairs(
        pairs,
        data.valid_fraction,
        data.test_fraction,
        seed=data.seed,
        key=data.split_key,
    )


def _ragged_ids(tokenizer, texts: list[str], limit: int) -> tf.RaggedTensor:
    ids = []
    for start in range(0, len(texts), 4096):
        ids.append(tokenizer.tokenize(tf.constant(texts[start : start + 4096])))
    return tf.concat(ids, 0)[:, :limit]


def _source_length(source, target_in, target_out):
    return tf.shape(source)[0]


def _not_empty(source, target_in, target_out):
    return tf.shape(source)[0] > 0


def _as_features(source, target_in, target_out):
    return {"source": source, "target_in": target_in}, target_out


def make_dataset(
    pairs, source_tok, target_tok, config, training: bool, replicas: int = 1
) -> tf.data.Dataset:
    """Teacher-forcing batches ``({"source", "target_in"}, target_out)``.

    Pairs are bucketed by source length so that a batch holds sentences of
    similar length (little padding); the target gets ``[START]`` in front of
    the decoder input and ``[END]`` after the expected output. Under a
    strategy with ``replicas`` replicas, every batch is cut to a multiple of
    ``replicas`` rows (a bucket's last batch loses at most ``replicas - 1``
    pairs): Keras 3.15 fails on uneven splits (an empty replica breaks the
    gradient all-reduce; a 7/6 split breaks the first validation batch, which
    it sums across replicas to build the metrics).
    """
    tok = config.tokenizer
    source = _ragged_ids(source_tok, [s for s, _ in pairs], tok.max_source_tokens)
    target = _ragged_ids(target_tok, [t for _, t in pairs], tok.max_target_tokens)
    data = tf.data.Dataset.from_tensor_slices((source, target))
    if training:
        data = data.shuffle(
            len(pairs), seed=config.train.seed, reshuffle_each_iteration=True
        )

    def add_markers(s, t):
        return s, tf.concat([[START], t], 0), tf.concat([t, [END]], 0)

    data = data.map(add_markers, num_parallel_calls=tf.data.AUTOTUNE)
    step = max(4, tok.max_source_tokens // 8)
    boundaries = list(range(step, tok.max_source_tokens + 1, step))
    data = data.bucket_by_sequence_length(
        _source_length,
        bucket_boundaries=boundaries,
        bucket_batch_sizes=[config.train.batch_size] * (len(boundaries) + 1),
        padding_values=(PAD, PAD, PAD),
        drop_remainder=False,
    )
    if replicas > 1:

        def even(*batch):
            rows = tf.shape(batch[0])[0] // replicas * replicas
            return tuple(x[:rows] for x in batch)

        data = data.map(even).filter(_not_empty)
    data = data.map(_as_features)
    return data.prefetch(tf.data.AUTOTUNE)


class TokenAccuracy(keras.metrics.Metric):
    """Share of non-padding target tokens predicted right (teacher forcing)."""

    def __init__(self, name="token_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.hits = self.add_variable((), initializer="zeros", name="hits")
        self.count = self.add_variable((), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        ops = keras.ops
        y_true = ops.cast(y_true, "int32")
        mask = ops.cast(ops.not_equal(y_true, PAD), "float32")
        predicted = ops.cast(ops.argmax(y_pred, -1), "int32")
        hits = ops.cast(ops.equal(predicted, y_true), "float32") * mask
        self.hits.assign_add(ops.sum(hits))
        self.count.assign_add(ops.sum(mask))

    def result(self):
        return self.hits / keras.ops.maximum(self.count, 1.0)


def tokenizers(run_dir: Path, splits, config, create: bool):
    """Learn both vocabularies from the training split, or load the run's own."""
    paths = run_dir / SOURCE_TOKENIZER, run_dir / TARGET_TOKENIZER
    if all(p.exists() for p in paths):
        return tuple(load_tokenizer(p) for p in paths)
    if not create:
        raise PipelineError(
            f"{run_dir} has no {SOURCE_TOKENIZER}/{TARGET_TOKENIZER}: train a model "
            "there first (`attention-pipelines translation train`)."
        )
    tok = config.tokenizer
    learned = []
    for side, path in zip((0, 1), paths, strict=True):
        texts = [pair[side] for pair in splits.train]
        tokenizer = learn_tokenizer(tok.kind, texts, tok.vocab_size)
        tokenizer.save(path)
        learned.append(tokenizer)
    return tuple(learned)


def train(config: config_lib.TranslationConfig, run_dir: str | Path) -> dict:
    """Train (or resume) the model of ``config`` in ``run_dir``; returns history."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = run_dir / "config.yaml"
    if saved.exists() and (run_dir / "backup").exists():
        previous = config_lib.load(str(saved))
        if config_lib.to_dict(previous) != config_lib.to_dict(config):
            raise PipelineError(
                f"{run_dir} holds an interrupted run with another configuration "
                f"({saved}); resume it with `--config {saved}` or use a new --run-dir."
            )
    config_lib.save(config, saved)
    keras.utils.set_random_seed(config.train.seed)
    if config.train.mixed_precision:
        keras.mixed_precision.set_global_policy(config.train.mixed_precision)

    t0 = time.time()
    splits = load_splits(config)
    summary = summarize(splits)
    print(summary)
    (run_dir / "data_summary.txt").write_text(summary + "\n")
    source_tok, target_tok = tokenizers(run_dir, splits, config, create=True)
    print(
        f"Vocabularies ({config.tokenizer.kind}): source {source_tok.vocab_size}, "
        f"target {target_tok.vocab_size} ({time.time() - t0:.0f} s)"
    )
    strategy = make_strategy(config.train.strategy, config.train.tpu)
    replicas = strategy.num_replicas_in_sync
    print(f"Strategy: {type(strategy).__name__} with {replicas} replica(s)")
    train_data = make_dataset(
        splits.train, source_tok, target_tok, config, True, replicas
    )
    valid_data = make_dataset(
        splits.valid, source_tok, target_tok, config, False, replicas
    )
    with strategy.scope():
        model = build_model(
            config.model,
            source_tok.vocab_size,
            target_tok.vocab_size,
            config.tokenizer.max_target_tokens + 1,
        )
        model.trainer.compile(
            optimizer=keras.optimizers.Adam(
                config.train.learning_rate, clipnorm=config.train.clipnorm
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, ignore_class=PAD
            ),
            metrics=[TokenAccuracy()],
        )
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    callbacks = [
        keras.callbacks.BackupAndRestore(str(run_dir / "backup")),
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.ModelCheckpoint(
            str(run_dir / "checkpoints" / "best.weights.h5"),
            monitor="val_loss",
            save_best_only=True,
            save_weights_only=True,
        ),
        keras.callbacks.EarlyStopping(
            monitor="val_loss",
            patience=config.train.early_stopping_patience,
            restore_best_weights=True,
        ),
        keras.callbacks.TensorBoard(str(run_dir / "logs")),
        keras.callbacks.CSVLogger(str(run_dir / "history.csv"), append=True),
    ]
    history = model.trainer.fit(
        train_data,
        validation_data=valid_data,
        epochs=config.train.epochs,
        steps_per_epoch=config.train.steps_per_epoch,
        callbacks=callbacks,
        shuffle=False,  # the dataset shuffles itself
        verbose=1 if sys.stdout.isatty() else 2,
    )
    losses = history.history.get("loss", [])
    if losses and not np.isfinite(losses[-1]):
        raise PipelineError(
            "training diverged (loss is not finite); the last good weights are in "
            f"{run_dir / 'checkpoints'}. Lower train.learning_rate and rerun."
        )
    if is_chief():
        tmp = run_dir / (WEIGHTS + ".partial.weights.h5")
        model.trainer.save_weights(str(tmp))
        tmp.replace(run_dir / WEIGHTS)
    print(f"Trained in {time.time() - t0:.0f} s; weights: {run_dir / WEIGHTS}")
    return history.history


def load_translator(
    run_dir: str | Path,
) -> tuple[Translator, config_lib.TranslationConfig]:
    """The trained model of ``run_dir`` wrapped for translation."""
    run_dir = Path(run_dir)
    if not (run_dir / WEIGHTS).exists():
        raise PipelineError(
            f"{run_dir / WEIGHTS} not found: train first "
            f"(`attention-pipelines translation train --run-dir {run_dir}`)."
        )
    config = config_lib.load(str(run_dir / "config.yaml"))
    source_tok, target_tok = tokenizers(run_dir, None, config, create=False)
    model = build_model(
        config.model,
        source_tok.vocab_size,
        target_tok.vocab_size,
        config.tokenizer.max_target_tokens + 1,
    )
    model.trainer.load_weights(str(run_dir / WEIGHTS))
    return Translator(model, source_tok, target_tok, config), config


def translate_texts(
    translator: Translator,
    texts: list[str],
    beam_width: int,
    batch_size: int,
    progress: bool = True,
) -> dict[str, np.ndarray]:
    """Translate in batches with one traced graph; outputs as numpy arrays."""
    fn = translator.traced_translate()
    alpha = tf.constant(translator.default_length_penalty, tf.float32)
    bar = None
    if progress:  # a live bar on a terminal, one line at the end otherwise
        verbose = 1 if sys.stdout.isatty() else 2
        bar = keras.utils.Progbar(len(texts), verbose=verbose, unit_name="sentence")
    parts: dict[str, list] = {}
    for start in range(0, len(texts), batch_size):
        batch = texts[start : start + batch_size]
        out = fn(tf.constant(batch), tf.constant(beam_width, tf.int32), alpha)
        for key in ("translation", "score", "length"):
            parts.setdefault(key, []).append(out[key].numpy())
        if bar is not None:
            bar.add(len(batch))
    return {k: np.concatenate(v) for k, v in parts.items()}


def decode_strings(values) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


def write_json(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)
