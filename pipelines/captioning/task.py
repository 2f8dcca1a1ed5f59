"""The image-captioning task: what it supplies to the pipeline core.

Captioned images (`pipelines.captioning.data`: digit strips generated from
scikit-learn's scans, or the user's folder), a word vocabulary learned from
the training captions, a CNN encoder with an attention RNN decoder
(`pipelines.captioning.model`, Show, Attend and Tell), BLEU-4, exact match
and attention localisation (`pipelines.captioning.evaluate`), and a
`CaptionServer` export that takes PNG or JPEG bytes.
"""

from __future__ import annotations

from pipelines.captioning import config as captioning_config
from pipelines.captioning.client import CaptioningClient
from pipelines.captioning.contract import CaptioningContract
from pipelines.core.task import Task, forward, saved_or_learned

TOKENIZER = "tokenizer.json"


class CaptioningTask(Task):
    client = CaptioningClient()
    contract = CaptioningContract()
    name = "captioning"
    description = "image captioning: CNN encoder, attention decoder, image bytes in"
    default_preset = "digits-quick"
    run_files = (TOKENIZER, "captions.tsv", "attention.png")
    learned_files = (TOKENIZER,)
    evaluate_files = ("captions.tsv", "plots/attention_0.png")

    def presets(self):
        return captioning_config.PRESETS

    # -- data ---------------------------------------------------------------
    load_data = forward("pipelines.captioning.data", "load_data")

    def preprocessors(self, run, data, config, create):
        from pipelines.core.text import WordTokenizer, load_tokenizer

        def learn(data):
            captions = [c for e in data.train for c in e.captions]
            return WordTokenizer.learn(captions, config.tokenizer.vocab_size)

        return saved_or_learned(
            self.name, run, data, create, (TOKENIZER,), load_tokenizer, learn,
            lambda tokenizer, path: tokenizer.save(path),
        )  # fmt: skip

    def summary(self, data, preprocessors, config) -> str:
        lines = [
            f"{name}: {len(data.split(name))} images, "
            f"{sum(len(e.captions) for e in data.split(name))} captions"
            for name in ("train", "valid", "test")
        ]
        lines += data.notes
        lines.append(f"vocabulary: {preprocessors.vocab_size} words")
        return "\n".join(lines)

    make_dataset = forward("pipelines.captioning.data", "make_dataset")

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

    def evaluate(self, run, model, preprocessors, config, examples, args) -> dict:
        from pipelines.captioning.evaluate import evaluate

        server = self.serving_module(model, preprocessors, config)
        widths = tuple(args.beam_width) if getattr(args, "beam_width", None) else None
        return evaluate(run.root, server, config, examples, args.split, widths,
                        getattr(args, "plots", 3),
                        getattr(args, "robustness", False))  # fmt: skip

    plot_attention = forward("pipelines.captioning.evaluate", "plot_attention")

    # -- serving ------------------------------------------------------------
    serving_module = forward("pipelines.captioning.serving", "CaptionServer")

    samples = forward("pipelines.captioning.data", "samples_for")


TASK = CaptioningTask()
