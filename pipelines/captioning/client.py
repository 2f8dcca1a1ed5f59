"""The captioning task's command-line side: its options, and how ``predict``
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
)
from pipelines.core.errors import PipelineError


class CaptioningClient(Client):
    predict_aliases = ("caption",)

    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_beam_widths(parser)
        parser.add_argument("--plots", type=int, default=3, help="attention plots")
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
        return (
            f"BLEU-4 {best['bleu']:.2f}, exact match {best['exact_match']:.2%}"
            f"{where} on the {metrics['split']} split"
            + in_brief(metrics, [("BLEU-4", "bleu", ".2f"),
                                 ("exact match", "exact_match", ".2%")])
        )  # fmt: skip

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_search_arguments(parser)
        parser.add_argument("--plot", help="write the first image's attention here")

    def predict(self, export_dir, inputs, args) -> None:
        from pipelines.core.files import read_file
        from pipelines.core.serving import call_export

        images = []
        for path in inputs:
            try:
                images.append(read_file(path, "an image file (PNG or JPEG)"))
            except OSError as error:
                raise PipelineError(f"predict: cannot read {path}: {error}") from None
        options = search_feed(args)
        feed = {"image": np.array(images, dtype=object), **options}
        out = call_export(export_dir, feed, options_signature(options))
        for path, caption, score in zip(
            inputs, out["caption"], out["score"], strict=True
        ):
            print(f"{path}\n  -> {caption.decode('utf-8')}   (score {score:.3f})")
        if getattr(args, "plot", None):
            import tensorflow as tf

            from pipelines.core.plots import image_attention

            pixels = tf.io.decode_image(images[0], expand_animations=False).numpy()
            path = image_attention(
                pixels / 255.0, out["words"][0], out["attention"][0], args.plot,
                title=f"{Path(inputs[0]).name} -> {out['caption'][0].decode('utf-8')}",
            )  # fmt: skip
            print(f"Attention over the image: {path}")

    def demo_arguments(self, run_dir) -> list[str]:
        return ["--plot", str(Path(run_dir) / "attention.png")]

    def demo_notes(self, run_dir) -> list[str]:
        return [f"attention plot {Path(run_dir) / 'attention.png'}"]

    def demo_examples(self, run_dir, count) -> list[Example]:
        rows = read_tsv(Path(run_dir) / "captions.tsv", count)
        return [
            Example(
                f"image {r['image']}",
                r["references"],
                decoded_column(r, ("image", "references")),
            )
            for r in rows
        ]
