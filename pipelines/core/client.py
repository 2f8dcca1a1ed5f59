"""A task's command-line side: its options, and how it shows an export's answers.

`pipelines.cli` runs the verbs; each task's `Client` (``pipelines/<task>/
client.py``, the task's ``client``) adds the options of ``evaluate`` and
``predict``, prints what an export returns, and says what ``demo`` adds:
the plot it draws and the predictions file it shows (class attributes), one
example per row (``demo_example``). `SearchClient` serves the tasks whose
export decodes with a beam search.
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

from pipelines.core.baselines import in_brief


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

    # The plot ``demo`` has ``predict`` draw in the run folder (its file name)
    # and what the last line of ``demo`` calls it; none where empty.
    demo_plot: str = ""
    demo_plot_name: str = "plot"
    # The predictions file ``evaluate`` writes in the run folder (CSV quoting
    # where ``predictions_quoted``), whose first rows ``demo`` shows.
    predictions_file: str = ""
    predictions_quoted: bool = False

    def demo_arguments(self, run_dir: Path) -> list[str]:
        """Extra ``predict`` arguments of ``demo`` (where to draw the plot)."""
        return ["--plot", str(Path(run_dir) / self.demo_plot)] if self.demo_plot else []

    def demo_notes(self, run_dir: Path) -> list[str]:
        """Extra items for the last line of ``demo`` (the plot's path)."""
        if not self.demo_plot:
            return []
        return [f"{self.demo_plot_name} {Path(run_dir) / self.demo_plot}"]

    def evaluation_summary(self, metrics: dict) -> str:
        """One line of ``evaluate``'s metrics for the end of ``demo``."""
        return ""

    def demo_examples(self, run_dir: Path, count: int) -> list[Example]:
        """The first ``count`` examples ``evaluate`` wrote to the run folder
        (its predictions file), for ``demo`` to show."""
        if not self.predictions_file:
            return []
        path = Path(run_dir) / self.predictions_file
        rows = read_tsv(path, count, quoted=self.predictions_quoted)
        return [self.demo_example(row) for row in rows]

    def demo_example(self, row: dict[str, str]) -> Example:
        """One row of the predictions file as ``demo`` shows it."""
        raise NotImplementedError(f"{type(self).__name__} names no demo_example")

    def demo_facts(self, config) -> list[str]:
        """What the demo's model was trained to know, said beside its examples
        (e.g. the range of values its data covered)."""
        return []

    @staticmethod
    def add_plot_count(parser: argparse.ArgumentParser, what: str, flag="--heatmaps"):
        """``evaluate``'s option of how many examples to plot (three by
        default), ``what`` its help."""
        parser.add_argument(flag, type=int, default=3, help=what)

    @staticmethod
    def summary_line(
        metrics: dict, headline: str, brief: list[tuple[str, str, str]], extra=""
    ) -> str:
        """`evaluation_summary`'s line: ``headline`` on the split evaluated,
        the baselines' ``brief`` figures (`in_brief`), then ``extra``.

        >>> Client.summary_line({"split": "test"}, "accuracy 90.0%", [], "; 3 hops")
        'accuracy 90.0% on the test split; 3 hops'
        """
        split = metrics["split"]
        return f"{headline} on the {split} split" + in_brief(metrics, brief) + extra

    @staticmethod
    def call_pairs(
        export_dir: Path, pairs: list[tuple[str, str]], names: tuple[str, str]
    ):
        """The export's answers to ``pairs`` of texts (e.g. a passage and a
        question), each pair's items fed to the inputs ``names``."""
        from pipelines.core.serving import call_export

        feed = {
            name: np.array([pair[k] for pair in pairs], dtype=object)
            for k, name in enumerate(names)
        }
        return call_export(export_dir, feed)

    @staticmethod
    def print_answer(given: str, answer: bytes, details: str) -> None:
        """One of ``predict``'s answers: the input, under it the export's
        answer and, in a parenthesis, ``details`` (its score ...).

        >>> Client.print_answer("Where is Mary?", b"garden", "probability 0.900")
        Where is Mary?
          -> garden   (probability 0.900)
        """
        print(f"{given}\n  -> {answer.decode('utf-8')}   ({details})")


class SearchClient(Client):
    """The side of a task whose export decodes with a search: ``evaluate``
    scores beam widths (`add_beam_widths`), ``predict`` takes the search
    options (`add_search_arguments`) and sends them."""

    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_beam_widths(parser)

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_search_arguments(parser)

    def search(
        self,
        export_dir: Path,
        name: str,
        values: list,
        args,
        options: dict | None = None,
    ) -> dict:
        """The export's answers to ``values`` (its input ``name``), with the
        command line's search options (`search_feed`) and ``options``."""
        from pipelines.core.serving import call_export

        options = {**search_feed(args), **(options or {})}
        feed = {name: np.array(values, dtype=object), **options}
        return call_export(export_dir, feed, options_signature(options))

    @staticmethod
    def truncation_notes(out: dict, padding: bytes, unit: str) -> list[str]:
        """Per input of the export's answers, a note where it read only the
        start of the input (its ``truncated`` output; ``source_tokens`` other
        than ``padding``, counted in ``unit``), else "".

        >>> out = {"source_tokens": np.array([[b"a", b"b", b""], [b"c", b"", b""]]),
        ...        "truncated": np.array([True, False])}
        >>> SearchClient.truncation_notes(out, b"", "words")
        ['; read the first 2 words only', '']
        """
        tokens = out["source_tokens"]
        cut = out.get("truncated", np.zeros(len(tokens), bool))
        read = (tokens != padding).sum(1)
        return [
            f"; read the first {n} {unit} only" if truncated else ""
            for truncated, n in zip(cut, read, strict=True)
        ]

    @staticmethod
    def plot_alignment(out: dict, target: str, weights: str, path, label: str, **kw):
        """Draw the first answer's ``weights`` over its ``source_tokens`` and
        ``target`` tokens (`alignment_heatmap`, with its options ``kw``) at
        ``path`` and say where, after ``label``."""
        from pipelines.core.plots import alignment_heatmap

        path = alignment_heatmap(
            out["source_tokens"][0], out[target][0], out[weights][0], path, **kw
        )
        print(f"{label}: {path}")


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
