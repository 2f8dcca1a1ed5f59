"""The qa task's cases of the pipeline contract
(`tests/pipelines/contract.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.core.contract_cases import BadRequest, ContractCases, DataCase
from pipelines.qa.client import split_input
from pipelines.qa.data import samples_for


class QAContract(ContractCases):
    main_inputs = ("story", "question")

    def requests(self, config) -> list[dict]:
        pairs = [split_input(text) for text in samples_for(config)]
        questions = np.array([q for _, q in pairs], dtype=object)
        return [
            {
                "story": np.array([s for s, _ in pairs], dtype=object),
                "question": questions,
            },
            # Each story on one line: the graph splits its sentences.
            {
                "story": np.array([s.replace("\n", " ") for s, _ in pairs], object),
                "question": questions,
            },
        ]

    def bad_requests(self, config) -> list[BadRequest]:
        from pipelines.qa.serving import attention_rows

        story, question = split_input(samples_for(config)[0])

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

    def data(self, folder) -> dict[str, DataCase]:
        empty = Path(folder) / "empty.jsonl"
        empty.write_text("")
        return {
            "empty_file": DataCase([f"data.source=jsonl:{empty}"], str(empty)),
            "empty_valid": DataCase(["data.valid_fraction=0.0"]),
        }
