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
import csv
from pathlib import Path
from typing import NamedTuple

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

    def demo_examples(self, run_dir: Path, count: int) -> list[Example]:
        """The first ``count`` examples ``evaluate`` wrote to the run folder
        (its predictions file), for ``demo`` to show."""
        return []

    def demo_facts(self, config) -> list[str]:
        """What the demo's model was trained to know, said beside its examples
        (e.g. the range of values its data covered)."""
        return []


class Example(NamedTuple):
    """One evaluated example as ``demo`` shows it, each field one line."""

    input: str
    truth: str
    prediction: str


def read_tsv(path: Path, count: int, quoted: bool = False) -> list[dict[str, str]]:
    r"""The first ``count`` rows of a predictions file (a header row, then one
    row a line, tab-separated; ``quoted``: CSV quoting), by column name; none
    when the file is missing.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "t.tsv"
    >>> _ = path.write_text('source\treference\n"a\tb\nc\td\n')
    >>> read_tsv(path, 5)
    [{'source': '"a', 'reference': 'b'}, {'source': 'c', 'reference': 'd'}]
    """
    if not Path(path).is_file():
        return []
    with open(path, encoding="utf-8", newline="") as f:
        quoting = csv.QUOTE_MINIMAL if quoted else csv.QUOTE_NONE
        rows = csv.DictReader(f, delimiter="\t", quoting=quoting)
        return [row for _, row in zip(range(count), rows, strict=False)]


def decoded_column(row: dict[str, str], given: tuple[str, ...]) -> str:
    """The first decoding of a predictions row (``greedy`` where written),
    the columns ``given`` (inputs and references) aside."""
    if "greedy" in row:
        return row["greedy"]
    return next((v for k, v in row.items() if k not in given), "") or ""


def shorten(text: str, limit: int = 160, keep: str = "head") -> str:
    r"""``text`` on one line, at most ``limit`` characters: its start
    (``keep="head"``) or its end (``"tail"``, where a question comes last)
    behind an ellipsis.

    >>> shorten("a long\nstory. Where is Mary?", 20, keep="tail")
    '... Where is Mary?'
    >>> shorten("Mary went to the hallway. John went home.", 24)
    'Mary went to the ...'
    """
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = limit - 4  # room for the ellipsis, words kept whole
    if keep == "tail":
        tail = text[len(text) - cut :]
        if text[len(text) - cut - 1] != " ":
            tail = tail.partition(" ")[2] or tail
        return "... " + tail.lstrip()
    head = text[:cut]
    if text[cut] != " ":
        head = head.rpartition(" ")[0] or head
    return head.rstrip() + " ..."


def format_examples(examples: list[Example], where: str = "") -> str:
    """Examples as ``demo`` prints them: the input, the truth and the
    prediction of each, one under the other.

    >>> print(format_examples([Example("9 de marzo de 1987", "1987-03-09",
    ...                                "1987-03-09")], "test split"))
    Examples from the test split (input / truth / prediction):
      input       9 de marzo de 1987
      truth       1987-03-09
      prediction  1987-03-09
    """
    if not examples:
        return ""
    lines = [f"Examples from the {where or 'evaluation'} (input / truth / prediction):"]
    for k, (text, truth, prediction) in enumerate(examples):
        if k:
            lines.append("")
        lines += [f"  input       {text}", f"  truth       {truth}",
                  f"  prediction  {prediction}"]  # fmt: skip
    return "\n".join(lines)


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
