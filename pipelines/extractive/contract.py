"""The extractive task's cases of the pipeline contract
(`tests/pipelines/contract.py`)."""

from __future__ import annotations

from pipelines.core import contract_cases as cases
from pipelines.extractive.client import split_input
from pipelines.extractive.data import samples_for


class ExtractiveContract(cases.ContractCases):
    main_inputs = ("context", "question")

    def requests(self, config) -> list[dict]:
        pairs = [split_input(text) for text in samples_for(config)]
        return [cases.paired_feed(self.main_inputs, pairs)]

    def bad_requests(self, config) -> list[cases.BadRequest]:
        context, question = split_input(samples_for(config)[0])
        samples = {"context": context, "question": question}

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
            *cases.blank_input_cases(samples, unanswered),
            cases.BadRequest(
                "no passage has a word",
                {"context": cases.strings(""), "question": cases.strings(question)},
                check=no_words,
            ),
            cases.BadRequest(
                "context longer than the model reads",
                {"context": cases.strings(many), "question": cases.strings(question)},
                check=long_passage,
            ),
            *cases.string_input_cases(samples, empty_batch),
        ]
