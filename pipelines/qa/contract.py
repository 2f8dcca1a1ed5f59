"""The qa task's cases of the pipeline contract
(`tests/pipelines/contract.py`)."""

from __future__ import annotations

import numpy as np

from pipelines.core import contract_cases as cases
from pipelines.qa.client import split_input
from pipelines.qa.data import samples_for


class QAContract(cases.ContractCases):
    main_inputs = ("story", "question")

    def requests(self, config) -> list[dict]:
        pairs = [split_input(text) for text in samples_for(config)]
        # Each story on one line too: the graph splits its sentences.
        flat = [(s.replace("\n", " "), q) for s, q in pairs]
        return [cases.paired_feed(self.main_inputs, p) for p in (pairs, flat)]

    def bad_requests(self, config) -> list[cases.BadRequest]:
        from pipelines.qa.serving import attention_rows

        story, question = split_input(samples_for(config)[0])
        samples = {"story": story, "question": question}

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
        return [
            *cases.blank_input_cases(samples, unanswered),
            cases.BadRequest(
                "story longer than the memory",
                {"story": cases.strings(many), "question": cases.strings(question)},
                check=long_story,
            ),
            *cases.string_input_cases(samples, empty_batch),
        ]
