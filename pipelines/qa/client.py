"""The qa task's command line: ``predict`` (or ``answer``) reads a story
ending in its question, prints the answer with its probability and the
sentence each hop (or decoding step) attended to most, and can plot the first
story's attention."""

from __future__ import annotations

import argparse

from pipelines.core.client import Client, Example, shorten
from pipelines.core.errors import PipelineError
from pipelines.qa.babi import split_story


class QAClient(Client):
    predict_aliases = ("answer",)
    demo_plot, demo_plot_name = "attention.png", "attention plot"
    predictions_file = "answers.tsv"

    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.add_plot_count(parser, "attention plots")

    def evaluation_summary(self, metrics: dict) -> str:
        hit = metrics.get("attention_hit")
        row = metrics.get("attention_rows", "hop")
        hops = f"; attention on a supporting fact {hit[0]:.0%} ({row} 1)" if hit else ""
        return self.summary_line(
            metrics,
            f"accuracy {metrics['accuracy']:.1%}",
            [("accuracy", "accuracy", ".1%")],
            hops,
        )

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--plot", help="write the first story's attention here")

    def predict(self, export_dir, inputs, args) -> None:
        from pipelines.qa.serving import step_labels

        pairs = [split_input(text) for text in inputs]
        out = self.call_pairs(export_dir, pairs, ("story", "question"))
        labels = step_labels(out)
        for text, answer, score, attention, sentences, rows in zip(
            inputs, out["answer"], out["score"], out["attention"], out["sentences"],
            labels, strict=True,
        ):  # fmt: skip
            self.print_answer(text, answer, f"probability {score:.3f}")
            for label, weights in zip(rows, attention[: len(rows)], strict=True):
                if weights.size and weights.max() > 0:
                    best = sentences[int(weights.argmax())].decode("utf-8")
                    print(f"     {label}: {weights.max():.2f} on {best!r}")
        if getattr(args, "plot", None):
            from pipelines.qa.evaluate import memory_attention_plot

            path = memory_attention_plot(
                out["sentences"][0],
                out["attention"][0],
                args.plot,
                columns=labels[0],
                title=f"{pairs[0][1]} -> {out['answer'][0].decode('utf-8')}",
            )
            print(f"Attention over the story: {path}")

    def demo_example(self, row) -> Example:
        given = shorten(f"{row['story']} / {row['question']}", keep="tail")
        return Example(given, row["answer"], row["predicted"])


def split_input(text: str) -> tuple[str, str]:
    """A ``predict`` input, the story's sentences then the question, as
    ``(story, question)``: the question is the last sentence.

    >>> split_input("Mary went to the garden. Where is Mary?")
    ('Mary went to the garden.', 'Where is Mary?')
    """
    sentences = split_story(text)
    if not sentences or not sentences[-1].endswith("?"):
        raise PipelineError(
            f"predict: each input is a story then a question ending in '?', "
            f"received {text[:80]!r}"
        )
    return "\n".join(sentences[:-1]), sentences[-1]
