"""Strings in, translations out: tokenizers + model + in-graph decoding.

`Translator` is the task's `ServingModule`. Its ``translate`` runs the input
checks, tokenization, the encoder, greedy search (``beam_width`` 1) or beam
search (2 up to ``decode.beam_width``, chosen per request) and
detokenization inside one graph; the same functions are the SavedModel
signatures (`Translator.signatures`).

Defined results (documented in docs/pipelines/translation.md): a source with
no tokens (``""``, only spaces) translates to ``""`` with score 0, length 0
and zero alignment; an empty batch gives empty outputs. A length penalty
that is negative or not finite, a beam width outside ``[1, decode.beam_width]``,
invalid UTF-8 or an input of the wrong rank is an ``InvalidArgument`` that
names the input. A source longer than ``tokenizer.max_source_tokens`` is
read up to there: ``truncated`` says so, ``source_length`` counts its tokens.
"""

from __future__ import annotations

import tensorflow as tf

from pipelines.core.compiled import call_bucketed, xla
from pipelines.core.search import (
    SearchModule,
    best_hypothesis,
    option_specs,
)
from pipelines.core.serving import checked_ids, checked_strings
from pipelines.core.text import PAD

SAMPLES = {
    "dates": ["montag, 9. märz 1987", "9 de marzo de 1987", "march 9, 1987"],
    "bible": [
        "in the beginning god created the heavens and the earth.",
        "jesus wept.",
        "love your neighbor as yourself.",
    ],
    "ding": ["ich habe keine zeit.", "das ist mein buch."],
}


def samples_for(config) -> list[str]:
    name = config.data.source.split(":", 1)[0]
    return SAMPLES.get(name, SAMPLES["bible"])


class Translator(SearchModule):
    compiles_decoding = True

    def __init__(self, model, source_tokenizer, target_tokenizer, config):
        super().__init__(model.trainer, "translator", config.decode)
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.max_source = config.tokenizer.max_source_tokens
        self.max_length = config.tokenizer.max_target_tokens + 1  # + [END]
        self.samples = samples_for(config)
        self.jit_compile = config.export.jit_compile
        if self.jit_compile:
            self.compiled_decode_ids = xla(self.decode_ids)

    # -- pieces -----------------------------------------------------------
    def source_ids(self, strings) -> tuple[tf.Tensor, tf.Tensor]:
        """``[B, S]`` int32 ids, cut at ``max_source_tokens``, 0-padded, and
        ``[B]`` the tokens of each string before the cut."""
        ids = self.source_tokenizer.tokenize(strings)
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        ids = ids[:, : self.max_source].to_tensor(default_value=PAD)
        # An all-empty batch still gets one (padding) column.
        ids = tf.pad(ids, [[0, 0], [0, 1]])[:, : tf.maximum(tf.shape(ids)[1], 1)]
        return ids, lengths

    def decode_ids(self, source_ids, beam_width, length_penalty) -> dict:
        """Token ids, scores, lengths and alignments of the best hypothesis.

        ``beam_width`` (int32 scalar) 1 runs greedy search, more runs beam
        search with that many beams; scores are ``log P(Y|X) / lp(Y)``. Rows
        without a source token get no tokens, score 0 and length 0.
        """
        source_ids = tf.convert_to_tensor(source_ids, tf.int32)
        out = best_hypothesis(
            self.model, self.model.encode(source_ids), tf.shape(source_ids)[0],
            self.max_length, self.max_beam_width, beam_width, length_penalty,
            source_length=tf.shape(source_ids)[1],
        )  # fmt: skip
        # A source with no tokens has nothing to translate: a defined result.
        has_source = tf.reduce_any(tf.not_equal(source_ids, PAD), axis=1)
        out["tokens"] = tf.where(has_source[:, None], out["tokens"], PAD)
        out["scores"] = tf.where(has_source, out["scores"], 0.0)
        out["lengths"] = tf.where(has_source, out["lengths"], 0)
        out["alignments"] = tf.where(
            has_source[:, None, None],
            out["alignments"],
            tf.zeros_like(out["alignments"]),
        )
        return out

    def decode(self, source_ids, beam_width, length_penalty) -> dict:
        """`decode_ids`, or under ``export.jit_compile`` its XLA-compiled
        form on ids padded to bucketed shapes (`pipelines.core.compiled`)."""
        if not self.jit_compile:
            return self.decode_ids(source_ids, beam_width, length_penalty)
        out = call_bucketed(
            self.compiled_decode_ids, source_ids, beam_width, length_penalty,
            max_columns=self.max_source, pad_value=PAD,
        )  # fmt: skip
        out["alignments"] = out["alignments"][:, :, : tf.shape(source_ids)[1]]
        return out

    def traced_translate(self):
        """`translate` as one ``tf.function`` (traced once, reused for any batch)."""
        if not hasattr(self, "_traced"):
            self._traced = tf.function(
                self.translate,
                input_signature=[tf.TensorSpec([None], tf.string), *option_specs([])],
            )
        return self._traced

    def translate(self, strings, beam_width=None, length_penalty=None) -> dict:
        """Translations and what explains them, for a batch of strings."""
        strings = checked_strings("source", strings)
        beam_width, length_penalty = self.checked_options(beam_width, length_penalty)
        source_ids, source_length = self.source_ids(strings)
        out = self.decode(source_ids, beam_width, length_penalty)
        tokens = out["tokens"]
        return {
            "translation": self.target_tokenizer.detokenize(tokens),
            "score": out["scores"],
            "length": out["lengths"],
            "alignment": out["alignments"],
            "source_tokens": self.source_tokenizer.id_to_token(source_ids),
            "source_length": source_length,
            "truncated": source_length > self.max_source,
            "target_tokens": self.target_tokenizer.id_to_token(tokens),
        }

    def translate_token_ids(self, source_ids, beam_width, length_penalty) -> dict:
        source_ids = checked_ids(
            "source_ids", source_ids, self.source_tokenizer.vocab_size
        )
        beam_width, length_penalty = self.checked_options(beam_width, length_penalty)
        out = self.decode(source_ids, beam_width, length_penalty)
        return {
            "target_ids": out["tokens"],
            "score": out["scores"],
            "length": out["lengths"],
            "alignment": out["alignments"],
        }

    # -- the export ---------------------------------------------------------
    def signatures(self) -> dict:
        """``serving_default`` takes ``source`` alone (the run's decoding
        options); ``with_options`` takes ``source`` and the per-request
        ``beam_width`` and ``length_penalty``; ``translate_ids`` takes token
        ids and the options.

        Inputs are declared with unknown shapes and checked in the graph (a C
        client may feed any shape). The options have defaults in the
        SignatureDef (``PlaceholderWithDefault``), so TF Serving and C clients
        may leave them out.
        """
        beams, alpha = self.option_defaults()
        source = tf.TensorSpec(None, tf.string, name="source")
        options = option_specs(None)

        @tf.function(input_signature=[source])
        def serving_default(source):
            return self.translate(source)

        @tf.function(input_signature=[source, *options])
        def with_options(source, beam_width=beams, length_penalty=alpha):
            return self.translate(source, beam_width, length_penalty)

        @tf.function(
            input_signature=[tf.TensorSpec(None, tf.int32, name="source_ids")] + options
        )
        def translate_ids(source_ids, beam_width=beams, length_penalty=alpha):
            return self.translate_token_ids(source_ids, beam_width, length_penalty)

        return {
            "serving_default": serving_default,
            "with_options": with_options,
            "translate_ids": translate_ids,
        }

    def warmup_requests(self) -> list[dict]:
        import numpy as np

        return [
            {"source": np.array(self.samples, dtype=object)},
            {"source": np.array(self.samples[:1], dtype=object)},
        ]
