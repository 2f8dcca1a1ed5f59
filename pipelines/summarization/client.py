"""The summarization task's command line: ``evaluate`` scores one decoding,
on the run's split or another corpus; ``predict`` (or ``summarize``) prints
each summary with its score and mean copy probability (p_gen), and can draw
the first text's attention with p_gen beside it."""

from __future__ import annotations

import argparse

import numpy as np

from pipelines.core.client import Example, SearchClient, shorten


class SummarizationClient(SearchClient):
    predict_aliases = ("summarize",)
    demo_plot, demo_plot_name = "attention.png", "heatmap"
    predictions_file = "summaries.tsv"

    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--beam-width", type=int, help="beams (1 = greedy; default: decode.*)"
        )
        parser.add_argument(
            "--min-length", type=int, help="fewest summary tokens before [END]"
        )
        self.add_plot_count(parser, "attention plots")
        parser.add_argument(
            "--corpus",
            help="score every pair of another corpus instead (a data.source "
            "spec, e.g. aclsum: an out-of-domain test); --limit applies",
        )

    def evaluation_summary(self, metrics: dict) -> str:
        return self.summary_line(
            metrics,
            f"ROUGE-1/2/L {metrics['rouge1']:.1f}/{metrics['rouge2']:.1f}/"
            f"{metrics['rougeL']:.1f}, OOV copied {metrics['oov_copied']:.0%}",
            [("ROUGE-1", "rouge1", ".1f"), ("ROUGE-2", "rouge2", ".1f"),
             ("ROUGE-L", "rougeL", ".1f")],
        )  # fmt: skip

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_predict_arguments(parser)
        parser.add_argument("--min-length", type=int, help="fewest summary tokens")
        parser.add_argument("--plot", help="write the first text's attention here")

    def predict(self, export_dir, inputs, args) -> None:
        import tensorflow_text  # noqa: F401  registers the tokenizer ops

        least = args.min_length
        options = {} if least is None else {"min_length": np.int32(least)}
        out = self.search(export_dir, "text", inputs, args, options)
        for text, summary, score, p_gen, length, note in zip(
            inputs, out["summary"], out["score"], out["p_gen"], out["length"],
            self.truncation_notes(out, b"", "words"), strict=True,
        ):  # fmt: skip
            mean = float(p_gen.sum() / length) if length else 0.0
            self.print_answer(
                text, summary, f"score {score:.3f}, mean p_gen {mean:.2f}{note}"
            )
        if args.plot:
            first = out["summary"][0].decode("utf-8")
            self.plot_alignment(
                out, "summary_tokens", "attention", args.plot,
                "Attention heatmap with p_gen",
                title=f"{inputs[0][:50]!r}... -> {first[:60]!r}",
                p_gen=out["p_gen"][0],
            )  # fmt: skip

    def demo_example(self, row) -> Example:
        return Example(
            shorten(row["document"]), shorten(row["reference"]), shorten(row["summary"])
        )
