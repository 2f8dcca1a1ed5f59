"""Image bytes in, captions out: decoding, the CNN, in-graph search, words.

`CaptionServer` is the task's `ServingModule`. Its ``caption`` runs the input
checks, image decoding and resizing (`pipelines.captioning.images`), the
encoder, greedy search (``beam_width`` 1) or beam search (up to
``decode.beam_width``, chosen per request) and detokenization in one graph;
the same function is the ``serving_default`` signature.

Outputs: ``caption`` string ``[B]``; ``score`` ``[B]``, ``log P(caption) /
lp`` (GNMT length penalty, ``[END]`` included); ``length`` ``[B]`` (words,
``[END]`` included); ``attention`` ``[B, T, H, W]``, each written word's
attention over the grid's rows and columns (``T = tokenizer.max_words + 1``,
zero after ``[END]``); ``words`` ``[B, T]``, the word written at each row.

Defined results (documented in docs/pipelines/captioning.md): an empty batch
gives empty outputs. A row that is not a complete PNG or JPEG file, or
whose header declares more than ``export.max_image_pixels`` pixels (checked
before decoding), a length penalty that is negative or not finite, or a beam
width outside ``[1, decode.beam_width]`` is an ``InvalidArgument`` that
names the input; the whole request fails, and the model goes on serving.
"""

from __future__ import annotations

import tensorflow as tf

from pipelines.captioning.images import decode_images
from pipelines.core.compiled import call_bucketed, xla
from pipelines.core.search import (
    SearchModule,
    best_hypothesis,
    option_specs,
)


class CaptionServer(SearchModule):
    compiles_decoding = True
    image_inputs = ("image",)

    def __init__(self, model, tokenizer, config):
        super().__init__(model.trainer, "captioner", config.decode)
        self.model = model
        self.tokenizer = tokenizer
        self.image = config.image
        self.grid = model.grid
        self.max_length = config.tokenizer.max_words + 1  # + [END]
        self.jit_compile = config.export.jit_compile
        self.max_pixels = config.export.max_image_pixels
        if self.jit_compile:
            self.compiled_search = xla(self.search)

    def search(self, images, beam_width, length_penalty) -> dict:
        """Token ids, scores, lengths and alignments ``[B, T, H' * W']`` of
        the best caption of each decoded image ``[B, H, W, C]``."""
        rows = tf.shape(images)[0]
        return best_hypothesis(
            self.model, self.encode(images), rows,
            self.max_length, self.max_beam_width, beam_width, length_penalty,
        )  # fmt: skip

    def encode(self, images):
        """The model's features of ``images``; an empty batch is encoded as
        one blank image and cut back, because TensorFlow 2.21's oneDNN fused
        convolution rejects an empty batch on some CPUs ("input depth must be
        evenly divisible by filter depth")."""
        rows = tf.shape(images)[0]
        blank = tf.cast(tf.equal(rows, 0), tf.int32)
        features = self.model.encode(
            tf.pad(images, [[0, blank], [0, 0], [0, 0], [0, 0]])
        )
        return tf.nest.map_structure(lambda f: f[:rows], features)

    def decode(self, images, beam_width, length_penalty) -> dict:
        """`search`, or under ``export.jit_compile`` its XLA-compiled form on
        a batch padded to a power of two (`pipelines.core.compiled`)."""
        if not self.jit_compile:
            return self.search(images, beam_width, length_penalty)
        return call_bucketed(self.compiled_search, images, beam_width, length_penalty)

    def caption(self, images, beam_width=None, length_penalty=None) -> dict:
        """Captions and their attention for a batch of PNG or JPEG files."""
        pixels = decode_images(
            images, self.image, name="image", max_pixels=self.max_pixels
        )
        beam_width, length_penalty = self.checked_options(beam_width, length_penalty)
        return self.caption_pixels(pixels, beam_width, length_penalty)

    def caption_pixels(self, pixels, beam_width, length_penalty) -> dict:
        out = self.decode(pixels, beam_width, length_penalty)
        tokens = out["tokens"]
        # Decoding stops at max_length even without [END]; rows past the
        # written words (and [END]) are zero.
        batch, steps = tf.shape(tokens)[0], tf.shape(tokens)[1]
        written = tf.sequence_mask(out["lengths"], steps)
        attention = tf.where(written[:, :, None], out["alignments"], 0.0)
        attention = tf.reshape(attention, [batch, steps, *self.grid])
        words = tf.where(written, self.tokenizer.id_to_token(tokens), "")
        return {
            "caption": self.tokenizer.detokenize(tokens),
            "score": out["scores"],
            "length": out["lengths"],
            "attention": attention,
            "words": words,
        }

    def traced_caption(self):
        """`caption_pixels` as one ``tf.function`` over decoded images, for
        `evaluate` (traced once, reused for any batch)."""
        if not hasattr(self, "_traced"):
            image = self.image
            self._traced = tf.function(
                self.caption_pixels,
                input_signature=[
                    tf.TensorSpec(
                        [None, image.height, image.width, image.channels], tf.float32
                    ),
                    *option_specs([]),
                ],
            )
        return self._traced

    # -- the export ---------------------------------------------------------
    def signatures(self) -> dict:
        """``serving_default`` takes ``image`` (PNG or JPEG bytes ``[B]``)
        alone (the run's decoding options); ``with_options`` takes ``image``
        and the per-request ``beam_width`` and ``length_penalty`` (defaults
        in the SignatureDef). Inputs are declared with unknown shapes and
        checked in the graph (a C client may feed any shape)."""
        beams, alpha = self.option_defaults()
        image = tf.TensorSpec(None, tf.string, name="image")

        @tf.function(input_signature=[image])
        def serving_default(image):
            return self.caption(image)

        @tf.function(input_signature=[image, *option_specs(None)])
        def with_options(image, beam_width=beams, length_penalty=alpha):
            return self.caption(image, beam_width, length_penalty)

        return {"serving_default": serving_default, "with_options": with_options}

    def warmup_requests(self) -> list[dict]:
        import numpy as np

        from pipelines.captioning.digit_strips import png_bytes

        blank = png_bytes(np.zeros((self.image.height, self.image.width), "uint8"))
        return [{"image": np.array([blank, blank], dtype=object)}]
