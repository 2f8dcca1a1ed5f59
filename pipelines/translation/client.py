"""The translation task's command-line side: its options, and how ``predict``
prints the export's answers."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipelines.core.baselines import in_brief
from pipelines.core.client import (
    Client,
    Example,
    add_beam_widths,
    add_search_arguments,
    decoded_column,
    options_signature,
    read_tsv,
    search_feed,
    shorten,
)


class TranslationClient(Client):
    predict_aliases = ("translate",)

    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_beam_widths(parser)
        parser.add_argument("--heatmaps", type=int, default=3, help="alignment plots")

    def evaluation_summary(self, metrics: dict) -> str:
        best = max(metrics["decoding"].values(), key=lambda s: s["bleu"])
        return (
            f"BLEU {best['bleu']:.2f}, exact match {best['exact_match']:.2%} on the "
            f"{metrics['split']} split"
            + in_brief(metrics, [("BLEU", "bleu", ".2f"),
                                 ("exact match", "exact_match", ".2%")])
        )  # fmt: skip

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_search_arguments(parser)
        parser.add_argument("--plot", help="write the first sentence's alignment here")

    def predict(self, export_dir, inputs, args) -> None:
        import tensorflow_text  # noqa: F401  registers the tokenizer ops

        from pipelines.core.serving import call_export

        options = search_feed(args)
        feed = {"source": np.array(inputs, dtype=object), **options}
        out = call_export(export_dir, feed, options_signature(options))
        cut = out.get("truncated", np.zeros(len(inputs), bool))
        for text, translation, score, truncated, read in zip(
            inputs, out["translation"], out["score"], cut,
            (out["source_tokens"] != b"[PAD]").sum(1), strict=True,
        ):  # fmt: skip
            note = f"; read the first {read} tokens only" if truncated else ""
            print(
                f"{text}\n  -> {translation.decode('utf-8')}   "
                f"(score {score:.3f}{note})"
            )
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

    def demo_examples(self, run_dir, count) -> list[Example]:
        rows = read_tsv(Path(run_dir) / "translations.tsv", count)
        return [
            Example(shorten(r["source"]), shorten(r["reference"]), shorten(
                decoded_column(r, ("source", "reference"))))
            for r in rows
        ]  # fmt: skip

    def demo_facts(self, config) -> list[str]:
        if config.data.source.split(":", 1)[0] != "dates":
            return []
        from pipelines.translation.dates import FIRST_DATE, LAST_DATE

        return [
            f"trained on dates from {FIRST_DATE.year} to {LAST_DATE.year}: a year "
            "outside that range comes out wrong"
        ]
