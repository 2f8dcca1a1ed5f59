"""The summarization task's cases of the pipeline contract
(`tests/pipelines/contract.py`)."""

from __future__ import annotations

import numpy as np

from pipelines.core.contract_cases import (
    BadRequest,
    ContractCases,
    search_option_cases,
    search_requests,
    string_input_cases,
    strings,
)
from pipelines.summarization.serving import samples_for


class SummarizationContract(ContractCases):
    main_inputs = ("text",)
    source_format = "tsv"

    def requests(self, config) -> list[dict]:
        return search_requests(
            {"text": strings(*samples_for(config))},
            config.decode.beam_width,
            length_penalty=np.float32(1.0),
            min_length=np.int32(config.tokenizer.max_target_tokens),
        )

    def bad_requests(self, config) -> list[BadRequest]:
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
            return {"text": strings(text), **values}

        shortest = "serving input `min_length`"
        return [
            *search_option_cases({"text": strings(text)}, config.decode.beam_width),
            BadRequest("min length -1", options(min_length=np.int32(-1)), shortest),
            BadRequest(
                "min length too long",
                options(min_length=np.int32(longest + 1)),
                shortest,
            ),
            BadRequest(
                "empty string", {"text": strings("", text)}, check=empty_summary
            ),
            BadRequest("spaces", {"text": strings("  \t ", text)}, check=empty_summary),
            *string_input_cases({"text": text}, empty_batch),
        ]
