"""The translation task's cases of the pipeline contract
(`tests/pipelines/contract.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.core.contract_cases import BadRequest, ContractCases, DataCase
from pipelines.translation.serving import samples_for


class TranslationContract(ContractCases):
    main_inputs = ("source",)

    def requests(self, config) -> list[dict]:
        texts = np.array(samples_for(config), dtype=object)
        widest = config.decode.beam_width
        greedy = {"beam_width": np.int32(1), "length_penalty": np.float32(0)}
        widest = {"beam_width": np.int32(widest), "length_penalty": np.float32(0.5)}
        return [
            {"source": texts},
            {"source": texts, **greedy},
            {"source": texts[:1], **widest},
        ]

    def bad_requests(self, config) -> list[BadRequest]:
        text = np.array(samples_for(config)[:1], dtype=object)
        widest = config.decode.beam_width

        def empty_translation(out):
            assert out["translation"][0] == b"" and out["length"][0] == 0
            assert out["score"][0] == 0.0 and not out["alignment"][0].any()
            assert out["length"][1] > 0

        def empty_batch(out):
            assert out["translation"].shape == (0,), out["translation"].shape
            assert out["score"].shape == (0,)

        penalty = "serving input `length_penalty`"
        beams = "serving input `beam_width`"
        vector = "serving input `source` must be a vector"

        def source(*rows):
            return np.array(list(rows), dtype=object)

        def options(**values):
            return {"source": text, **values}

        return [
            BadRequest("nan", options(length_penalty=np.float32("nan")), penalty),
            BadRequest("inf", options(length_penalty=np.float32("inf")), penalty),
            BadRequest("negative", options(length_penalty=np.float32(-1)), penalty),
            BadRequest("beam 0", options(beam_width=np.int32(0)), beams),
            BadRequest("too wide", options(beam_width=np.int32(widest + 1)), beams),
            BadRequest(
                "beam vector",
                options(beam_width=np.array([1, 2], np.int32)),
                beams,
                python=False,
            ),
            BadRequest(
                "empty string", {"source": source("", text[0])}, check=empty_translation
            ),
            BadRequest("empty batch", {"source": source()}, check=empty_batch),
            BadRequest(
                "invalid utf-8",
                {"source": source(b"ok", b"\xff\xfe")},
                "serving input `source` must be valid UTF-8",
            ),
            BadRequest(
                "rank 2",
                {"source": np.array([["a", "b"]], object)},
                vector,
                python=False,
            ),
            BadRequest(
                "rank 0", {"source": np.array("a", object)}, vector, python=False
            ),
        ]

    def data(self, folder) -> dict[str, DataCase]:
        empty = Path(folder) / "empty.tsv"
        empty.write_text("")
        return {
            "empty_file": DataCase([f"data.source=tsv:{empty}"], str(empty)),
            "empty_valid": DataCase(["data.valid_fraction=0.0"]),
        }
