"""The translation task: what it supplies to the pipeline core.

Sentence pairs (`pipelines.translation.data`), two tokenizers learned from
the training split (characters or WordPiece, run inside the graph), an
encoder-decoder with attention or a Transformer (`pipelines.translation.model`),
BLEU / chrF / exact match with sacrebleu, and a `Translator` export that
takes raw strings and returns translations, scores and alignments.
"""

from __future__ import annotations

from typing import NamedTuple

from pipelines.core.task import Data, Task, saved_or_learned
from pipelines.translation import config as translation_config
from pipelines.translation.client import TranslationClient
from pipelines.translation.contract import TranslationContract

SOURCE_TOKENIZER = "source_tokenizer.json"
TARGET_TOKENIZER = "target_tokenizer.json"


class Tokenizers(NamedTuple):
    source: object
    target: object


class TranslationTask(Task):
    client = TranslationClient()
    contract = TranslationContract()
    name = "translation"
    description = "machine translation: RNN with attention or Transformer"
    default_preset = "dates"
    run_files = (
        SOURCE_TOKENIZER,
        TARGET_TOKENIZER,
        "translations.tsv",
        "alignment.png",
    )
    learned_files = (SOURCE_TOKENIZER, TARGET_TOKENIZER)
    evaluate_files = ("translations.tsv", "plots/alignment_0.png")

    def presets(self):
        return translation_config.PRESETS

    # -- data ---------------------------------------------------------------
    def load_data(self, config) -> Data:
        from pipelines.translation.data import load_data

        return load_data(config)

    def preprocessors(self, run, data, config, create) -> Tokenizers:
        from pipelines.core.text import learn_tokenizer, load_tokenizer

        tok = config.tokenizer

        def learn(data):
            texts = ([p[side] for p in data.train] for side in (0, 1))
            return Tokenizers(
                *(learn_tokenizer(tok.kind, t, tok.vocab_size) for t in texts)
            )

        return saved_or_learned(
            self.name, run, data, create, (SOURCE_TOKENIZER, TARGET_TOKENIZER),
            lambda *paths: Tokenizers(*map(load_tokenizer, paths)),
            learn,
            lambda tokenizers, *paths: [
                t.save(p) for t, p in zip(tokenizers, paths, strict=True)
            ],
        )  # fmt: skip

    def summary(self, data, preprocessors, config) -> str:
        from pipelines.core.text import token_lengths
        from pipelines.data import Splits, summarize

        tok = config.tokenizer
        splits = Splits(data.train, data.valid, data.test)
        lines = [summarize(splits, unit=tok.kind)] + data.notes
        lines.append(
            f"vocabularies ({tok.kind}): source {preprocessors.source.vocab_size}, "
            f"target {preprocessors.target.vocab_size}"
        )
        for side, limit, name in (
            (0, tok.max_source_tokens, "sources"),
            (1, tok.max_target_tokens, "targets"),
        ):
            lengths = token_lengths(
                getattr(preprocessors, ("source", "target")[side]),
                [p[side] for p in data.train + data.valid + data.test],
            )
            cut = int((lengths > limit).sum())
            lines.append(
                f"cut {cut} {name} longer than {limit} tokens "
                f"(tokenizer.max_{name[:-1]}_tokens)"
            )
        return "\n".join(lines)

    def make_dataset(self, examples, preprocessors, config, training, replicas=1):
        from pipelines.translation.data import make_dataset

        return make_dataset(examples, preprocessors, config, training, replicas)

    # -- model --------------------------------------------------------------
    def build_model(self, config, preprocessors):
        from pipelines.translation.model import build_model

        return build_model(
            config.model,
            preprocessors.source.vocab_size,
            preprocessors.target.vocab_size,
            config.tokenizer.max_target_tokens + 1,
        )

    def compile_arguments(self, config) -> dict:
        from pipelines.core.metrics import teacher_forcing_arguments

        return teacher_forcing_arguments()

    # -- evaluation ---------------------------------------------------------

    def evaluate(self, run, model, preprocessors, config, examples, args) -> dict:
        from pipelines.translation.evaluate import evaluate

        translator = self.serving_module(model, preprocessors, config)
        widths = tuple(args.beam_width) if getattr(args, "beam_width", None) else None
        return evaluate(
            run.root, translator, config, examples, args.split, widths,
            getattr(args, "heatmaps", 3),
        )  # fmt: skip

    def plot_attention(self, module, config, examples, folder):
        from pipelines.translation.evaluate import plot_samples

        return plot_samples(module, [source for source, _ in examples], folder)

    # -- serving ------------------------------------------------------------
    def serving_module(self, model, preprocessors, config):
        from pipelines.translation.serving import Translator

        return Translator(model, preprocessors.source, preprocessors.target, config)

    def samples(self, config) -> list[str]:
        from pipelines.translation.serving import samples_for

        return samples_for(config)


TASK = TranslationTask()
