"""In-graph search for a serving module: greedy or beam search, chosen per request.

A task whose model decodes step by step (``encode``, ``initial_state`` and
``step_fn`` as `attention_layers.decoding` wants them) serves its best
hypothesis with `best_hypothesis`. Two widths meet here: ``max_beam_width``,
a Python int compiled into the export (``decode.beam_width``: the beams'
buffers), and a request's ``beam_width``, a tensor checked once against it
(`checked_search_options`): 1 runs greedy search, 2 up to
``max_beam_width`` beam search with that many live beams, in one graph (a
``tf.cond``). Scores are ``log P(Y|X) / lp(Y)`` with GNMT's length penalty.

Example:

>>> import tensorflow as tf
>>> width, alpha = checked_search_options(tf.constant(2), tf.constant(0.6), 4)
>>> int(width), round(float(alpha), 2)
(2, 0.6)
"""

from __future__ import annotations

import tensorflow as tf

from attention_layers.decoding import (
    beam_search,
    gnmt_length_penalty,
    greedy_search,
    tile_beams,
)
from pipelines.core.serving import ServingModule, checked_scalar
from pipelines.core.text import END, START


def checked_search_options(beam_width, length_penalty, max_beam_width: int):
    """The two serving options, checked: ``beam_width`` in ``[1, max_beam_width]``
    and a finite ``length_penalty >= 0`` (else ``InvalidArgument`` naming them)."""
    beam_width = checked_scalar("beam_width", beam_width, tf.int32, 1, max_beam_width)
    length_penalty = checked_scalar("length_penalty", length_penalty, tf.float32, 0.0)
    return beam_width, length_penalty


class SearchModule(ServingModule):
    """A serving module that searches: the export's ``max_beam_width``
    (``decode.beam_width``) and the run's default options, which a request
    without them gets."""

    def __init__(self, trainer, name: str, decode):
        super().__init__(trainer, name=name)
        self.max_beam_width = decode.beam_width
        self.default_beam_width = decode.default_beam_width
        self.default_length_penalty = decode.length_penalty

    def checked_options(self, beam_width=None, length_penalty=None):
        """A request's options (the defaults for None), checked once
        (`checked_search_options`)."""
        if beam_width is None:
            beam_width = self.default_beam_width
        if length_penalty is None:
            length_penalty = self.default_length_penalty
        return checked_search_options(beam_width, length_penalty, self.max_beam_width)

    def option_defaults(self) -> tuple[tf.Tensor, tf.Tensor]:
        """The default ``beam_width`` and ``length_penalty`` as constants: a
        signature's defaults (``PlaceholderWithDefault`` in the SignatureDef),
        so that a client may leave the options out."""
        return (
            tf.constant(self.default_beam_width, tf.int32),
            tf.constant(self.default_length_penalty, tf.float32),
        )


def option_specs(shape, **extra) -> list[tf.TensorSpec]:
    """Specs of the search options ``beam_width`` and ``length_penalty``,
    then ``extra`` (name -> dtype), each named: ``shape`` ``[]`` for a traced
    function, None for a signature input checked in the graph."""
    dtypes = {"beam_width": tf.int32, "length_penalty": tf.float32, **extra}
    return [tf.TensorSpec(shape, dtype, name=name) for name, dtype in dtypes.items()]


def best_hypothesis(
    model, encoded, batch_size, max_length: int, max_beam_width: int, beam_width,
    length_penalty, source_length=None,
) -> dict:  # fmt: skip
    """``tokens``, ``scores``, ``lengths`` and ``alignments`` of the best
    hypothesis of each row (`attention_layers.decoding`'s fields), searched
    with ``beam_width`` live beams (checked by `checked_search_options`).

    A model whose steps return no alignment gets zeros ``[B, T,
    source_length]``.
    """
    beam_width = tf.cast(beam_width, tf.int32)
    alpha = tf.cast(length_penalty, tf.float32)
    start = tf.fill([batch_size], START)

    def with_alignments(out):
        out = dict(out)
        if "alignments" not in out:
            shape = tf.concat([tf.shape(out["tokens"]), [source_length]], 0)
            out["alignments"] = tf.zeros(shape, tf.float32)
        return out

    def greedy():
        out = with_alignments(greedy_search(
            model.step_fn(encoded), model.initial_state(encoded), start,
            end_id=END, max_length=max_length,
        ))  # fmt: skip
        lp = gnmt_length_penalty(out["lengths"], alpha)
        return {
            "tokens": out["tokens"],
            "scores": out["scores"] / lp,
            "lengths": out["lengths"],
            "alignments": out["alignments"],
        }

    def beam():
        tiled = tile_beams(encoded, max_beam_width)
        out = with_alignments(beam_search(
            model.step_fn(tiled), model.initial_state(tiled), start, end_id=END,
            max_length=max_length, length_penalty=alpha,
            # The layer's names: its buffers' width, and the live beams.
            beam_width=max_beam_width, num_beams=beam_width,
        ))  # fmt: skip
        return {k: out[k][:, 0] for k in ("tokens", "scores", "lengths", "alignments")}

    return greedy() if max_beam_width == 1 else tf.cond(beam_width <= 1, greedy, beam)


def check_beam_widths(widths, decode) -> tuple[int, ...]:
    """``evaluate``'s beam widths: ``widths``, or greedy and
    ``decode.default_beam_width``; each must lie in ``[1, decode.beam_width]``."""
    if widths is None:
        widths = tuple(sorted({1, decode.default_beam_width}))
    for width in widths:
        if not 1 <= width <= decode.beam_width:
            raise ValueError(
                f"evaluate: --beam-width must be in [1, decode.beam_width="
                f"{decode.beam_width}], received {width}."
            )
    return tuple(widths)
