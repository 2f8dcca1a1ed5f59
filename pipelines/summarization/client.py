"""The summarization task's command-line side: its options, and how ``predict``
prints the export's answers."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipelines.core.baselines import in_brief
from pipelines.core.client import (
    Client,
    Example,
    add_search_arguments,
    options_signature,
    read_tsv,
    search_feed,
    shorten,
)


class SummarizationClient(Client):
    predict_aliases = ("summarize",)

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
            help="score every pair of another corpus instead (a data.source "
            "spec, e.g. aclsum: an out-of-domain test); --limit applies",
        )

    def evaluation_summary(self, metrics: dict) -> str:
        return (
            f"ROUGE-1/2/L {metrics['rouge1']:.1f}/{metrics['rouge2']:.1f}/"
            f"{metrics['rougeL']:.1f}, OOV copied {metrics['oov_copied']:.0%} on "
            f"the {metrics['split']} split"
            + in_brief(metrics, [("ROUGE-1", "rouge1", ".1f"),
                                 ("ROUGE-2", "rouge2", ".1f"),
                                 ("ROUGE-L", "rougeL", ".1f")])
        )  # fmt: skip

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_search_arguments(parser)
        parser.add_argument("--min-length", type=int, help="fewest summary tokens")
        parser.add_argument("--plot", help="write the first text's attention here")

    def predict(self, export_dir, inputs, args) -> None:
        import tensorflow_text  # noqa: F401  registers the tokenizer ops

        from pipelines.core.serving import call_export

        options = search_feed(args)
        if args.min_length is not None:
            options["min_length"] = np.int32(args.min_length)
        feed = {"text": np.array(inputs, dtype=object), **options}
        out = call_export(export_dir, feed, options_signature(options))
        cut = out.get("truncated", np.zeros(len(inputs), bool))
        for text, summary, score, p_gen, length, truncated, read in zip(
            inputs, out["summary"], out["score"], out["p_gen"], out["length"],
            cut, (out["source_tokens"] != b"").sum(1), strict=True,
        ):  # fmt: skip
            mean = float(p_gen.sum() / length) if length else 0.0
            note = f"; read the first {read} words only" if truncated else ""
            print(
                f"{text}\n  -> {summary.decode('utf-8')}   (score {score:.3f}, "
                f"mean p_gen {mean:.2f}{note})"
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

    def demo_examples(self, run_dir, count) -> list[Example]:
        rows = read_tsv(Path(run_dir) / "summaries.tsv", count)
        return [
            Example(shorten(r["document"]), shorten(r["reference"]),
                    shorten(r["summary"]))
            for r in rows
        ]  # fmt: skip
