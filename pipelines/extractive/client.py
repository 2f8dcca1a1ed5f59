"""The extractive task's command line: ``predict`` (or ``answer``) reads a
passage then its question, prints the answer's span with its probability and
can box the first answer in its passage."""

from __future__ import annotations

import argparse
import re

import numpy as np

from pipelines.core.client import Client, Example
from pipelines.core.errors import PipelineError


class ExtractiveClient(Client):
    predict_aliases = ("answer",)
    demo_plot, demo_plot_name = "span.png", "span plot"
    predictions_file, predictions_quoted = "answers.tsv", True

    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.add_plot_count(parser, "span plots")

    def evaluation_summary(self, metrics: dict) -> str:
        held = metrics.get("by_phrasing", {}).get("held_out")
        extra = f"; held-out phrasings F1 {held['f1']:.1f}" if held else ""
        return self.summary_line(
            metrics,
            f"exact match {metrics['exact_match']:.1f}, F1 {metrics['f1']:.1f}",
            [("exact match", "exact_match", ".1f"), ("F1", "f1", ".1f")],
            extra,
        )

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--plot", help="write the first answer's span plot here")

    def predict(self, export_dir, inputs, args) -> None:
        import tensorflow_text  # noqa: F401  registers RegexSplitWithOffsets

        pairs = [split_input(text) for text in inputs]
        out = self.call_pairs(export_dir, pairs, ("context", "question"))
        passage = None
        for (context, question), answer, start, end, score in zip(
            pairs, out["answer"], out["start"], out["end"], out["score"], strict=True
        ):
            if context != passage:  # a passage asked several questions: once
                print(context)
                passage = context
            answer = answer.decode("utf-8")
            print(f"  {question}\n    -> {answer!r}   (characters {start}-{end} of "
                  f"the passage, probability {score:.3f})")  # fmt: skip
        if getattr(args, "plot", None):
            self._plot(export_dir, pairs[0], out, args.plot)

    def demo_example(self, row) -> Example:
        return Example(row["question"], row["gold"], row["prediction"])

    @staticmethod
    def _plot(export_dir, pair, out, path) -> None:
        """The first answer, boxed in its passage (the export gives no token
        probabilities: the shade marks the answer's tokens)."""
        from pipelines.extractive.countries import SpanExample
        from pipelines.extractive.data import token_span
        from pipelines.extractive.evaluate import span_heatmap
        from pipelines.extractive.tokenizer import SpanTokenizer

        context, question = pair
        answer = out["answer"][0].decode("utf-8")
        tokens, begins, ends = (t[0].numpy() for t in SpanTokenizer.split([context]))
        span = (-1, -1)
        if answer:
            example = SpanExample(context, question, (answer,), int(out["start"][0]))
            span = token_span(example, begins, ends)
        inside = np.zeros(len(tokens))
        if span[0] >= 0:
            inside[span[0] : span[1] + 1] = float(out["score"][0])
        span_heatmap(
            tokens, inside, np.zeros_like(inside), path, gold=None,
            title=f"{question} -> {answer!r}", shade="the answer's score",
        )  # fmt: skip
        print(f"The answer in its passage: {path}")


def split_input(text: str) -> tuple[str, str]:
    r"""A ``predict`` input, the passage then the question, as
    ``(context, question)``: the question is the last line, or without a
    line break the last sentence; it ends in "?".

    >>> split_input("Lima is the capital of Peru. What is the capital of Peru?")
    ('Lima is the capital of Peru.', 'What is the capital of Peru?')
    >>> split_input("It borders St. Lucia.\nWhat does it border?")
    ('It borders St. Lucia.', 'What does it border?')
    """
    text = text.strip()
    if "\n" in text:
        context, question = (part.strip() for part in text.rsplit("\n", 1))
    else:
        question = re.split(r"(?<=[.!?])\s+", text)[-1]
        context = text[: len(text) - len(question)].strip()
    if not question.endswith("?") or not context:
        raise PipelineError(
            "predict: each input is a passage then a question ending in '?' (on "
            f"a line of its own, or as the last sentence), received {text[:80]!r}"
        )
    return context, question
