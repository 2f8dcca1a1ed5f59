"""The image-captioning task: what it supplies to the pipeline core.

Captioned images (`pipelines.captioning.data`: digit strips generated from
scikit-learn's scans, or the user's folder), a word vocabulary learned from
the training captions, a CNN encoder with an attention RNN decoder
(`pipelines.captioning.model`, Show, Attend and Tell), BLEU-4, exact match
and attention localisation (`pipelines.captioning.evaluate`), and a
`CaptionServer` export that takes PNG or JPEG bytes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipelines.captioning import config as captioning_config
from pipelines.core.run_dir import PipelineError
from pipelines.core.task import BadRequest, Data, DataCase, Task

TOKENIZER = "tokenizer.json"
SAMPLE_COUNT = 3


class CaptioningTask(Task):
    name = "captioning"
    description = "image captioning: CNN encoder, attention decoder, image bytes in"
    default_preset = "digits"
    run_files = (TOKENIZER, "captions.tsv", "attention.png")
    evaluate_files = ("captions.tsv", "plots/attention_0.png")
    predict_aliases = ("caption",)

    def presets(self):
        return captioning_config.PRESETS

    # -- data ---------------------------------------------------------------
    def load_data(self, config) -> Data:
        from pipelines.captioning.data import load_data

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
                "(`attention-pipelines captioning train`)."
            )
        captions = [c for e in data.train for c in e.captions]
        tokenizer = WordTokenizer.learn(captions, config.tokenizer.vocab_size)
        if create and path is not None:
            tokenizer.save(path)
        return tokenizer

    def summary(self, data, preprocessors, config) -> str:
        lines = [
            f"{name}: {len(data.split(name))} images, "
            f"{sum(len(e.captions) for e in data.split(name))} captions"
            for name in ("train", "valid", "test")
        ]
        lines += data.notes
        lines.append(f"vocabulary: {preprocessors.vocab_size} words")
        return "\n".join(lines)

    def make_dataset(self, examples, preprocessors, config, training, replicas=1):
        from pipelines.captioning.data import make_dataset

        return make_dataset(examples, preprocessors, config, training, replicas)

    # -- model --------------------------------------------------------------
    def build_model(self, config, preprocessors):
        from pipelines.captioning.model import Captioner

        return Captioner(config.model, config.image, preprocessors.vocab_size,
                         max_length=config.tokenizer.max_words + 1,
                         hard_inference=config.decode.hard_attention)  # fmt: skip

    def compile_arguments(self, config) -> dict:
        # Captions of 1 to 5 words: a token mean would weigh a replica's
        # share of a batch by its words (see `SequenceNLL`).
        from pipelines.core.metrics import sequence_arguments

        arguments = sequence_arguments()
        if config.model.attention == "hard":
            arguments["loss"] = None  # the model's ReinforceLoss adds it
        return arguments

    # -- evaluation ---------------------------------------------------------
    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--beam-width",
            type=int,
            action="append",
            help="decode with this many beams (repeatable; 1 = greedy; default: "
            "greedy and decode.default_beam_width)",
        )
        parser.add_argument("--plots", type=int, default=3, help="attention plots")

    def evaluate(self, run, model, preprocessors, config, examples, args) -> dict:
        from pipelines.captioning.evaluate import evaluate

        server = self.serving_module(model, preprocessors, config)
        widths = tuple(args.beam_width) if getattr(args, "beam_width", None) else None
        return evaluate(run.root, server, config, examples, args.split, widths,
                        getattr(args, "plots", 3))  # fmt: skip

    def evaluation_summary(self, metrics: dict) -> str:
        best = max(metrics["decoding"].values(), key=lambda s: s["exact_match"])
        where = (
            f", attention on the right digit {best['localisation']:.2%}"
            if "localisation" in best else ""
        )  # fmt: skip
        return (
            f"BLEU-4 {best['bleu']:.2f}, exact match {best['exact_match']:.2%}"
            f"{where} on the {metrics['split']} split"
        )

    # -- serving ------------------------------------------------------------
    def serving_module(self, model, preprocessors, config):
        from pipelines.captioning.serving import CaptionServer

        return CaptionServer(model, preprocessors, config)

    def samples(self, config) -> list[str]:
        """Paths of images for ``demo``: the first test strips (`sample_strips`)
        or a user folder's first images."""
        kind, _, argument = config.data.source.partition(":")
        if kind == "folder":
            from pipelines.captioning.data import read_folder

            examples = read_folder(argument)[:SAMPLE_COUNT]
            return [str(Path(argument) / e.name) for e in examples]
        return [str(p) for p in sample_strips(config)]

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--beam-width", type=int, help="1 = greedy")
        parser.add_argument("--length-penalty", type=float, help="GNMT alpha")
        parser.add_argument("--plot", help="write the first image's attention here")

    def predict(self, export_dir, inputs, args) -> None:
        from pipelines.core.serving import call_export

        images = []
        for path in inputs:
            try:
                images.append(Path(path).read_bytes())
            except OSError as error:
                raise PipelineError(f"predict: cannot read {path}: {error}") from None
        feed = {"image": np.array(images, dtype=object)}
        if args.beam_width is not None:
            feed["beam_width"] = np.int32(args.beam_width)
        if args.length_penalty is not None:
            feed["length_penalty"] = np.float32(args.length_penalty)
        out = call_export(export_dir, feed)
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

    # -- the pipeline contract ----------------------------------------------
    def contract_requests(self, config) -> list[dict]:
        images = np.array([p.read_bytes() for p in sample_strips(config)], dtype=object)
        widest = config.decode.beam_width
        return [
            {"image": images},
            {"image": images, "beam_width": np.int32(1),
             "length_penalty": np.float32(0)},
            {"image": images[:1], "beam_width": np.int32(widest),
             "length_penalty": np.float32(0.5)},
        ]  # fmt: skip

    def bad_requests(self, config) -> list[BadRequest]:
        image = sample_strips(config)[0].read_bytes()
        widest = config.decode.beam_width
        rows = config.tokenizer.max_words + 1

        def files(*items):
            return np.array(list(items), dtype=object)

        def empty_batch(out):
            assert out["caption"].shape == (0,), out["caption"].shape
            assert out["attention"].shape[:2] == (0, rows), out["attention"].shape

        def jpeg_and_size(out):
            # The same strip as a JPEG twice its size is read like the PNG:
            # decoded, resized to the model's size, captioned.
            assert out["caption"].shape == (2,) and out["attention"].shape[1] == rows
            assert np.isfinite(out["score"]).all()

        not_image = "serving input `image` must hold PNG or JPEG files; row 1"
        penalty = "serving input `length_penalty`"
        beams = "serving input `beam_width`"

        def options(**values):
            return {"image": files(image), **values}

        return [
            BadRequest("empty file", {"image": files(image, b"")}, not_image),
            BadRequest("text", {"image": files(image, b"a caption, not an image")},
                       not_image),  # fmt: skip
            BadRequest("cut short", {"image": files(image, image[:-40])}, not_image),
            BadRequest("gif", {"image": files(image, b"GIF89a" + b"\0" * 40)},
                       not_image),  # fmt: skip
            BadRequest("jpeg, twice the size",
                       {"image": files(image, _jpeg_twice(image))},
                       check=jpeg_and_size),  # fmt: skip
            BadRequest("empty batch", {"image": files()}, check=empty_batch),
            BadRequest("nan", options(length_penalty=np.float32("nan")), penalty),
            BadRequest("negative", options(length_penalty=np.float32(-1)), penalty),
            BadRequest("beam 0", options(beam_width=np.int32(0)), beams),
            BadRequest("too wide", options(beam_width=np.int32(widest + 1)), beams),
            BadRequest("rank 2", {"image": np.array([[image]], object)},
                       "serving input `image` must be a vector", python=False),
            BadRequest("rank 0", {"image": np.array(image, object)},
                       "serving input `image` must be a vector", python=False),
        ]  # fmt: skip

    def contract_data(self, folder) -> dict[str, DataCase]:
        folder = Path(folder) / "captions"
        folder.mkdir(parents=True, exist_ok=True)
        empty = folder / "captions.jsonl"
        empty.write_text("")
        return {
            "empty_file": DataCase([f"data.source=folder:{folder}"], str(empty)),
            "empty_valid": DataCase(["data.valid_size=0"]),
        }


def sample_strips(config) -> list[Path]:
    """The first test strips of the configured size as PNG files (written
    once, atomically, to the pipelines' cache folder)."""
    from pipelines.captioning.data import _digit_sizes
    from pipelines.core.run_dir import cache_dir, write_bytes
    from pipelines.data.digit_strips import make_strips

    image, d = config.image, config.data
    folder = cache_dir() / (
        f"captioning-samples-{image.height}x{image.width}-{d.max_digits}-{d.seed}"
    )
    paths = [folder / f"strip_{k}.png" for k in range(SAMPLE_COUNT)]
    if not all(p.is_file() for p in paths):
        low, high = _digit_sizes(image.height)
        strips = make_strips(SAMPLE_COUNT, "test", seed=d.seed + 2, height=image.height,
                             width=image.width, max_digits=d.max_digits,
                             min_size=low, max_size=high)  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        for path, strip in zip(paths, strips, strict=True):
            write_bytes(path, strip.png())
    return paths


def _jpeg_twice(png: bytes) -> bytes:
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(png))
    image = image.resize((image.width * 2, image.height * 2), Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


TASK = CaptioningTask()
