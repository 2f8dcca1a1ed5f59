"""The captioning task's cases of the pipeline contract
(`tests/pipelines/contract.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.captioning.data import sample_strips
from pipelines.core.contract_cases import BadRequest, ContractCases, DataCase


class CaptioningContract(ContractCases):
    main_inputs = ("image",)

    def requests(self, config) -> list[dict]:
        images = np.array([p.read_bytes() for p in sample_strips(config)], dtype=object)
        widest = config.decode.beam_width
        return [
            {"image": images},
            {"image": images, "beam_width": np.int32(1),
             "length_penalty": np.float32(0)},
            {"image": images[:1], "beam_width": np.int32(widest),
             "length_penalty": np.float32(0.5)},
        ]  # fmt: skip

    def bad_requests(self, config) -> list[BadRequest]:
        image = sample_strips(config)[0].read_bytes()
        widest = config.decode.beam_width
        rows = config.tokenizer.max_words + 1

        def files(*items):
            return np.array(list(items), dtype=object)

        def empty_batch(out):
            assert out["caption"].shape == (0,), out["caption"].shape
            assert out["attention"].shape[:2] == (0, rows), out["attention"].shape

        def jpeg_and_size(out):
            # The same strip as a JPEG twice its size is read like the PNG:
            # decoded, resized to the model's size, captioned.
            assert out["caption"].shape == (2,) and out["attention"].shape[1] == rows
            assert np.isfinite(out["score"]).all()

        not_image = "serving input `image` must hold PNG or JPEG files; row 1"
        penalty = "serving input `length_penalty`"
        beams = "serving input `beam_width`"

        def options(**values):
            return {"image": files(image), **values}

        return [
            BadRequest("empty file", {"image": files(image, b"")}, not_image),
            BadRequest("text", {"image": files(image, b"a caption, not an image")},
                       not_image),  # fmt: skip
            BadRequest("cut short", {"image": files(image, image[:-40])}, not_image),
            BadRequest("gif", {"image": files(image, b"GIF89a" + b"\0" * 40)},
                       not_image),  # fmt: skip
            BadRequest("jpeg, twice the size",
                       {"image": files(image, _jpeg_twice(image))},
                       check=jpeg_and_size),  # fmt: skip
            BadRequest("empty batch", {"image": files()}, check=empty_batch),
            BadRequest("nan", options(length_penalty=np.float32("nan")), penalty),
            BadRequest("negative", options(length_penalty=np.float32(-1)), penalty),
            BadRequest("beam 0", options(beam_width=np.int32(0)), beams),
            BadRequest("too wide", options(beam_width=np.int32(widest + 1)), beams),
            BadRequest("rank 2", {"image": np.array([[image]], object)},
                       "serving input `image` must be a vector", python=False),
            BadRequest("rank 0", {"image": np.array(image, object)},
                       "serving input `image` must be a vector", python=False),
        ]  # fmt: skip

    def data(self, folder) -> dict[str, DataCase]:
        folder = Path(folder) / "captions"
        folder.mkdir(parents=True, exist_ok=True)
        empty = folder / "captions.jsonl"
        empty.write_text("")
        return {
            "empty_file": DataCase([f"data.source=folder:{folder}"], str(empty)),
            "empty_valid": DataCase(["data.valid_size=0"]),
        }


def _jpeg_twice(png: bytes) -> bytes:
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(png))
    image = image.resize((image.width * 2, image.height * 2), Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()
