"""Request limits at the serving boundary (`pipelines.core.serving.RequestLimits`):
rows, bytes per string and pixels per image, checked in the served graph before
any work; beyond one the request is an ``InvalidArgument`` naming the input, the
limit and the value, and the next request is served. The limits are export
settings (outside the run's fingerprint) recorded in ``assets.extra/limits.json``.
"""

from __future__ import annotations

import io
import json
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from pipelines import registry
from pipelines.core.config import apply_overrides, fingerprint
from pipelines.core.errors import ConfigError
from pipelines.core.serving import LIMITS_FILE, RequestLimits, served_signatures

pytestmark = pytest.mark.tf_only

LIMITS = [
    "export.max_batch_rows=3",
    "export.max_string_bytes=200",
    "export.max_image_bytes=5000",
    "export.max_image_pixels=1000",
]


def untrained(name: str, overrides=()):
    """A task's tiny preset (with ``overrides``), its untrained model and
    serving module."""
    task = registry.get(name)
    config = apply_overrides(task.presets()["tiny"](), list(overrides))
    data = task.load_data(config)
    preprocessors = task.preprocessors(None, data, config, create=False)
    model = task.build_model(config, preprocessors)
    return config, data, task.serving_module(model, preprocessors, config)


def refused(fn, feed: dict, *parts: str) -> str:
    """The ``InvalidArgument`` message of ``fn(**feed)``, which must hold ``parts``."""
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        fn(**{k: tf.constant(v) for k, v in feed.items()})
    message = error.value.message
    for part in parts:
        assert part in message, (part, message[-600:])
    return message


def served(fn, feed: dict) -> dict:
    return {
        k: v.numpy()
        for k, v in fn(**{k: tf.constant(v) for k, v in feed.items()}).items()
    }


def png_declaring(height: int, width: int) -> bytes:
    """A PNG whose header declares ``height x width`` gray pixels and whose
    body holds four rows: a file any decoder would size by its header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    body = zlib.compress(bytes(width + 1) * 4)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", body)
        + chunk(b"IEND", b"")
    )


def jpeg_declaring(height: int, width: int) -> bytes:
    """A small JPEG whose frame header (SOF0) is rewritten to ``height x width``."""
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), "uint8")).save(buffer, format="JPEG")
    data = bytearray(buffer.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def peak_growth_mb(fn) -> float | None:
    """How far above the resident memory before ``fn()`` the process peaked
    (VmHWM, reset first); None where Linux's clear_refs is not writable."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        fn()
        return None
    before = _status_kb("VmRSS")
    fn()
    return (_status_kb("VmHWM") - before) / 1024


# -- settings -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["translation", "summarization", "qa", "extractive",
                                  "captioning"])  # fmt: skip
def test_limits_are_export_settings_outside_the_fingerprint(name):
    config = registry.get(name).presets()["tiny"]()
    limited = apply_overrides(config, LIMITS)
    assert fingerprint(limited) == fingerprint(config)
    assert RequestLimits.of(limited.export) == RequestLimits(3, 200, 5000, 1000)
    defaults = RequestLimits.of(config.export)
    assert defaults == RequestLimits(128, 65_536, 20 * 2**20, 40_000_000)
    with pytest.raises(ConfigError, match="export.max_batch_rows"):
        apply_overrides(config, ["export.max_batch_rows=0"])


# -- images: pixels read from the header, before decoding ----------------------------


@pytest.fixture(scope="module")
def captioner():
    # Greedy search only: the graph traces in a fraction of beam search's time.
    config, data, module = untrained(
        "captioning", ["decode.beam_width=1", "decode.default_beam_width=1"]
    )
    fn = module.signatures()["serving_default"]
    good = {"image": np.array([data.test[0].image], object)}
    return module, fn, good, served(fn, good)


@pytest.mark.parametrize("build", [png_declaring, jpeg_declaring], ids=["png", "jpeg"])
def test_an_image_declaring_too_many_pixels_is_refused_before_decoding(
    captioner, build
):
    """20000 x 20000 pixels (400 MP, 1.6 GB as float32) in a file of a few
    kB: refused from its header in well under a second, without the memory a
    decode takes; the next image is captioned as before."""
    module, fn, good, before = captioner
    bomb = {"image": np.array([good["image"][0], build(20000, 20000)], object)}
    start, messages = time.perf_counter(), []
    growth = peak_growth_mb(lambda: messages.append(refused(fn, bomb)))
    elapsed = time.perf_counter() - start
    expected_message = (
        "serving input `image` row 1 is an image of 20000 x 20000 pixels (height "
        "x width), 400000000 pixels; at most 40000000 are accepted "
        "(export.max_image_pixels)"
    )
    assert expected_message in messages[0], messages[0][-600:]
    assert module.max_pixels == 40_000_000  # export.max_image_pixels
    assert elapsed < 5.0, elapsed
    if growth is not None:
        assert growth < 150, f"{growth:.0f} MB above the resident memory"
    after = served(fn, good)
    np.testing.assert_array_equal(after["caption"], before["caption"])


def test_a_configured_pixel_limit_is_honoured_at_the_limit():
    from pipelines.captioning.config import ImageConfig
    from pipelines.captioning.images import decode_images

    def encoded(format: str) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(np.full((20, 50), 99, "uint8")).save(buffer, format=format)
        return buffer.getvalue()

    files = tf.constant([encoded("PNG"), encoded("JPEG")])  # 1000 pixels each
    image = ImageConfig()
    assert decode_images(files, image, max_pixels=1000).shape[0] == 2
    assert decode_images(files[:0], image, max_pixels=1).shape[0] == 0
    for row in (0, 1):
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            decode_images(files[row:], image, max_pixels=999)
        assert (
            "serving input `image` row 0 is an image of 20 x 50 pixels (height x "
            "width), 1000 pixels; at most 999 are accepted" in error.value.message
        )


# -- rows and bytes: every input of every signature ---------------------------------


@pytest.fixture(scope="module")
def answerer():
    """The question-answering task's untrained module (its graph traces fastest)."""
    return untrained("qa")


def _qa_feed(data, rows: int) -> dict:
    example = data.test[0]
    return {
        "story": np.array([" ".join(example.story)] * rows, object),
        "question": np.array([example.question] * rows, object),
    }


def test_rows_and_bytes_beyond_the_default_limits_are_refused(answerer):
    config, data, module = answerer
    signatures, _ = served_signatures(module, config.export)
    fn = signatures["serving_default"]
    good = _qa_feed(data, 2)
    expected = served(fn, good)
    refused(fn, _qa_feed(data, 129),
            "serving input `story` has 129 rows; a request may hold at most 128 "
            "(export.max_batch_rows)")  # fmt: skip
    long = {**good, "question": np.array(["x", "where? " * 10_000], object)}
    refused(fn, long,
            "serving input `question` row 1 has 70000 bytes; at most 65536 are "
            "accepted (export.max_string_bytes)")  # fmt: skip
    for key, value in served(fn, good).items():
        np.testing.assert_array_equal(value, expected[key], err_msg=key)


def test_configured_limits_are_served_and_recorded_by_the_export(answerer, tmp_path):
    from pipelines.core.export import publish

    config, data, module = answerer
    config = apply_overrides(config, LIMITS)
    signatures, files = served_signatures(module, config.export)
    path = publish(module, signatures, tmp_path, "qa", extra_files=files, audit=False)
    record = json.loads((path / "assets.extra" / LIMITS_FILE).read_text())
    assert record == {
        "max_batch_rows": 3,
        "text_inputs": ["question", "story"],
        "max_string_bytes": 200,
        "image_inputs": [],
    }
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    good = _qa_feed(data, 3)
    expected = served(fn, good)
    refused(fn, _qa_feed(data, 4), "`story` has 4 rows", "at most 3 (export.")
    long = {**good, "story": np.array(["", "", "a" * 201], object)}
    refused(fn, long, "`story` row 2 has 201 bytes; at most 200 are accepted")
    for key, value in served(fn, good).items():
        np.testing.assert_array_equal(value, expected[key], err_msg=key)


@pytest.mark.slow
def test_a_trained_run_takes_limits_at_export(tmp_path):
    """``export --set export.max_*=...`` on a trained run (outside its
    fingerprint): the export records and serves them."""
    from tests.pipelines.contract import cli

    run = tmp_path / "run"
    cli("qa", "train", "--config", "tiny", "--set", "train.epochs=1",
        "--set", "train.strategy=default", "--run-dir", run)  # fmt: skip
    limits = [
        "--set",
        "export.max_batch_rows=2",
        "--set",
        "export.max_string_bytes=300",
    ]
    cli("qa", "export", "--run-dir", run, "--base", tmp_path / "serving", *limits)
    path = tmp_path / "serving" / "run" / "1"
    record = json.loads((path / "assets.extra" / LIMITS_FILE).read_text())
    assert record["max_batch_rows"] == 2 and record["max_string_bytes"] == 300
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    _, data, _ = untrained("qa")
    refused(fn, _qa_feed(data, 3), "`story` has 3 rows; a request may hold at most 2")
    assert served(fn, _qa_feed(data, 2))["answer"].shape == (2,)
