"""Strings in, summaries out: the summarization task's `ServingModule`.

`Summarizer.summarize` runs the input checks, the word tokenizer, the copy
ids, beam search (``beam_width`` beams per request, 1 being greedy, up to
``decode.beam_width``) and the words of the result in one graph
(`pipelines.summarization.decode.summarize`); the same function is the
SavedModel's ``serving_default``.

Defined results (documented in docs/pipelines/summarization.md): a text with
no words (``""``, only spaces) gets the summary ``""``, score 0, length 0,
zero attention and ``p_gen``; an empty batch gives empty outputs. A
``beam_width`` outside ``[1, decode.beam_width]``, a ``length_penalty`` that
is negative or not finite, a ``min_length`` outside ``[0,
tokenizer.max_target_tokens]``, invalid UTF-8 or an input of the wrong rank
is an ``InvalidArgument`` that names the input. A text longer than
``tokenizer.max_source_tokens`` words is read up to there: ``truncated``
says so, ``source_length`` counts its words.
"""

from __future__ import annotations

import tensorflow as tf

from pipelines.core.search import SearchModule, option_specs
from pipelines.core.serving import checked_scalar, checked_strings
from pipelines.core.text import PAD
from pipelines.summarization.decode import summarize

SAMPLES = {
    "debian": [
        "gnu hello prints a friendly greeting. it is an example of a program "
        "that follows the gnu coding standards, and is used to show how to "
        "write a package.",
        "this package contains the header files and static libraries for "
        "libzorp, a library that reads and writes zorp archives.",
    ],
    "blurbs": [
        "this package provides quandrix, a rust tool for log files. it "
        "supports plugins and keeps a cache on disk.",
        "the library is maintained by a small team of volunteers. velomar is "
        "a library for json files, written in python. this package contains "
        "the documentation.",
    ],
}


def samples_for(config) -> list[str]:
    name = config.data.source.split(":", 1)[0]
    return SAMPLES.get(name, SAMPLES["debian"])


class Summarizer(SearchModule):
    def __init__(self, model, tokenizer, config):
        super().__init__(model.trainer, "summarizer", config.decode)
        self.model = model
        self.tokenizer = tokenizer
        self.max_source = config.tokenizer.max_source_tokens
        self.max_length = config.tokenizer.max_target_tokens + 1  # + [END]
        self.default_min_length = config.decode.min_length
        self.samples = samples_for(config)

    def checked_options(self, beam_width=None, length_penalty=None, min_length=None):
        """The search options and ``min_length`` (the defaults for None), checked."""
        min_length = self.default_min_length if min_length is None else min_length
        return (
            *super().checked_options(beam_width, length_penalty),
            checked_scalar("min_length", min_length, tf.int32, 0, self.max_length - 1),
        )

    def summarize(
        self, strings, beam_width=None, length_penalty=None, min_length=None
    ) -> dict:
        """Summaries of a batch of strings, with what explains them."""
        strings = checked_strings("text", strings)
        beam_width, length_penalty, min_length = self.checked_options(
            beam_width, length_penalty, min_length
        )
        out = summarize(
            self.model,
            self.tokenizer,
            strings,
            max_source_tokens=self.max_source,
            max_length=self.max_length,
            max_beam_width=self.max_beam_width,
            beam_width=beam_width,
            length_penalty=length_penalty,
            min_length=min_length,
        )
        # A text with no words has nothing to sum up: a defined result.
        has_text = tf.reduce_any(tf.not_equal(out["source_tokens"], ""), axis=1)
        out["summary"] = tf.where(has_text, out["summary"], "")
        out["score"] = tf.where(has_text, out["score"], 0.0)
        out["length"] = tf.where(has_text, out["length"], 0)
        out["attention"] = tf.where(
            has_text[:, None, None], out["attention"], tf.zeros_like(out["attention"])
        )
        out["p_gen"] = tf.where(
            has_text[:, None], out["p_gen"], tf.zeros_like(out["p_gen"])
        )
        out["summary_tokens"] = tf.where(
            has_text[:, None],
            out["summary_tokens"],
            tf.fill(tf.shape(out["summary_tokens"]), self.tokenizer.id_to_token(PAD)),
        )
        return out

    def traced_summarize(self):
        """`summarize` as one ``tf.function`` (traced once, any batch)."""
        if not hasattr(self, "_traced"):
            self._traced = tf.function(
                self.summarize,
                input_signature=[
                    tf.TensorSpec([None], tf.string),
                    *option_specs([], min_length=tf.int32),
                ],
            )
        return self._traced

    def signatures(self) -> dict:
        """``serving_default`` takes ``text [B]`` alone (the run's decoding
        options); ``with_options`` takes ``text`` and the per-request
        ``beam_width``, ``length_penalty`` and ``min_length``.

        Inputs are declared with unknown shapes and checked in the graph (a
        C client may feed any shape); the options have defaults in the
        SignatureDef, so TF Serving and C clients may leave them out.
        """
        beams, alpha = self.option_defaults()
        shortest = tf.constant(self.default_min_length, tf.int32)
        text = tf.TensorSpec(None, tf.string, name="text")

        @tf.function(input_signature=[text])
        def serving_default(text):
            return self.summarize(text)

        @tf.function(input_signature=[text, *option_specs(None, min_length=tf.int32)])
        def with_options(
            text, beam_width=beams, length_penalty=alpha, min_length=shortest
        ):
            return self.summarize(text, beam_width, length_penalty, min_length)

        return {"serving_default": serving_default, "with_options": with_options}

    def warmup_requests(self) -> list[dict]:
        import numpy as np

        return [
            {"text": np.array(self.samples, dtype=object)},
            {"text": np.array(self.samples[:1], dtype=object)},
        ]
