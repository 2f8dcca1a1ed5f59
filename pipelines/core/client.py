"""A task's command-line side: its options, and how it shows an export's answers.

`pipelines.cli` runs the verbs; each task's `Client` (``pipelines/<task>/
client.py``, the task's ``client``) adds the options of ``evaluate`` and
``predict``, prints what an export returns, and says what ``demo`` adds.
``predict`` runs where only TensorFlow and tensorflow-text are installed, as
any client of a SavedModel: a client's module imports neither Keras nor this
library.
"""

from __future__ import annotations

import abc
import argparse
from pathlib import Path

import numpy as np


class Client(abc.ABC):
    """The command line's side of one task."""

    # Extra verbs a task offers as aliases of predict (named by each task).
    predict_aliases: tuple[str, ...] = ()

    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:  # noqa: B027
        """Task options of ``evaluate`` (``--split`` and ``--limit`` are core's)."""

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:  # noqa: B027
        """Task options of ``predict`` (the inputs and ``--export`` are core's)."""

    @abc.abstractmethod
    def predict(self, export_dir: Path, inputs: list[str], args) -> None:
        """Call the export (TensorFlow and tensorflow-text only) and print."""

    def demo_arguments(self, run_dir: Path) -> list[str]:
        """Extra ``predict`` arguments of ``demo`` (e.g. where to draw a plot)."""
        return []

    def demo_notes(self, run_dir: Path) -> list[str]:
        """Extra items for the last line of ``demo`` (e.g. the plot's path)."""
        return []

    def evaluation_summary(self, metrics: dict) -> str:
        """One line of ``evaluate``'s metrics for the end of ``demo``."""
        return ""


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """``predict``'s options of a decoding export: ``--beam-width`` and
    ``--length-penalty`` (`search_feed` sends them)."""
    parser.add_argument("--beam-width", type=int, help="1 = greedy")
    parser.add_argument("--length-penalty", type=float, help="GNMT alpha")


def add_beam_widths(parser: argparse.ArgumentParser) -> None:
    """``evaluate``'s ``--beam-width``, repeatable: the decodings to score."""
    parser.add_argument(
        "--beam-width",
        type=int,
        action="append",
        help="decode with this many beams (repeatable; 1 = greedy; default: "
        "greedy and decode.default_beam_width)",
    )


def options_signature(options: dict) -> str:
    """The signature that answers a request: ``serving_default`` takes the
    main input alone, ``with_options`` the per-request options too."""
    return "with_options" if options else "serving_default"


def search_feed(args) -> dict:
    """The serving inputs of the search options given on the command line
    (`add_search_arguments`); those left out take the export's defaults."""
    feed = {}
    if args.beam_width is not None:
        feed["beam_width"] = np.int32(args.beam_width)
    if args.length_penalty is not None:
        feed["length_penalty"] = np.float32(args.length_penalty)
    return feed
