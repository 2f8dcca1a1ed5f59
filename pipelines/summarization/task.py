"""The summarization task: what it supplies to the pipeline core.

(document, summary) pairs (`pipelines.summarization.data`), one word
vocabulary learned from the training split (`WordTokenizer`, in the graph),
the pointer-generator network in three variants (baseline, pointer, pointer +
coverage with a final coverage phase; `PointerSeq2Seq`), ROUGE with the
repetition, novelty and copy rates (`pipelines.summarization.evaluate`), and a
`Summarizer` export that takes raw strings and returns summaries, scores,
attention and ``p_gen``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipelines.core.run_dir import PipelineError
from pipelines.core.task import BadRequest, Data, DataCase, Task
from pipelines.summarization import config as summarization_config

TOKENIZER = "tokenizer.json"


class SummarizationTask(Task):
    name = "summarization"
    description = "summarization: pointer-generator with coverage, strings in"
    default_preset = "debian"
    run_files = (TOKENIZER, "summaries.tsv", "attention.png")
    evaluate_files = ("summaries.tsv", "plots/attention_0.png")
    predict_aliases = ("summarize",)

    def presets(self):
        return summarization_config.PRESETS

    # -- data ---------------------------------------------------------------
    def load_data(self, config) -> Data:
        from pipelines.summarization.data import load_data

        return load_data(config)

    def preprocessors(self, run, data, config, create):
        from pipelines.core.text import WordTokenizer, load_tokenizer

        path = None if run is None else run / TOKENIZER
        if path is not None and path.exists():
            return load_tokenizer(path)
        if data is None and run is None:
            raise ValueError("preprocessors: give a run folder or data to learn from.")
        if data is None:
            raise PipelineError(
                f"{run.root} has no {TOKENIZER}: train a model there first "
                "(`attention-pipelines summarization train`)."
            )
        texts = [text for pair in data.train for text in pair]
        tokenizer = WordTokenizer.learn(texts, config.tokenizer.vocab_size)
        if create and path is not None:
            tokenizer.save(path)
        return tokenizer

    def summary(self, data, preprocessors, config) -> str:
        from pipelines.core.text import token_lengths
        from pipelines.data import Splits, summarize
        from pipelines.data.debian import absent_share

        tok = config.tokenizer
        lines = [summarize(Splits(data.train, data.valid, data.test))] + data.notes
        lines.append(
            f"vocabulary (words, both sides): {preprocessors.vocab_size}; "
            f"{absent_share(data.train):.1%} of training summary words are not "
            "in their document"
        )
        for side, limit, name in (
            (0, tok.max_source_tokens, "documents"),
            (1, tok.max_target_tokens, "summaries"),
        ):
            texts = [p[side] for p in data.train + data.valid + data.test]
            lengths = token_lengths(preprocessors, texts)
            cut = int((lengths > limit).sum())
            lines.append(
                f"cut {cut} {name} longer than {limit} tokens "
                f"(tokenizer.max_{'source' if side == 0 else 'target'}_tokens)"
            )
        return "\n".join(lines)

    def make_dataset(self, examples, preprocessors, config, training, replicas=1):
        from pipelines.summarization.data import make_dataset

        return make_dataset(examples, preprocessors, config, training, replicas)

    # -- model --------------------------------------------------------------
    def build_model(self, config, preprocessors):
        m = config.model
        pointer = m.variant != "baseline"
        if m.architecture == "transformer":
            from pipelines.summarization.transformer import TransformerPointer

            return TransformerPointer(
                preprocessors.vocab_size,
                m.embedding_dim,
                m.num_layers,
                m.num_heads,
                m.intermediate_dim,
                config.tokenizer.max_target_tokens + 1,
                pointer=pointer,
                dropout=m.dropout,
            )
        from pipelines.summarization.model import PointerSeq2Seq

        return PointerSeq2Seq(
            preprocessors.vocab_size,
            m.embedding_dim,
            m.units,
            m.attention_units,
            pointer=pointer,
            coverage=m.variant == "coverage",
            dropout=m.dropout,
        )

    def compile_arguments(self, config) -> dict:
        from pipelines.core.metrics import sequence_arguments

        return sequence_arguments()

    def phases(self, config) -> tuple[int, ...]:
        """The coverage variant's last ``coverage.epochs`` epochs are a phase."""
        epochs, final = config.train.epochs, config.coverage.epochs
        if config.model.variant != "coverage" or not 0 < final < epochs:
            return ()
        return (epochs - final,)

    def start_phase(self, model, config, phase) -> None:
        if config.model.variant != "coverage":
            return
        on = phase > 0 or config.coverage.epochs >= config.train.epochs
        weight = config.coverage.weight if on and config.coverage.epochs else 0.0
        model.set_coverage_weight(weight)
        print(f"Coverage loss weight {weight:g}")

    # -- evaluation ---------------------------------------------------------
    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--beam-width", type=int, help="beams (1 = greedy; default: decode.*)"
        )
        parser.add_argument(
            "--min-length", type=int, help="fewest summary tokens before [END]"
        )
        parser.add_argument("--heatmaps", type=int, default=3, help="attention plots")
        parser.add_argument(
            "--corpus",
            help="score every pair of another corpus instead (a data.corpus "
            "spec, e.g. aclsum: an out-of-domain test); --limit applies",
        )

    def evaluate(self, run, model, preprocessors, config, examples, args) -> dict:
        from pipelines.summarization.evaluate import evaluate

        split = args.split
        if getattr(args, "corpus", None):
            from pipelines.summarization.data import read_corpus

            try:
                pairs, _ = read_corpus(args.corpus, config)
            except (OSError, ValueError) as error:
                raise PipelineError(f"evaluate --corpus: {error}") from None
            examples = [p for p in pairs if p[0].split() and p[1].split()]
            examples = examples[: args.limit] if args.limit else examples
            split = args.corpus
            if not examples:
                raise PipelineError(f"evaluate: {args.corpus} has no pairs.")
        summarizer = self.serving_module(model, preprocessors, config)
        return evaluate(
            run.root, summarizer, config, examples, split,
            getattr(args, "beam_width", None), getattr(args, "min_length", None),
            getattr(args, "heatmaps", 3),
        )  # fmt: skip

    def evaluation_summary(self, metrics: dict) -> str:
        return (
            f"ROUGE-1/2/L {metrics['rouge1']:.1f}/{metrics['rouge2']:.1f}/"
            f"{metrics['rougeL']:.1f}, OOV copied {metrics['oov_copied']:.0%} on "
            f"the {metrics['split']} split"
        )

    # -- serving ------------------------------------------------------------
    def serving_module(self, model, preprocessors, config):
        from pipelines.summarization.serving import Summarizer

        return Summarizer(model, preprocessors, config)

    def samples(self, config) -> list[str]:
        from pipelines.summarization.serving import samples_for

        return samples_for(config)

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--beam-width", type=int, help="1 = greedy")
        parser.add_argument("--length-penalty", type=float, help="GNMT alpha")
        parser.add_argument("--min-length", type=int, help="fewest summary tokens")
        parser.add_argument("--plot", help="write the first text's attention here")

    def predict(self, export_dir, inputs, args) -> None:
        import tensorflow_text  # noqa: F401  registers the tokenizer ops

        from pipelines.core.serving import call_export

        feed = {"text": np.array(inputs, dtype=object)}
        if args.beam_width is not None:
            feed["beam_width"] = np.int32(args.beam_width)
        if args.length_penalty is not None:
            feed["length_penalty"] = np.float32(args.length_penalty)
        if args.min_length is not None:
            feed["min_length"] = np.int32(args.min_length)
        out = call_export(export_dir, feed)
        for text, summary, score, p_gen, length in zip(
            inputs, out["summary"], out["score"], out["p_gen"], out["length"],
            strict=True,
        ):  # fmt: skip
            mean = float(p_gen.sum() / length) if length else 0.0
            print(
                f"{text}\n  -> {summary.decode('utf-8')}   (score {score:.3f}, "
                f"mean p_gen {mean:.2f})"
            )
        if args.plot:
            from pipelines.core.plots import alignment_heatmap

            first = out["summary"][0].decode("utf-8")
            path = alignment_heatmap(
                out["source_tokens"][0],
                out["summary_tokens"][0],
                out["attention"][0],
                args.plot,
                title=f"{inputs[0][:50]!r}... -> {first[:60]!r}",
                p_gen=out["p_gen"][0],
            )
            print(f"Attention heatmap with p_gen: {path}")

    def demo_arguments(self, run_dir) -> list[str]:
        return ["--plot", str(Path(run_dir) / "attention.png")]

    def demo_notes(self, run_dir) -> list[str]:
        return [f"heatmap {Path(run_dir) / 'attention.png'}"]

    # -- the pipeline contract ----------------------------------------------
    def contract_requests(self, config) -> list[dict]:
        texts = np.array(self.samples(config), dtype=object)
        greedy = {"beam_width": np.int32(1), "length_penalty": np.float32(0)}
        widest = {
            "beam_width": np.int32(config.decode.beam_width),
            "length_penalty": np.float32(1.0),
            "min_length": np.int32(config.tokenizer.max_target_tokens),
        }
        return [
            {"text": texts},
            {"text": texts, **greedy},
            {"text": texts[:1], **widest},
        ]

    def bad_requests(self, config) -> list[BadRequest]:
        text = np.array(self.samples(config)[:1], dtype=object)
        widest = config.decode.beam_width
        longest = config.tokenizer.max_target_tokens

        def empty_summary(out):
            assert out["summary"][0] == b"" and out["length"][0] == 0
            assert out["score"][0] == 0.0 and not out["attention"][0].any()
            assert not out["p_gen"][0].any()
            assert out["length"][1] > 0

        def empty_batch(out):
            assert out["summary"].shape == (0,), out["summary"].shape
            assert out["score"].shape == (0,) and out["p_gen"].shape[0] == 0

        def texts(*rows):
            return np.array(list(rows), dtype=object)

        def options(**values):
            return {"text": text, **values}

        penalty = "serving input `length_penalty`"
        beams = "serving input `beam_width`"
        shortest = "serving input `min_length`"
        vector = "serving input `text` must be a vector"
        return [
            BadRequest("nan", options(length_penalty=np.float32("nan")), penalty),
            BadRequest("inf", options(length_penalty=np.float32("inf")), penalty),
            BadRequest("negative", options(length_penalty=np.float32(-1)), penalty),
            BadRequest("beam 0", options(beam_width=np.int32(0)), beams),
            BadRequest("too wide", options(beam_width=np.int32(widest + 1)), beams),
            BadRequest("min length -1", options(min_length=np.int32(-1)), shortest),
            BadRequest(
                "min length too long",
                options(min_length=np.int32(longest + 1)),
                shortest,
            ),
            BadRequest(
                "beam vector",
                options(beam_width=np.array([1, 2], np.int32)),
                beams,
                python=False,
            ),
            BadRequest(
                "empty string", {"text": texts("", text[0])}, check=empty_summary
            ),
            BadRequest(
                "spaces", {"text": texts("  \t ", text[0])}, check=empty_summary
            ),
            BadRequest("empty batch", {"text": texts()}, check=empty_batch),
            BadRequest(
                "invalid utf-8",
                {"text": texts(b"ok", b"\xff\xfe")},
                "serving input `text` must be valid UTF-8",
            ),
            BadRequest(
                "rank 2", {"text": np.array([["a", "b"]], object)}, vector, python=False
            ),
            BadRequest("rank 0", {"text": np.array("a", object)}, vector, python=False),
        ]

    def contract_data(self, folder) -> dict[str, DataCase]:
        empty = Path(folder) / "empty.tsv"
        empty.write_text("")
        return {
            "empty_file": DataCase([f"data.corpus=tsv:{empty}"], str(empty)),
            "empty_valid": DataCase(["data.valid_fraction=0.0"]),
        }


TASK = SummarizationTask()
