"""The captioning task's command line: ``evaluate`` scores the beam widths
asked for, on the test scans or (``--robustness``) on layouts the generator
never makes; ``predict`` (or ``caption``) reads image files, prints each
caption with its score and can draw the first image's attention."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core.client import Example, SearchClient, decoded_column
from pipelines.core.errors import PipelineError


class CaptioningClient(SearchClient):
    predict_aliases = ("caption",)
    demo_plot, demo_plot_name = "attention.png", "attention plot"
    predictions_file = "captions.tsv"

    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_evaluate_arguments(parser)
        self.add_plot_count(parser, "attention plots", "--plots")
        parser.add_argument(
            "--robustness", action="store_true",
            help="also score the test scans laid out in ways the training "
            "generator never makes (other digit sizes, touching digits, other "
            "strip sizes, JPEG, low contrast), one row per layout",
        )  # fmt: skip

    def evaluation_summary(self, metrics: dict) -> str:
        best = max(metrics["decoding"].values(), key=lambda s: s["exact_match"])
        where = (
            f", localisation {best['localisation']:.2%} (attention peak centred "
            "in the word's box)"
            if "localisation" in best else ""
        )  # fmt: skip
        return self.summary_line(
            metrics,
            f"BLEU-4 {best['bleu']:.2f}, exact match {best['exact_match']:.2%}{where}",
            [("BLEU-4", "bleu", ".2f"), ("exact match", "exact_match", ".2%")],
        )

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_predict_arguments(parser)
        parser.add_argument("--plot", help="write the first image's attention here")

    def predict(self, export_dir, inputs, args) -> None:
        from pipelines.core.files import read_file

        images = []
        for path in inputs:
            try:
                images.append(read_file(path, "an image file (PNG or JPEG)"))
            except OSError as error:
                raise PipelineError(f"predict: cannot read {path}: {error}") from None
        out = self.search(export_dir, "image", images, args)
        for path, caption, score in zip(
            inputs, out["caption"], out["score"], strict=True
        ):
            self.print_answer(path, caption, f"score {score:.3f}")
        if getattr(args, "plot", None):
            import tensorflow as tf

            from pipelines.core.plots import image_attention

            pixels = tf.io.decode_image(images[0], expand_animations=False).numpy()
            path = image_attention(
                pixels / 255.0, out["words"][0], out["attention"][0], args.plot,
                title=f"{Path(inputs[0]).name} -> {out['caption'][0].decode('utf-8')}",
            )  # fmt: skip
            print(f"Attention over the image: {path}")

    def demo_example(self, row) -> Example:
        decoded = decoded_column(row, ("image", "references"))
        return Example(f"image {row['image']}", row["references"], decoded)
