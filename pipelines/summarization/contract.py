"""The summarization task's cases of the pipeline contract
(`tests/pipelines/contract.py`)."""

from __future__ import annotations

import numpy as np

from pipelines.core import contract_cases as cases
from pipelines.summarization.serving import samples_for


class SummarizationContract(cases.ContractCases):
    main_inputs = ("text",)
    source_format = "tsv"

    def requests(self, config) -> list[dict]:
        return cases.search_requests(
            {"text": cases.strings(*samples_for(config))},
            config.decode.beam_width,
            length_penalty=np.float32(1.0),
            min_length=np.int32(config.tokenizer.max_target_tokens),
        )

    def bad_requests(self, config) -> list[cases.BadRequest]:
        text = samples_for(config)[0]
        longest = config.tokenizer.max_target_tokens

        def empty_summary(out):
            assert out["summary"][0] == b"" and out["length"][0] == 0
            assert out["score"][0] == 0.0 and not out["attention"][0].any()
            assert not out["p_gen"][0].any()
            assert out["length"][1] > 0

        def empty_batch(out):
            assert out["summary"].shape == (0,), out["summary"].shape
            assert out["score"].shape == (0,) and out["p_gen"].shape[0] == 0

        def options(**values):
            return {"text": cases.strings(text), **values}

        shortest = "serving input `min_length`"
        return [
            *cases.search_option_cases(
                {"text": cases.strings(text)}, config.decode.beam_width
            ),
            cases.BadRequest(
                "min length -1", options(min_length=np.int32(-1)), shortest
            ),
            cases.BadRequest(
                "min length too long",
                options(min_length=np.int32(longest + 1)),
                shortest,
            ),
            cases.BadRequest(
                "empty string", {"text": cases.strings("", text)}, check=empty_summary
            ),
            cases.BadRequest(
                "spaces", {"text": cases.strings("  \t ", text)}, check=empty_summary
            ),
            *cases.string_input_cases({"text": text}, empty_batch),
        ]
