"""The translation task's cases of the pipeline contract
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
from pipelines.translation.serving import samples_for


class TranslationContract(ContractCases):
    main_inputs = ("source",)
    source_format = "tsv"

    def requests(self, config) -> list[dict]:
        return search_requests(
            {"source": strings(*samples_for(config))},
            config.decode.beam_width,
            length_penalty=np.float32(0.5),
        )

    def bad_requests(self, config) -> list[BadRequest]:
        text = samples_for(config)[0]

        def empty_translation(out):
            assert out["translation"][0] == b"" and out["length"][0] == 0
            assert out["score"][0] == 0.0 and not out["alignment"][0].any()
            assert out["length"][1] > 0

        def empty_batch(out):
            assert out["translation"].shape == (0,), out["translation"].shape
            assert out["score"].shape == (0,)

        return [
            *search_option_cases({"source": strings(text)}, config.decode.beam_width),
            BadRequest(
                "empty string", {"source": strings("", text)}, check=empty_translation
            ),
            *string_input_cases({"source": text}, empty_batch),
        ]
