"""The extractive question-answering task: what it supplies to the pipeline core.

Passages, questions and answer spans (`pipelines.extractive.data`: country
facts from `pipelines.extractive.countries`, or the user's JSON Lines), a word
vocabulary with hashed buckets learned from the training split, BiDAF with a
span pointer (`pipelines.extractive.model.SpanQA`), SQuAD exact match and
F1 by phrasing and by fact (`pipelines.extractive.evaluate`), and a
`SpanAnswerer` export that takes a passage and a question as strings.
"""

from __future__ import annotations

import numpy as np

from pipelines.core.task import Task, forward, saved_or_learned, served_evaluation
from pipelines.extractive import config as span_config
from pipelines.extractive.client import ExtractiveClient, split_input
from pipelines.extractive.contract import ExtractiveContract

TOKENIZER, ANSWERS_TSV = "tokenizer.json", "answers.tsv"


class ExtractiveTask(Task):
    client = ExtractiveClient()
    contract = ExtractiveContract()
    name = "extractive"
    description = (
        "extractive question answering: BiDAF span pointer, passage and question in"
    )
    default_preset = "countries-quick"
    run_files = (TOKENIZER, ANSWERS_TSV, "span.png")
    learned_files = (TOKENIZER,)
    evaluate_files = (ANSWERS_TSV, "plots/span_0.png")

    def presets(self):
        return span_config.PRESETS

    # -- data ---------------------------------------------------------------
    load_data = forward("pipelines.extractive.data", "load_data")

    def preprocessors(self, run, data, config, create):
        from pipelines.extractive.data import Preprocessors
        from pipelines.extractive.tokenizer import SpanTokenizer

        def learn(data):
            texts = sorted({t for e in data.train for t in (e.context, e.question)})
            t = config.tokenizer
            return Preprocessors(
                SpanTokenizer.learn(texts, t.vocab_size, t.oov_buckets)
            )

        return saved_or_learned(
            self.name, run, data, create, (TOKENIZER,),
            lambda path: Preprocessors(SpanTokenizer.load(path)), learn,
            lambda preprocessors, path: preprocessors.tokenizer.save(path),
        )  # fmt: skip

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

    make_dataset = forward("pipelines.extractive.data", "make_dataset")

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

    evaluate = served_evaluation("pipelines.extractive.evaluate", heatmaps=3)

    plot_attention = forward("pipelines.extractive.evaluate", "plot_attention")

    # -- serving ------------------------------------------------------------
    def serving_module(self, model, preprocessors, config):
        from pipelines.extractive.serving import SpanAnswerer

        samples = [split_input(text) for text in self.samples(config)]
        return SpanAnswerer(model, preprocessors, config, samples)

    samples = forward("pipelines.extractive.data", "samples_for")


TASK = ExtractiveTask()
