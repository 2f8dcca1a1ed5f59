"""The translation task's command line: ``evaluate`` scores the beam widths
asked for and draws alignment plots; ``predict`` (or ``translate``) prints each
translation with its score, says where the export read only the start of a
long sentence, and can draw the first sentence's alignment."""

from __future__ import annotations

import argparse

from pipelines.core.client import Example, SearchClient, decoded_column, shorten


class TranslationClient(SearchClient):
    predict_aliases = ("translate",)
    demo_plot, demo_plot_name = "alignment.png", "heatmap"
    predictions_file = "translations.tsv"

    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_evaluate_arguments(parser)
        self.add_plot_count(parser, "alignment plots")

    def evaluation_summary(self, metrics: dict) -> str:
        best = max(metrics["decoding"].values(), key=lambda s: s["bleu"])
        return self.summary_line(
            metrics,
            f"BLEU {best['bleu']:.2f}, exact match {best['exact_match']:.2%}",
            [("BLEU", "bleu", ".2f"), ("exact match", "exact_match", ".2%")],
        )

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_predict_arguments(parser)
        parser.add_argument("--plot", help="write the first sentence's alignment here")

    def predict(self, export_dir, inputs, args) -> None:
        import tensorflow_text  # noqa: F401  registers the tokenizer ops

        out = self.search(export_dir, "source", inputs, args)
        for text, translation, score, note in zip(
            inputs, out["translation"], out["score"],
            self.truncation_notes(out, b"[PAD]", "tokens"), strict=True,
        ):  # fmt: skip
            self.print_answer(text, translation, f"score {score:.3f}{note}")
        if args.plot:
            first = out["translation"][0].decode("utf-8")
            self.plot_alignment(
                out, "target_tokens", "alignment", args.plot, "Alignment heatmap",
                title=f"{inputs[0][:60]!r} -> {first[:60]!r}",
            )  # fmt: skip

    def demo_example(self, row) -> Example:
        decoded = decoded_column(row, ("source", "reference"))
        return Example(
            shorten(row["source"]), shorten(row["reference"]), shorten(decoded)
        )

    def demo_facts(self, config) -> list[str]:
        if config.data.source.split(":", 1)[0] != "dates":
            return []
        from pipelines.translation.dates import FIRST_DATE, LAST_DATE

        return [
            f"trained on dates from {FIRST_DATE.year} to {LAST_DATE.year}: a year "
            "outside that range comes out wrong"
        ]
