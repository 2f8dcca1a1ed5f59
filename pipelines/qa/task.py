"""The question-answering task: what it supplies to the pipeline core.

Stories, questions and answers (`pipelines.qa.data`: bAbI-style tasks from
`pipelines.data.babi`, or the user's JSON Lines), one word vocabulary learned
from the training split and the answer list from the training and validation
splits, an end-to-end memory network
(`pipelines.qa.model.MemoryQA`), per-task accuracy with the supporting-fact
attention check (`pipelines.qa.evaluate`), and a `StoryAnswerer` export that
takes a story and a question as strings.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from pipelines.core.run_dir import PipelineError, read_json, write_json
from pipelines.core.task import BadRequest, Data, DataCase, Task
from pipelines.qa import config as qa_config

TOKENIZER, ANSWERS, ANSWERS_TSV = "tokenizer.json", "answers.json", "answers.tsv"
SAMPLES = [
    "Mary moved to the bathroom. John went to the hallway. Where is Mary?",
    "Daniel journeyed to the office. Sandra went back to the garden. "
    "Daniel travelled to the kitchen. Where is Daniel?",
    "John moved to the bedroom. Mary went to the hallway. Is John in the bedroom?",
]


def split_input(text: str) -> tuple[str, str]:
    """A ``predict`` input, the story's sentences then the question, as
    ``(story, question)``: the question is the last sentence.

    >>> split_input("Mary went to the garden. Where is Mary?")
    ('Mary went to the garden.', 'Where is Mary?')
    """
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n", text) if s.strip()]
    if not sentences or not sentences[-1].endswith("?"):
        raise PipelineError(
            f"predict: each input is a story then a question ending in '?', "
            f"received {text[:80]!r}"
        )
    return "\n".join(sentences[:-1]), sentences[-1]


class QATask(Task):
    name = "qa"
    description = "question answering: multi-hop memory network, story and question in"
    default_preset = "babi"
    run_files = (TOKENIZER, ANSWERS, ANSWERS_TSV, "attention.png")
    evaluate_files = (ANSWERS_TSV, "plots/attention_0.png")
    predict_aliases = ("answer",)

    def presets(self):
        return qa_config.PRESETS

    # -- data ---------------------------------------------------------------
    def load_data(self, config) -> Data:
        from pipelines.qa.data import load_data

        return load_data(config)

    def preprocessors(self, run, data, config, create):
        from pipelines.core.text import WordTokenizer, load_tokenizer
        from pipelines.qa.data import Preprocessors

        if run is not None and all((run / f).exists() for f in (TOKENIZER, ANSWERS)):
            return Preprocessors(
                load_tokenizer(run / TOKENIZER), read_json(run / ANSWERS)
            )
        if data is None and run is None:
            raise ValueError("preprocessors: give a run folder or data to learn from.")
        if data is None:
            raise PipelineError(
                f"{run.root} has no {TOKENIZER}: train a model there first "
                "(`attention-pipelines qa train`)."
            )
        texts = sorted({s for e in data.train for s in (*e.story, e.question)})
        tokenizer = WordTokenizer.learn(texts, config.tokenizer.vocab_size)
        # The valid answers too, so that validation can score them; the test
        # split's are never learned.
        answers = sorted({e.answer for e in data.train + data.valid})
        if create and run is not None:
            tokenizer.save(run / TOKENIZER)
            write_json(run / ANSWERS, answers)
        return Preprocessors(tokenizer, answers)

    def summary(self, data, preprocessors, config) -> str:
        lines = [super().summary(data, preprocessors, config)]
        lines.append(
            f"vocabulary: {preprocessors.tokenizer.vocab_size} words; "
            f"{len(preprocessors.answers)} answers"
        )
        unseen = {e.answer for e in data.test} - set(preprocessors.answers)
        if unseen:
            lines.append(
                f"{len(unseen)} test answers are not among the training and validation "
                "answers (always wrong)"
            )
        return "\n".join(lines)

    def make_dataset(self, examples, preprocessors, config, training, replicas=1):
        from pipelines.qa.data import make_dataset

        return make_dataset(examples, preprocessors, config, training, replicas)

    # -- model --------------------------------------------------------------
    def build_model(self, config, preprocessors):
        from pipelines.qa.model import GenerativeQA, MemoryQA

        if config.model.architecture == "encoder_decoder":
            from pipelines.core.text import RESERVED

            return GenerativeQA(
                config,
                preprocessors.tokenizer.vocab_size,
                len(RESERVED) + len(preprocessors.answer_words),
            )
        return MemoryQA(config, preprocessors.vocab_size)

    def compile_arguments(self, config) -> dict:
        import keras

        if config.model.architecture == "encoder_decoder":
            from pipelines.core.metrics import teacher_forcing_arguments

            return teacher_forcing_arguments()
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if config.model.supervision_weight > 0:
            # The attention output carries the supervision loss only; Keras
            # 3.15's metrics then ask for an "attention" target (KeyError),
            # so a supervised run reports losses and no accuracy while it trains.
            return {"loss": {"answer": loss}}
        return {"loss": loss, "metrics": ["accuracy"]}

    def phases(self, config) -> tuple[int, ...]:
        """With ``model.linear_start_epochs``, the softmax phase begins after
        the linear start (which may stop early on the validation loss)."""
        first = config.model.linear_start_epochs
        return (first,) if 0 < first < config.train.epochs else ()

    def start_phase(self, model, config, phase) -> None:
        if config.model.linear_start_epochs:
            linear = phase == 0  # the whole run if it is not longer
            model.memory.set_linear_start(linear)
            print("Linear start: no softmax in the hops" if linear else "Softmax on")

    # -- evaluation ---------------------------------------------------------
    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--heatmaps", type=int, default=3, help="attention plots")

    def evaluate(self, run, model, preprocessors, config, examples, args) -> dict:
        from pipelines.qa.evaluate import evaluate

        answerer = self.serving_module(model, preprocessors, config)
        return evaluate(
            run.root, answerer, config, list(examples), args.split,
            getattr(args, "heatmaps", 3),
        )  # fmt: skip

    def evaluation_summary(self, metrics: dict) -> str:
        hit = metrics.get("attention_hit")
        row = metrics.get("attention_rows", "hop")
        hops = f"; attention on a supporting fact {hit[0]:.0%} ({row} 1)" if hit else ""
        return (
            f"accuracy {metrics['accuracy']:.1%} on the {metrics['split']} split{hops}"
        )

    # -- serving ------------------------------------------------------------
    def serving_module(self, model, preprocessors, config):
        from pipelines.qa.serving import StoryAnswerer

        samples = [split_input(text) for text in self.samples(config)]
        return StoryAnswerer(model, preprocessors, config, samples)

    def samples(self, config) -> list[str]:
        kind, _, path = config.data.source.partition(":")
        if kind == "babi":
            from pipelines.data.babi import parse_babi_spec

            tasks, _ = parse_babi_spec(config.data.source)
            return list(SAMPLES if 6 in tasks else SAMPLES[:2])  # [2]: yes/no
        if kind == "babi-text":
            from pipelines.data.babi_text import load_babi_files

            first = load_babi_files(path)[2][:3]  # the first test questions
        else:
            from pipelines.data.babi import read_qa_jsonl

            first = read_qa_jsonl(path)[:3]
        examples = [e for e in first if e.question.endswith("?")]
        texts = ["\n".join((*e.story, e.question)) for e in examples]
        return texts or list(SAMPLES)

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

    # -- the pipeline contract ----------------------------------------------
    def contract_requests(self, config) -> list[dict]:
        pairs = [split_input(text) for text in self.samples(config)]
        return [
            {
                "story": np.array([s for s, _ in pairs], dtype=object),
                "question": np.array([q for _, q in pairs], dtype=object),
            }
        ]

    def bad_requests(self, config) -> list[BadRequest]:
        from pipelines.qa.serving import attention_rows

        story, question = split_input(self.samples(config)[0])

        def strings(*rows):
            return np.array(list(rows), dtype=object)

        def unanswered(out):
            assert out["answer"][0] == b"" and out["score"][0] == 0.0
            assert not out["attention"][0].any()
            assert out["answer"][1] != b"" and out["score"][1] > 0.0

        def empty_batch(out):
            assert out["answer"].shape == (0,) and out["score"].shape == (0,)
            assert out["attention"].shape[:2] == (0, attention_rows(config))

        def long_story(out):
            attention = out["attention"][0]
            read = config.model.max_memories
            assert attention.shape[-1] == read + 5
            assert not attention[:, :5].any()  # the oldest sentences are not read
            if config.model.architecture == "encoder_decoder":
                # The first step reads the story; the question takes the rest.
                assert 0.0 < attention[0, 5:].sum() <= 1.0 + 1e-5
            else:
                np.testing.assert_allclose(attention[:, 5:].sum(-1), 1.0, rtol=1e-5)

        lines = story.split("\n")
        many = "\n".join(
            lines[i % len(lines)] for i in range(config.model.max_memories + 5)
        )
        vector = "serving input `story` must be a vector"
        return [
            BadRequest(
                "empty story",
                {
                    "story": strings(" \n ", story),
                    "question": strings(question, question),
                },
                check=unanswered,
            ),
            BadRequest(
                "empty question",
                {"story": strings(story, story), "question": strings("", question)},
                check=unanswered,
            ),
            BadRequest(
                "empty batch",
                {"story": strings(), "question": strings()},
                check=empty_batch,
            ),
            BadRequest(
                "story longer than the memory",
                {"story": strings(many), "question": strings(question)},
                check=long_story,
            ),
            BadRequest(
                "batch sizes differ",
                {"story": strings(story, story), "question": strings(question)},
                "must have the same batch size",
            ),
            BadRequest(
                "invalid utf-8 story",
                {"story": strings(b"\xff"), "question": strings(question)},
                "serving input `story` must be valid UTF-8",
            ),
            BadRequest(
                "invalid utf-8 question",
                {"story": strings(story), "question": strings(b"ok\xfe")},
                "serving input `question` must be valid UTF-8",
            ),
            BadRequest(
                "rank 2",
                {"story": np.array([[story]], object), "question": strings(question)},
                vector,
                python=False,
            ),
            BadRequest(
                "rank 0",
                {"story": strings(story), "question": np.array(question, object)},
                "serving input `question` must be a vector",
                python=False,
            ),
        ]

    def contract_data(self, folder) -> dict[str, DataCase]:
        empty = Path(folder) / "empty.jsonl"
        empty.write_text("")
        return {
            "empty_file": DataCase([f"data.source=jsonl:{empty}"], str(empty)),
            "empty_valid": DataCase(["data.valid_fraction=0.0"]),
        }


TASK = QATask()
