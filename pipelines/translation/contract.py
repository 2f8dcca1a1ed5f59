"""The translation task's cases of the pipeline contract
(`tests/pipelines/contract.py`)."""

from __future__ import annotations

import numpy as np

from pipelines.core import contract_cases as cases
from pipelines.translation.serving import samples_for


class TranslationContract(cases.ContractCases):
    main_inputs = ("source",)
    source_format = "tsv"

    def requests(self, config) -> list[dict]:
        return cases.search_requests(
            {"source": cases.strings(*samples_for(config))},
            config.decode.beam_width,
            length_penalty=np.float32(0.5),
        )

    def bad_requests(self, config) -> list[cases.BadRequest]:
        text = samples_for(config)[0]

        def empty_translation(out):
            assert out["translation"][0] == b"" and out["length"][0] == 0
            assert out["score"][0] == 0.0 and not out["alignment"][0].any()
            assert out["length"][1] > 0

        def empty_batch(out):
            assert out["translation"].shape == (0,), out["translation"].shape
            assert out["score"].shape == (0,)

        return [
            *cases.search_option_cases(
                {"source": cases.strings(text)}, config.decode.beam_width
            ),
            cases.BadRequest(
                "empty string",
                {"source": cases.strings("", text)},
                check=empty_translation,
            ),
            *cases.string_input_cases({"source": text}, empty_batch),
        ]
