"""The smallest complete pipeline task: which locale wrote this date?

A walk-through of the task interface (docs/pipelines/adding_a_task.md). The
examples are dates written out by Babel in eight locales ("9 de marzo de
1987", "Montag, 9. März 1987"); the model reads the characters with a
bidirectional GRU, pools them with `attention_layers.AttentionPooling` and
names the locale. The attention weights show which characters gave the
locale away. It decodes nothing step by step: one input, one label.

Register it, then every verb and the pipeline contract work on it:

    ATTENTION_PIPELINES_TASKS=locale=examples.locale_task:TASK \\
        attention-pipelines locale demo --config tiny
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pipelines.core.client import Client
from pipelines.core.config import RunConfig, SplitConfig, TrainConfig
from pipelines.core.contract_cases import BadRequest, ContractCases, DataCase
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.run_dir import read_json, write_json
from pipelines.core.task import Data, Task, saved_or_learned

TOKENIZER, LABELS, PREDICTIONS = "tokenizer.json", "labels.json", "predictions.tsv"
SAMPLES = ("9 de marzo de 1987", "montag, 9. märz 1987", "march 9, 1987")


# -- 1. configuration: the task's sections beside the shared train and export ----


@dataclass
class DataConfig(SplitConfig):  # valid_fraction, test_fraction and seed, shared
    source: str = "dates:4000"  # "dates:N" (generated) or "tsv:PATH" (text, label)


@dataclass
class ModelConfig:
    embedding_dim: int = field(default=16, metadata={"range": (1, None)})
    units: int = field(default=32, metadata={"range": (1, None)})
    max_chars: int = field(default=48, metadata={"range": (1, None)})


@dataclass
class LocaleConfig(RunConfig):
    name: str = "locale"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)


PRESETS = {
    "locale": lambda: LocaleConfig(train=TrainConfig(epochs=20, batch_size=32)),
    "tiny": lambda: LocaleConfig(
        name="tiny",
        data=DataConfig(source="dates:600"),
        model=ModelConfig(embedding_dim=8, units=8),
        train=TrainConfig(epochs=1, batch_size=32, early_stopping_patience=1),
    ),
}


# -- 2. data ------------------------------------------------------------------------


def generate(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (date text, locale) pairs in the long and full formats (the short
    ones are alike in several locales: 09/03/1987)."""
    import datetime

    from pipelines.translation.dates import FIRST_DATE, LOCALES, render_date

    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        date = FIRST_DATE + datetime.timedelta(days=rng.randrange(36524))
        locale = rng.choice(LOCALES)
        pairs.append((render_date(date, locale, rng.choice(("long", "full"))), locale))
    return pairs


def load_examples(source: str) -> list[tuple[str, str]]:
    kind, _, argument = source.partition(":")
    if kind == "dates" and argument.isdigit():
        return generate(int(argument), seed=0)
    if kind == "tsv" and argument:
        from pipelines.data import read_tsv

        return read_tsv(argument)
    raise ConfigError(
        f"config: `data.source` must be dates:N or tsv:PATH, received {source!r}."
    )


class Preprocessors(NamedTuple):
    tokenizer: object  # pipelines.core.text.CharTokenizer
    labels: list[str]


# -- 3. the model -------------------------------------------------------------------


class LocaleModel:
    """Characters -> BiGRU -> attention pooling -> the locale's logits."""

    def __init__(self, config: LocaleConfig, vocab_size: int, labels: int):
        import keras

        import attention_layers as al

        size = config.model
        text = keras.Input((None,), dtype="int32", name="text")
        x = keras.layers.Embedding(vocab_size, size.embedding_dim, mask_zero=True)(text)
        states = keras.layers.Bidirectional(
            keras.layers.GRU(size.units, return_sequences=True)
        )(x)
        pooled, weights = al.AttentionPooling(units=size.units, name="pooling")(
            states, return_attention_scores=True
        )
        logits = keras.layers.Dense(labels, name="logits")(pooled)
        self.trainer = keras.Model(text, logits, name="locale")
        self.scorer = keras.Model(text, [logits, weights], name="locale_scorer")


# -- 4. serving: strings in, a label and the attention out ---------------------------


def _serving_module_class():
    import tensorflow as tf

    from pipelines.core.serving import ServingModule, checked_strings

    class LocaleClassifier(ServingModule):
        """``serving_default``: ``text`` [B] strings -> ``label``, ``probability``,
        ``attention`` [B, T], ``tokens`` [B, T]. A text with no characters gets
        the label "" and probability 0."""

        def __init__(self, model, preprocessors, config, samples):
            super().__init__(model.trainer, name="locale_classifier")
            self.scorer = model.scorer
            self.tokenizer = preprocessors.tokenizer
            self.labels = tf.constant(preprocessors.labels)
            self.max_chars = config.model.max_chars
            self.samples = samples

        def classify(self, text):
            text = checked_strings("text", text)
            ids = self.tokenizer.tokenize(text)[:, : self.max_chars].to_tensor(0)
            ids = tf.pad(ids, [[0, 0], [0, 1]])[:, : tf.maximum(tf.shape(ids)[1], 1)]
            logits, weights = self.scorer(ids)
            probabilities = tf.nn.softmax(tf.cast(logits, tf.float32))
            has_text = tf.reduce_any(ids != 0, axis=1)
            best = tf.argmax(probabilities, axis=1, output_type=tf.int32)
            return {
                "label": tf.where(has_text, tf.gather(self.labels, best), ""),
                "probability": tf.where(has_text, tf.reduce_max(probabilities, 1), 0.0),
                "attention": tf.cast(weights, tf.float32),
                "tokens": self.tokenizer.id_to_token(ids),
            }

        def signatures(self):
            spec = tf.TensorSpec(None, tf.string, name="text")
            return {
                "serving_default": tf.function(self.classify, input_signature=[spec])
            }

        def warmup_requests(self):
            return [{"text": np.array(self.samples, dtype=object)}]

    return LocaleClassifier


# -- 6. the command line: how predict prints the export's answers --------------------


class LocaleClient(Client):
    def evaluation_summary(self, metrics) -> str:
        accuracy = f"accuracy {metrics['accuracy']:.2%}"
        return self.summary_line(metrics, accuracy, [("accuracy", "accuracy", ".2%")])

    def predict(self, export_dir, inputs, args: argparse.Namespace) -> None:
        from pipelines.core.serving import call_export

        out = call_export(export_dir, {"text": np.array(inputs, dtype=object)})
        for text, label, p in zip(
            inputs, out["label"], out["probability"], strict=True
        ):
            print(f"{text}\n  -> {label.decode()}   (probability {p:.3f})")


# -- 7. the pipeline contract's cases: requests, bad requests, bad data --------------


class LocaleContract(ContractCases):
    main_inputs = ("text",)

    def requests(self, config) -> list[dict]:
        return [{"text": np.array(SAMPLES, dtype=object)}]

    def bad_requests(self, config) -> list[BadRequest]:
        def empty_text(out):
            assert out["label"][0] == b"" and out["probability"][0] == 0.0
            assert out["label"][1] != b""

        def empty_batch(out):
            assert out["label"].shape == (0,)

        def texts(*rows):
            return np.array(list(rows), dtype=object)

        vector = "serving input `text` must be a vector"
        return [
            BadRequest(
                "empty text", {"text": texts("", "9 mars 1987")}, check=empty_text
            ),
            BadRequest("empty batch", {"text": texts()}, check=empty_batch),
            BadRequest(
                "invalid utf-8",
                {"text": texts(b"\xff")},
                "serving input `text` must be valid UTF-8",
            ),
            BadRequest(
                "rank 2", {"text": np.array([["a"]], object)}, vector, python=False
            ),
        ]

    def data(self, folder) -> dict[str, DataCase]:
        empty = Path(folder) / "empty.tsv"
        empty.write_text("")
        return {
            "empty_file": DataCase([f"data.source=tsv:{empty}"], str(empty)),
            "empty_valid": DataCase(["data.valid_fraction=0.0"]),
        }


# -- 8. the task: every hook the core calls, its client and contract ------------------


class LocaleTask(Task):
    name = "locale"
    description = "which locale wrote this date: characters, attention pooling"
    default_preset = "locale"
    run_files = (TOKENIZER, LABELS, PREDICTIONS)
    learned_files = (TOKENIZER, LABELS)
    evaluate_files = (PREDICTIONS, "plots/attention_0.png")
    client = LocaleClient()
    contract = LocaleContract()

    def presets(self):
        return PRESETS

    def load_data(self, config) -> Data:
        from pipelines.data import split_pairs

        examples = load_examples(config.data.source)
        if not examples:
            where = config.data.source.partition(":")[2] or config.data.source
            raise PipelineError(f"data: no examples in {where}.")
        kept = [(t, label) for t, label in examples if t.strip() and label.strip()]
        notes = [f"read {len(examples)} examples from {config.data.source}"]
        if len(kept) < len(examples):
            notes.append(f"dropped {len(examples) - len(kept)} with an empty field")
        long = sum(len(t) > config.model.max_chars for t, _ in kept)
        notes.append(
            f"cut {long} texts longer than {config.model.max_chars} characters"
        )
        d = config.data
        splits = split_pairs(kept, d.valid_fraction, d.test_fraction, seed=d.seed)
        return Data(splits.train, splits.valid, splits.test, notes)

    def preprocessors(self, run, data, config, create) -> Preprocessors:
        from pipelines.core.text import CharTokenizer, load_tokenizer

        def learn(data):
            tokenizer = CharTokenizer.learn([t for t, _ in data.train])
            return Preprocessors(tokenizer, sorted({label for _, label in data.train}))

        def save(preprocessors, tokenizer_path, labels_path):
            preprocessors.tokenizer.save(tokenizer_path)
            write_json(labels_path, preprocessors.labels)

        return saved_or_learned(
            self.name, run, data, create, (TOKENIZER, LABELS),
            lambda tokenizer, labels: Preprocessors(
                load_tokenizer(tokenizer), read_json(labels)
            ),
            learn, save,
        )  # fmt: skip

    def make_dataset(self, examples, preprocessors, config, training, replicas=1):
        import tensorflow as tf

        from pipelines.core.datasets import (
            bucket_batches,
            bucket_boundaries,
            training_order,
        )

        limit = config.model.max_chars
        ids = preprocessors.tokenizer.tokenize(tf.constant([t for t, _ in examples]))
        ids = ids[:, :limit]
        index = {label: i for i, label in enumerate(preprocessors.labels)}
        unseen = sorted({label for _, label in examples} - set(index))
        if unseen:
            raise PipelineError(
                f"data: labels {unseen[:5]} are not among the {len(index)} the model "
                "was trained on; a classifier cannot predict a label it never saw."
            )
        labels = [index[label] for _, label in examples]
        labels = tf.constant(labels, tf.int32)
        if training:  # a permutation per epoch, fixed by the seed and the epoch
            order = training_order(len(examples), config.train.seed)
        else:
            order = tf.data.Dataset.range(len(examples))
        data = order.map(lambda i: (ids[i], labels[i]))
        return bucket_batches(
            data,
            ids.row_lengths().numpy(),
            bucket_boundaries(limit),
            config.train.batch_size,
            limit,
            replicas=replicas,
            static=config.train.jit_compile,
            static_shapes=lambda bound: (tf.stack([bound]), []),
        ).prefetch(tf.data.AUTOTUNE)

    def build_model(self, config, preprocessors) -> LocaleModel:
        tokenizer, labels = preprocessors
        return LocaleModel(config, tokenizer.vocab_size, len(labels))

    def compile_arguments(self, config) -> dict:
        import keras

        return {
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "metrics": ["accuracy"],
        }

    def evaluate(self, run, model, preprocessors, config, examples, args) -> dict:
        import tensorflow as tf

        from pipelines.core.baselines import most_common, table
        from pipelines.core.metrics import score
        from pipelines.core.plots import alignment_heatmap
        from pipelines.core.run_dir import write_text

        module = self.serving_module(model, preprocessors, config)
        fn = module.signatures()["serving_default"]
        texts = [t for t, _ in examples]
        out = fn(tf.constant(texts))
        predicted = [p.decode() for p in out["label"].numpy()]
        truth = [label for _, label in examples]
        metrics = {"split": args.split, "run": config.name}
        metrics.update(score(["exact_match"], predicted, truth))
        metrics["accuracy"] = metrics.pop("exact_match")
        # The trivial baseline, on the same examples: the training split's
        # most common locale for every date.
        common = most_common(label for _, label in self.load_data(config).train)
        guessed = score(["exact_match"], [common] * len(truth), truth)
        metrics["baselines"] = {
            "most_common_locale": {
                "what": f"the training split's most common locale ({common!r})",
                "accuracy": guessed["exact_match"],
            }
        }
        rows = ["text\tlabel\tpredicted"]
        rows += [
            f"{t}\t{y}\t{p}" for t, y, p in zip(texts, truth, predicted, strict=True)
        ]
        write_text(run / PREDICTIONS, "\n".join(rows) + "\n")
        for i in range(min(3, len(texts))):
            alignment_heatmap(
                out["tokens"][i].numpy(),
                [predicted[i].encode()],
                out["attention"][i : i + 1].numpy(),
                run / "plots" / f"attention_{i}.png",
                title=f"{texts[i]!r} -> {predicted[i]}",
            )
        score_rows = [("accuracy", "accuracy", ".2%")]
        print(
            f"Scores on the {len(texts)} {args.split} dates, beside a trivial "
            "baseline:\n" + table({"model": metrics}, metrics["baselines"], score_rows)
        )
        return metrics

    def serving_module(self, model, preprocessors, config):
        classifier = _serving_module_class()
        return classifier(model, preprocessors, config, self.samples(config))

    def samples(self, config) -> list[str]:
        return list(SAMPLES)


TASK = LocaleTask()
