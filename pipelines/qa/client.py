"""The qa task's command-line side: its options, and how ``predict``
prints the export's answers."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipelines.core.baselines import in_brief
from pipelines.core.client import Client, Example, read_tsv, shorten
from pipelines.core.errors import PipelineError
from pipelines.qa.babi import split_story


class QAClient(Client):
    predict_aliases = ("answer",)

    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--heatmaps", type=int, default=3, help="attention plots")

    def evaluation_summary(self, metrics: dict) -> str:
        hit = metrics.get("attention_hit")
        row = metrics.get("attention_rows", "hop")
        hops = f"; attention on a supporting fact {hit[0]:.0%} ({row} 1)" if hit else ""
        return (
            f"accuracy {metrics['accuracy']:.1%} on the {metrics['split']} split"
            + in_brief(metrics, [("accuracy", "accuracy", ".1%")])
            + hops
        )

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--plot", help="write the first story's attention here")

    def predict(self, export_dir, inputs, args) -> None:
        from pipelines.core.serving import call_export
        from pipelines.qa.serving import step_labels

        pairs = [split_input(text) for text in inputs]
        out = call_export(
            export_dir,
            {
                "story": np.array([s for s, _ in pairs], dtype=object),
                "question": np.array([q for _, q in pairs], dtype=object),
            },
        )
        labels = step_labels(out)
        for text, answer, score, attention, sentences, rows in zip(
            inputs, out["answer"], out["score"], out["attention"], out["sentences"],
            labels, strict=True,
        ):  # fmt: skip
            print(f"{text}\n  -> {answer.decode('utf-8')}   (probability {score:.3f})")
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

    def demo_arguments(self, run_dir) -> list[str]:
        return ["--plot", str(Path(run_dir) / "attention.png")]

    def demo_notes(self, run_dir) -> list[str]:
        return [f"attention plot {Path(run_dir) / 'attention.png'}"]

    def demo_examples(self, run_dir, count) -> list[Example]:
        rows = read_tsv(Path(run_dir) / "answers.tsv", count)
        return [
            Example(shorten(f"{r['story']} / {r['question']}", keep="tail"),
                    r["answer"], r["predicted"])
            for r in rows
        ]  # fmt: skip


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
