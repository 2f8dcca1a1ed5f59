"""The extractive task's cases of the pipeline contract
(`tests/pipelines/contract.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.core.contract_cases import BadRequest, ContractCases, DataCase
from pipelines.extractive.client import split_input
from pipelines.extractive.data import samples_for


class ExtractiveContract(ContractCases):
    main_inputs = ("context", "question")

    def requests(self, config) -> list[dict]:
        pairs = [split_input(text) for text in samples_for(config)]
        return [
            {
                "context": np.array([c for c, _ in pairs], dtype=object),
                "question": np.array([q for _, q in pairs], dtype=object),
            }
        ]

    def bad_requests(self, config) -> list[BadRequest]:
        context, question = split_input(samples_for(config)[0])

        def strings(*rows):
            return np.array(list(rows), dtype=object)

        def unanswered(out):
            assert out["answer"][0] == b"" and out["score"][0] == 0.0
            assert out["start"][0] == 0 and out["end"][0] == 0
            assert out["score"][1] > 0.0

        def no_words(out):
            assert out["answer"].tolist() == [b""] and out["score"].tolist() == [0.0]
            assert out["start"].tolist() == [0] and out["end"].tolist() == [0]

        def empty_batch(out):
            for key in ("answer", "start", "end", "score"):
                assert out[key].shape == (0,), (key, out[key].shape)

        def long_passage(out):
            from pipelines.extractive.tokenizer import SpanTokenizer

            # Only the first tokenizer.max_context_tokens tokens are read.
            start, end = int(out["start"][0]), int(out["end"][0])
            assert 0 <= start < end
            assert many[start:end] == out["answer"][0].decode()
            tokens = SpanTokenizer.split([many[:end]])[0]
            assert tokens.row_lengths()[0] <= config.tokenizer.max_context_tokens

        many = " ".join([context] * (config.tokenizer.max_context_tokens // 4 + 1))
        return [
            BadRequest(
                "empty context",
                {
                    "context": strings(" \n ", context),
                    "question": strings(question, question),
                },
                check=unanswered,
            ),
            BadRequest(
                "no passage has a word",
                {"context": strings(""), "question": strings(question)},
                check=no_words,
            ),
            BadRequest(
                "empty question",
                {
                    "context": strings(context, context),
                    "question": strings("", question),
                },
                check=unanswered,
            ),
            BadRequest(
                "empty batch",
                {"context": strings(), "question": strings()},
                check=empty_batch,
            ),
            BadRequest(
                "context longer than the model reads",
                {"context": strings(many), "question": strings(question)},
                check=long_passage,
            ),
            BadRequest(
                "batch sizes differ",
                {"context": strings(context, context), "question": strings(question)},
                "must have the same batch size",
            ),
            BadRequest(
                "invalid utf-8 context",
                {"context": strings(b"\xff"), "question": strings(question)},
                "serving input `context` must be valid UTF-8",
            ),
            BadRequest(
                "invalid utf-8 question",
                {"context": strings(context), "question": strings(b"ok\xfe")},
                "serving input `question` must be valid UTF-8",
            ),
            BadRequest(
                "rank 2",
                {
                    "context": np.array([[context]], object),
                    "question": strings(question),
                },
                "serving input `context` must be a vector",
                python=False,
            ),
            BadRequest(
                "rank 0",
                {"context": strings(context), "question": np.array(question, object)},
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
