"""The summarization task's cases of the pipeline contract
(`tests/pipelines/contract.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.core.contract_cases import BadRequest, ContractCases, DataCase
from pipelines.summarization.serving import samples_for


class SummarizationContract(ContractCases):
    main_inputs = ("text",)

    def requests(self, config) -> list[dict]:
        texts = np.array(samples_for(config), dtype=object)
        greedy = {"beam_width": np.int32(1), "length_penalty": np.float32(0)}
        widest = {
            "beam_width": np.int32(config.decode.beam_width),
            "length_penalty": np.float32(1.0),
            "min_length": np.int32(config.tokenizer.max_target_tokens),
        }
        return [
            {"text": texts},
            {"text": texts, **greedy},
            {"text": texts[:1], **widest},
        ]

    def bad_requests(self, config) -> list[BadRequest]:
        text = np.array(samples_for(config)[:1], dtype=object)
        widest = config.decode.beam_width
        longest = config.tokenizer.max_target_tokens

        def empty_summary(out):
            assert out["summary"][0] == b"" and out["length"][0] == 0
            assert out["score"][0] == 0.0 and not out["attention"][0].any()
            assert not out["p_gen"][0].any()
            assert out["length"][1] > 0

        def empty_batch(out):
            assert out["summary"].shape == (0,), out["summary"].shape
            assert out["score"].shape == (0,) and out["p_gen"].shape[0] == 0

        def texts(*rows):
            return np.array(list(rows), dtype=object)

        def options(**values):
            return {"text": text, **values}

        penalty = "serving input `length_penalty`"
        beams = "serving input `beam_width`"
        shortest = "serving input `min_length`"
        vector = "serving input `text` must be a vector"
        return [
            BadRequest("nan", options(length_penalty=np.float32("nan")), penalty),
            BadRequest("inf", options(length_penalty=np.float32("inf")), penalty),
            BadRequest("negative", options(length_penalty=np.float32(-1)), penalty),
            BadRequest("beam 0", options(beam_width=np.int32(0)), beams),
            BadRequest("too wide", options(beam_width=np.int32(widest + 1)), beams),
            BadRequest("min length -1", options(min_length=np.int32(-1)), shortest),
            BadRequest(
                "min length too long",
                options(min_length=np.int32(longest + 1)),
                shortest,
            ),
            BadRequest(
                "beam vector",
                options(beam_width=np.array([1, 2], np.int32)),
                beams,
                python=False,
            ),
            BadRequest(
                "empty string", {"text": texts("", text[0])}, check=empty_summary
            ),
            BadRequest(
                "spaces", {"text": texts("  \t ", text[0])}, check=empty_summary
            ),
            BadRequest("empty batch", {"text": texts()}, check=empty_batch),
            BadRequest(
                "invalid utf-8",
                {"text": texts(b"ok", b"\xff\xfe")},
                "serving input `text` must be valid UTF-8",
            ),
            BadRequest(
                "rank 2", {"text": np.array([["a", "b"]], object)}, vector, python=False
            ),
            BadRequest("rank 0", {"text": np.array("a", object)}, vector, python=False),
        ]

    def data(self, folder) -> dict[str, DataCase]:
        empty = Path(folder) / "empty.tsv"
        empty.write_text("")
        return {
            "empty_file": DataCase([f"data.source=tsv:{empty}"], str(empty)),
            "empty_valid": DataCase(["data.valid_fraction=0.0"]),
        }
