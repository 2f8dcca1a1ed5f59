"""The translation task: what it supplies to the pipeline core.

Sentence pairs (`pipelines.translation.data`), two tokenizers learned from
the training split (characters or WordPiece, run inside the graph), an
encoder-decoder with attention or a Transformer (`pipelines.translation.model`),
BLEU / chrF / exact match with sacrebleu, and a `Translator` export that
takes raw strings and returns translations, scores and alignments.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pipelines.core.run_dir import PipelineError
from pipelines.core.task import BadRequest, Data, DataCase, Task
from pipelines.translation import config as translation_config

SOURCE_TOKENIZER = "source_tokenizer.json"
TARGET_TOKENIZER = "target_tokenizer.json"


class Tokenizers(NamedTuple):
    source: object
    target: object


class TranslationTask(Task):
    name = "translation"
    description = "machine translation: RNN with attention or Transformer"
    default_preset = "dates"
    run_files = (
        SOURCE_TOKENIZER,
        TARGET_TOKENIZER,
        "translations.tsv",
        "alignment.png",
    )
    evaluate_files = ("translations.tsv", "plots/alignment_0.png")
    predict_aliases = ("translate",)

    def presets(self):
        return translation_config.PRESETS

    # -- data ---------------------------------------------------------------
    def load_data(self, config) -> Data:
        from pipelines.translation.data import load_data

        return load_data(config)

    def preprocessors(self, run, data, config, create) -> Tokenizers:
        from pipelines.core.text import learn_tokenizer, load_tokenizer

        paths = (
            (None, None)
            if run is None
            else (run / SOURCE_TOKENIZER, run / TARGET_TOKENIZER)
        )
        if run is not None and all(p.exists() for p in paths):
            return Tokenizers(*(load_tokenizer(p) for p in paths))
        if data is None and run is None:
            raise ValueError("preprocessors: give a run folder or data to learn from.")
        if data is None:
            raise PipelineError(
                f"{run.root} has no {SOURCE_TOKENIZER}/{TARGET_TOKENIZER}: train a "
                "model there first (`attention-pipelines translation train`)."
            )
        tok = config.tokenizer
        learned = []
        for side, path in enumerate(paths):
            texts = [pair[side] for pair in data.train]
            tokenizer = learn_tokenizer(tok.kind, texts, tok.vocab_size)
            if create and path is not None:
                tokenizer.save(path)
            learned.append(tokenizer)
        return Tokenizers(*learned)

    def summary(self, data, preprocessors, config) -> str:
        from pipelines.core.text import token_lengths
        from pipelines.data import Splits, summarize

        tok = config.tokenizer
        lines = [summarize(Splits(data.train, data.valid, data.test))] + data.notes
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
    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--beam-width",
            type=int,
            action="append",
            help="decode with this many beams (repeatable; 1 = greedy; default: "
            "greedy and decode.default_beam_width)",
        )
        parser.add_argument("--heatmaps", type=int, default=3, help="alignment plots")

    def evaluate(self, run, model, preprocessors, config, examples, args) -> dict:
        from pipelines.translation.evaluate import evaluate

        translator = self.serving_module(model, preprocessors, config)
        widths = tuple(args.beam_width) if getattr(args, "beam_width", None) else None
        return evaluate(
            run.root, translator, config, examples, args.split, widths,
            getattr(args, "heatmaps", 3),
        )  # fmt: skip

    def evaluation_summary(self, metrics: dict) -> str:
        best = max(metrics["decoding"].values(), key=lambda s: s["bleu"])
        return (
            f"BLEU {best['bleu']:.2f}, exact match {best['exact_match']:.2%} on the "
            f"{metrics['split']} split"
        )

    # -- serving ------------------------------------------------------------
    def serving_module(self, model, preprocessors, config):
        from pipelines.translation.serving import Translator

        return Translator(model, preprocessors.source, preprocessors.target, config)

    def samples(self, config) -> list[str]:
        from pipelines.translation.serving import samples_for

        return samples_for(config)

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--beam-width", type=int, help="1 = greedy")
        parser.add_argument("--length-penalty", type=float, help="GNMT alpha")
        parser.add_argument("--plot", help="write the first sentence's alignment here")

    def predict(self, export_dir, inputs, args) -> None:
        import tensorflow_text  # noqa: F401  registers the tokenizer ops

        from pipelines.core.serving import call_export

        feed = {"source": np.array(inputs, dtype=object)}
        if args.beam_width is not None:
            feed["beam_width"] = np.int32(args.beam_width)
        if args.length_penalty is not None:
            feed["length_penalty"] = np.float32(args.length_penalty)
        out = call_export(export_dir, feed)
        for text, translation, score in zip(
            inputs, out["translation"], out["score"], strict=True
        ):
            print(f"{text}\n  -> {translation.decode('utf-8')}   (score {score:.3f})")
        if args.plot:
            from pipelines.core.plots import alignment_heatmap

            first = out["translation"][0].decode("utf-8")
            path = alignment_heatmap(
                out["source_tokens"][0],
                out["target_tokens"][0],
                out["alignment"][0],
                args.plot,
                title=f"{inputs[0][:60]!r} -> {first[:60]!r}",
            )
            print(f"Alignment heatmap: {path}")

    def demo_arguments(self, run_dir) -> list[str]:
        return ["--plot", str(Path(run_dir) / "alignment.png")]

    def demo_notes(self, run_dir) -> list[str]:
        return [f"heatmap {Path(run_dir) / 'alignment.png'}"]

    # -- the pipeline contract ----------------------------------------------
    def contract_requests(self, config) -> list[dict]:
        texts = np.array(self.samples(config), dtype=object)
        widest = config.decode.beam_width
        greedy = {"beam_width": np.int32(1), "length_penalty": np.float32(0)}
        widest = {"beam_width": np.int32(widest), "length_penalty": np.float32(0.5)}
        return [
            {"source": texts},
            {"source": texts, **greedy},
            {"source": texts[:1], **widest},
        ]

    def bad_requests(self, config) -> list[BadRequest]:
        text = np.array(self.samples(config)[:1], dtype=object)
        widest = config.decode.beam_width

        def empty_translation(out):
            assert out["translation"][0] == b"" and out["length"][0] == 0
            assert out["score"][0] == 0.0 and not out["alignment"][0].any()
            assert out["length"][1] > 0

        def empty_batch(out):
            assert out["translation"].shape == (0,), out["translation"].shape
            assert out["score"].shape == (0,)

        penalty = "serving input `length_penalty`"
        beams = "serving input `beam_width`"
        vector = "serving input `source` must be a vector"

        def source(*rows):
            return np.array(list(rows), dtype=object)

        def options(**values):
            return {"source": text, **values}

        return [
            BadRequest("nan", options(length_penalty=np.float32("nan")), penalty),
            BadRequest("inf", options(length_penalty=np.float32("inf")), penalty),
            BadRequest("negative", options(length_penalty=np.float32(-1)), penalty),
            BadRequest("beam 0", options(beam_width=np.int32(0)), beams),
            BadRequest("too wide", options(beam_width=np.int32(widest + 1)), beams),
            BadRequest(
                "beam vector",
                options(beam_width=np.array([1, 2], np.int32)),
                beams,
                python=False,
            ),
            BadRequest(
                "empty string", {"source": source("", text[0])}, check=empty_translation
            ),
            BadRequest("empty batch", {"source": source()}, check=empty_batch),
            BadRequest(
                "invalid utf-8",
                {"source": source(b"ok", b"\xff\xfe")},
                "serving input `source` must be valid UTF-8",
            ),
            BadRequest(
                "rank 2",
                {"source": np.array([["a", "b"]], object)},
                vector,
                python=False,
            ),
            BadRequest(
                "rank 0", {"source": np.array("a", object)}, vector, python=False
            ),
        ]

    def contract_data(self, folder) -> dict[str, DataCase]:
        empty = Path(folder) / "empty.tsv"
        empty.write_text("")
        return {
            "empty_file": DataCase([f"data.corpus=tsv:{empty}"], str(empty)),
            "empty_valid": DataCase(["data.valid_fraction=0.0"]),
        }


TASK = TranslationTask()
