"""The extractive question-answering task: what it supplies to the pipeline core.

Passages, questions and answer spans (`pipelines.extractive.data`: country
facts from `pipelines.data.countries`, or the user's JSON Lines), a word
vocabulary with hashed buckets learned from the training split, BiDAF with a
span pointer (`pipelines.extractive.model.SpanQA`), SQuAD exact match and
F1 by phrasing and by fact (`pipelines.extractive.evaluate`), and a
`SpanAnswerer` export that takes a passage and a question as strings.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from pipelines.core.run_dir import PipelineError
from pipelines.core.task import BadRequest, Data, DataCase, Task
from pipelines.extractive import config as span_config

TOKENIZER, ANSWERS_TSV = "tokenizer.json", "answers.tsv"


def split_input(text: str) -> tuple[str, str]:
    r"""A ``predict`` input, the passage then the question, as
    ``(context, question)``: the question is the last line, or without a
    line break the last sentence; it ends in "?".

    >>> split_input("Lima is the capital of Peru. What is the capital of Peru?")
    ('Lima is the capital of Peru.', 'What is the capital of Peru?')
    >>> split_input("It borders St. Lucia.\nWhat does it border?")
    ('It borders St. Lucia.', 'What does it border?')
    """
    text = text.strip()
    if "\n" in text:
        context, question = (part.strip() for part in text.rsplit("\n", 1))
    else:
        question = re.split(r"(?<=[.!?])\s+", text)[-1]
        context = text[: len(text) - len(question)].strip()
    if not question.endswith("?") or not context:
        raise PipelineError(
            "predict: each input is a passage then a question ending in '?' (on "
            f"a line of its own, or as the last sentence), received {text[:80]!r}"
        )
    return context, question


class ExtractiveTask(Task):
    name = "extractive"
    description = (
        "extractive question answering: BiDAF span pointer, passage and question in"
    )
    default_preset = "countries"
    run_files = (TOKENIZER, ANSWERS_TSV, "span.png")
    evaluate_files = (ANSWERS_TSV, "plots/span_0.png")
    predict_aliases = ("answer",)

    def presets(self):
        return span_config.PRESETS

    # -- data ---------------------------------------------------------------
    def load_data(self, config) -> Data:
        from pipelines.extractive.data import load_data

        return load_data(config)

    def preprocessors(self, run, data, config, create):
        from pipelines.extractive.data import Preprocessors
        from pipelines.extractive.tokenizer import SpanTokenizer

        if run is not None and (run / TOKENIZER).exists():
            return Preprocessors(SpanTokenizer.load(run / TOKENIZER))
        if data is None and run is None:
            raise ValueError("preprocessors: give a run folder or data to learn from.")
        if data is None:
            raise PipelineError(
                f"{run.root} has no {TOKENIZER}: train a model there first "
                "(`attention-pipelines extractive train`)."
            )
        texts = sorted({t for e in data.train for t in (e.context, e.question)})
        t = config.tokenizer
        tokenizer = SpanTokenizer.learn(texts, t.vocab_size, t.oov_buckets)
        if create and run is not None:
            tokenizer.save(run / TOKENIZER)
        return Preprocessors(tokenizer)

    def summary(self, data, preprocessors, config) -> str:
        from pipelines.extractive.data import encode

        lines = [super().summary(data, preprocessors, config)]
        tokenizer = preprocessors.tokenizer
        lines.append(
            f"vocabulary: {len(tokenizer.words)} words and "
            f"{tokenizer.oov_buckets} hashed buckets"
        )
        for name in ("train", "valid", "test"):
            examples = data.split(name)
            if not examples:
                continue
            encoded = encode(examples, preprocessors, config)
            lengths = encoded["context"].row_lengths().numpy()
            limit = config.tokenizer.max_context_tokens
            lost = int((encoded["start"] < 0).sum())
            lines.append(
                f"{name} passages: median {int(np.median(lengths))} tokens read; "
                f"{int((lengths == limit).sum())} cut at (or as long as) "
                f"tokenizer.max_context_tokens={limit}, which cut {lost} answers"
                + (" (left out of training)" if name == "train" else "")
            )
        return "\n".join(lines)

    def make_dataset(self, examples, preprocessors, config, training, replicas=1):
        from pipelines.extractive.data import make_dataset

        return make_dataset(examples, preprocessors, config, training, replicas)

    # -- model --------------------------------------------------------------
    def build_model(self, config, preprocessors):
        from pipelines.extractive.model import SpanQA

        return SpanQA(config, preprocessors.tokenizer.vocab_size)

    def compile_arguments(self, config) -> dict:
        import keras

        def pointer():
            return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        # The sum of the two losses is the span's negative log-likelihood
        # (attention_layers.span_loss).
        return {
            "loss": {"start": pointer(), "end": pointer()},
            "metrics": {"start": ["accuracy"], "end": ["accuracy"]},
        }

    # -- evaluation ---------------------------------------------------------
    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--heatmaps", type=int, default=3, help="span plots")

    def evaluate(self, run, model, preprocessors, config, examples, args) -> dict:
        from pipelines.extractive.evaluate import evaluate

        answerer = self.serving_module(model, preprocessors, config)
        return evaluate(
            run.root, answerer, config, list(examples), args.split,
            getattr(args, "heatmaps", 3),
        )  # fmt: skip

    def evaluation_summary(self, metrics: dict) -> str:
        held = metrics.get("by_phrasing", {}).get("held_out")
        extra = f"; held-out phrasings F1 {held['f1']:.1f}" if held else ""
        return (
            f"exact match {metrics['exact_match']:.1f}, F1 {metrics['f1']:.1f} on "
            f"the {metrics['split']} split{extra}"
        )

    # -- serving ------------------------------------------------------------
    def serving_module(self, model, preprocessors, config):
        from pipelines.extractive.serving import SpanAnswerer

        samples = [split_input(text) for text in self.samples(config)]
        return SpanAnswerer(model, preprocessors, config, samples)

    def samples(self, config) -> list[str]:
        """Three questions on other facts, from the test split (else the
        validation or the training split)."""
        from pipelines.extractive.data import load_data

        data = load_data(config)
        for split in ("test", "valid", "train"):
            chosen, fields = [], set()
            for example in data.split(split):  # the first three facts asked
                if example.field not in fields and example.question.endswith("?"):
                    fields.add(example.field)
                    chosen.append(f"{example.context}\n{example.question}")
                if len(chosen) == 3:
                    break
            if chosen:
                return chosen
        raise PipelineError(
            f"data: no question of {config.data.source} ends in '?' "
            f"({len(data.train)} train / {len(data.valid)} valid / "
            f"{len(data.test)} test questions); demo and export send three as "
            "samples."
        )

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--plot", help="write the first answer's span plot here")

    def predict(self, export_dir, inputs, args) -> None:
        import tensorflow_text  # noqa: F401  registers RegexSplitWithOffsets

        from pipelines.core.serving import call_export

        pairs = [split_input(text) for text in inputs]
        out = call_export(
            export_dir,
            {
                "context": np.array([c for c, _ in pairs], dtype=object),
                "question": np.array([q for _, q in pairs], dtype=object),
            },
        )
        for text, answer, start, end, score in zip(
            inputs, out["answer"], out["start"], out["end"], out["score"], strict=True
        ):
            answer = answer.decode("utf-8")
            print(f"{text}\n  -> {answer!r}   (characters {start}-{end} of the "
                  f"passage, probability {score:.3f})")  # fmt: skip
        if getattr(args, "plot", None):
            self._plot(export_dir, pairs[0], out, args.plot)

    @staticmethod
    def _plot(export_dir, pair, out, path) -> None:
        """The first answer, boxed in its passage (the export gives no token
        probabilities: the shade marks the answer's tokens)."""
        from pipelines.data.countries import SpanExample
        from pipelines.extractive.data import token_span
        from pipelines.extractive.evaluate import span_heatmap
        from pipelines.extractive.tokenizer import SpanTokenizer

        context, question = pair
        answer = out["answer"][0].decode("utf-8")
        tokens, begins, ends = (t[0].numpy() for t in SpanTokenizer.split([context]))
        span = (-1, -1)
        if answer:
            example = SpanExample(context, question, (answer,), int(out["start"][0]))
            span = token_span(example, begins, ends)
        inside = np.zeros(len(tokens))
        if span[0] >= 0:
            inside[span[0] : span[1] + 1] = float(out["score"][0])
        span_heatmap(
            tokens, inside, np.zeros_like(inside), path, gold=None,
            title=f"{question} -> {answer!r}",
        )  # fmt: skip
        print(f"The answer in its passage: {path}")

    def demo_arguments(self, run_dir) -> list[str]:
        return ["--plot", str(Path(run_dir) / "span.png")]

    def demo_notes(self, run_dir) -> list[str]:
        return [f"span plot {Path(run_dir) / 'span.png'}"]

    # -- the pipeline contract ----------------------------------------------
    def contract_requests(self, config) -> list[dict]:
        pairs = [split_input(text) for text in self.samples(config)]
        return [
            {
                "context": np.array([c for c, _ in pairs], dtype=object),
                "question": np.array([q for _, q in pairs], dtype=object),
            }
        ]

    def bad_requests(self, config) -> list[BadRequest]:
        context, question = split_input(self.samples(config)[0])

        def strings(*rows):
            return np.array(list(rows), dtype=object)

        def unanswered(out):
            assert out["answer"][0] == b"" and out["score"][0] == 0.0
            assert out["start"][0] == 0 and out["end"][0] == 0
            assert out["score"][1] > 0.0

        def no_words(out):
            assert out["answer"].tolist() == [b""] and out["score"].tolist() == [0.0]
            assert out["start"].tolist() == [0] and out["end"].tolist() == [0]

        def empty_batch(out):
            for key in ("answer", "start", "end", "score"):
                assert out[key].shape == (0,), (key, out[key].shape)

        def long_passage(out):
            from pipelines.extractive.tokenizer import SpanTokenizer

            # Only the first tokenizer.max_context_tokens tokens are read.
            start, end = int(out["start"][0]), int(out["end"][0])
            assert 0 <= start < end
            assert many[start:end] == out["answer"][0].decode()
            tokens = SpanTokenizer.split([many[:end]])[0]
            assert tokens.row_lengths()[0] <= config.tokenizer.max_context_tokens

        many = " ".join([context] * (config.tokenizer.max_context_tokens // 4 + 1))
        return [
            BadRequest(
                "empty context",
                {
                    "context": strings(" \n ", context),
                    "question": strings(question, question),
                },
                check=unanswered,
            ),
            BadRequest(
                "no passage has a word",
                {"context": strings(""), "question": strings(question)},
                check=no_words,
            ),
            BadRequest(
                "empty question",
                {
                    "context": strings(context, context),
                    "question": strings("", question),
                },
                check=unanswered,
            ),
            BadRequest(
                "empty batch",
                {"context": strings(), "question": strings()},
                check=empty_batch,
            ),
            BadRequest(
                "context longer than the model reads",
                {"context": strings(many), "question": strings(question)},
                check=long_passage,
            ),
            BadRequest(
                "batch sizes differ",
                {"context": strings(context, context), "question": strings(question)},
                "must have the same batch size",
            ),
            BadRequest(
                "invalid utf-8 context",
                {"context": strings(b"\xff"), "question": strings(question)},
                "serving input `context` must be valid UTF-8",
            ),
            BadRequest(
                "invalid utf-8 question",
                {"context": strings(context), "question": strings(b"ok\xfe")},
                "serving input `question` must be valid UTF-8",
            ),
            BadRequest(
                "rank 2",
                {
                    "context": np.array([[context]], object),
                    "question": strings(question),
                },
                "serving input `context` must be a vector",
                python=False,
            ),
            BadRequest(
                "rank 0",
                {"context": strings(context), "question": np.array(question, object)},
                "serving input `question` must be a vector",
                python=False,
            ),
        ]

    def contract_data(self, folder) -> dict[str, DataCase]:
        empty = Path(folder) / "empty.jsonl"
        empty.write_text("")
        return {
            "empty_file": DataCase([f"data.source=jsonl:{empty}"], str(empty)),
            "empty_valid": DataCase(["data.valid_fraction=0.0"]),
        }


TASK = ExtractiveTask()
