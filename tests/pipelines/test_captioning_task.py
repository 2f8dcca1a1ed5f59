"""The captioning task's own parts: digit strips and their boxes, image bytes
decoded in the graph, the user's folder, the batches, the metrics, and the
export against the teacher-forced model. The task's pipeline contract runs
in tests/pipelines/test_contract.py."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from pipelines.captioning import data as captioning_data
from pipelines.captioning.config import ImageConfig, preset
from pipelines.captioning.evaluate import caption_bleu, peak_hits
from pipelines.captioning.images import decode_images
from pipelines.captioning.task import TASK
from pipelines.core.config import ConfigError, apply_overrides
from pipelines.core.run_dir import PipelineError
from pipelines.core.text import END, PAD, START
from pipelines.data.digit_strips import (
    WORDS,
    _scans,
    make_strips,
    png_bytes,
    source_split,
)

pytestmark = pytest.mark.tf_only


def encoded(image: np.ndarray, format: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=format, **kwargs)
    return buffer.getvalue()


# -- digit strips ---------------------------------------------------------------------


def test_strips_are_fixed_by_their_seed_and_their_boxes_hold_the_digits():
    strips = make_strips(50, "train", seed=3)
    again = make_strips(50, "train", seed=3)
    assert [s.caption for s in strips] == [s.caption for s in again]
    assert all(
        np.array_equal(a.image, b.image) for a, b in zip(strips, again, strict=True)
    )
    images, labels = _scans()
    for strip in strips:
        words = strip.caption.split()
        assert 1 <= len(words) <= 5 and len(words) == len(strip.boxes)
        assert words == [WORDS[labels[s]] for s in strip.sources]
        ink = strip.image > 0
        covered = np.zeros_like(ink)
        lefts = [box[1] for box in strip.boxes]
        assert lefts == sorted(lefts)  # left to right, the caption's order
        for top, left, bottom, right in strip.boxes:
            assert 0 <= top < bottom <= 32 and 0 <= left < right <= 96
            assert bottom - top == right - left and 12 <= bottom - top <= 18
            assert ink[top:bottom, left:right].any()  # the digit is in its box
            covered[top:bottom, left:right] = True
        assert not (ink & ~covered).any()  # and no ink lies outside the boxes
        # PNG is lossless: the bytes decode to the same pixels.
        decoded = np.asarray(Image.open(io.BytesIO(strip.png())))
        np.testing.assert_array_equal(decoded, strip.image)
    assert len({s.caption for s in strips}) > 40


def test_held_out_strips_use_held_out_scans_only():
    split = source_split()
    assert sum(len(v) for v in split.values()) == len(_scans()[1])
    assert not set(split["train"]) & (set(split["valid"]) | set(split["test"]))
    assert not set(split["valid"]) & set(split["test"])
    test = make_strips(200, "test", seed=0)
    assert {s for strip in test for s in strip.sources} <= set(split["test"])
    train = make_strips(200, "train", seed=0)
    assert {s for strip in train for s in strip.sources} <= set(split["train"])


def test_strip_settings_that_cannot_fit_are_refused():
    with pytest.raises(ValueError, match="cannot hold 5 digits of 18 pixels"):
        make_strips(1, "train", seed=0, width=64)
    with pytest.raises(ValueError, match="split must be one of"):
        make_strips(1, "dev", seed=0)
    with pytest.raises(ValueError, match="max_size <= height"):
        make_strips(1, "train", seed=0, height=10)


# -- image bytes ----------------------------------------------------------------------


def test_png_jpeg_gray_and_rgb_decode_to_the_model_size():
    gray = make_strips(1, "test", seed=0)[0].image  # 32 x 96
    image = ImageConfig(height=32, width=96)
    out = decode_images(tf.constant([png_bytes(gray)]), image).numpy()
    np.testing.assert_allclose(out[0, ..., 0], gray / 255.0, rtol=1e-6)  # not resized
    rgb = np.stack([gray] * 3, -1)
    jpeg = encoded(rgb, "JPEG", quality=98)
    twice = encoded(np.kron(gray, np.ones((2, 2), "uint8")), "PNG")
    out = decode_images(tf.constant([jpeg, encoded(rgb, "PNG"), twice]), image).numpy()
    assert out.shape == (3, 32, 96, 1)
    np.testing.assert_allclose(out[1, ..., 0], gray / 255.0, atol=1 / 255)  # RGB->gray
    assert np.abs(out[0] - out[1]).mean() < 0.02  # JPEG: close, not equal
    assert np.abs(out[2] - out[1]).mean() < 0.03  # resized from twice the size
    colour = decode_images(tf.constant([jpeg]), ImageConfig(32, 96, 3)).numpy()
    assert colour.shape == (1, 32, 96, 3)
    empty = decode_images(tf.constant([], tf.string), image)
    assert tuple(empty.shape) == (0, 32, 96, 1)


@pytest.mark.parametrize(
    "bad",
    [b"", b"caption text", b"GIF89a" + b"\0" * 40, "png cut", "jpeg cut"],
)
def test_a_bad_row_is_named(bad):
    gray = make_strips(1, "test", seed=0)[0].image
    good = png_bytes(gray)
    if bad == "png cut":
        bad = good[:-30]
    elif bad == "jpeg cut":
        bad = encoded(gray, "JPEG")[:200]
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 2 is not one"):
        decode_images(tf.constant([good, good, bad]), ImageConfig())
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be a vector"):
        decode_images(tf.constant([[good]]), ImageConfig())


# -- the user's folder ----------------------------------------------------------------


def user_folder(tmp_path, n=10, csv=False):
    strips = make_strips(n, "train", seed=5)
    rows = []
    for i, strip in enumerate(strips):
        name = f"img_{i}.png"
        (tmp_path / name).write_bytes(strip.png())
        rows.append(
            {"image": name, "captions": [strip.caption, f"digits {strip.caption}"]}
        )
    if csv:
        lines = ["image,caption"] + [
            f"{r['image']},{c}" for r in rows for c in r["captions"]
        ]
        (tmp_path / "captions.csv").write_text("\n".join(lines) + "\n")
    else:
        (tmp_path / "captions.jsonl").write_text(
            "\n".join(json.dumps(r) for r in rows) + "\n"
        )
    return strips


@pytest.mark.parametrize("csv", [False, True])
def test_a_user_folder_keeps_every_caption_of_an_image_together(tmp_path, csv):
    strips = user_folder(tmp_path, n=30, csv=csv)
    config = apply_overrides(
        preset("tiny"), [f"data.source=folder:{tmp_path}", "data.valid_fraction=0.2",
                         "data.test_fraction=0.2"],
    )  # fmt: skip
    data = TASK.load_data(config)
    everything = data.train + data.valid + data.test
    assert len(everything) == 30 and data.valid and data.test
    by_name = {e.name: e for e in everything}
    for i, strip in enumerate(strips):
        example = by_name[f"img_{i}.png"]
        assert example.captions == (strip.caption, f"digits {strip.caption}")
        assert example.image == strip.png()
    names = [{e.name for e in part} for part in (data.train, data.valid, data.test)]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
    samples = TASK.samples(config)
    assert samples == [str(tmp_path / f"img_{i}.png") for i in range(3)]


def test_a_bad_user_folder_is_named(tmp_path):
    def load(folder):
        config = apply_overrides(preset("tiny"), [f"data.source=folder:{folder}"])
        return TASK.load_data(config)

    with pytest.raises(PipelineError, match="has neither captions.jsonl"):
        load(tmp_path)
    (tmp_path / "captions.jsonl").write_text('{"image": "a.png", "caption": "one"}\n')
    with pytest.raises(PipelineError, match="names a.png, which is not in"):
        load(tmp_path)
    (tmp_path / "a.png").write_bytes(b"not an image at all")
    with pytest.raises(PipelineError, match="a.png is not a PNG or JPEG image"):
        load(tmp_path)
    (tmp_path / "captions.jsonl").write_text('{"image": "a.png", "caption": ""}\n')
    with pytest.raises(PipelineError, match="line 1: `caption` must be a non-empty"):
        load(tmp_path)
    (tmp_path / "captions.jsonl").write_text("{not json\n")
    with pytest.raises(PipelineError, match="line 1: not JSON"):
        load(tmp_path)
    with pytest.raises(ConfigError, match="digits:N"):
        TASK.load_data(apply_overrides(preset("tiny"), ["data.source=mnist"]))
    with pytest.raises(ConfigError, match="multiples of 2"):
        apply_overrides(preset("tiny"), ["image.height=17"])


# -- batches and metrics --------------------------------------------------------------


def test_batches_decode_the_images_and_mark_the_captions():
    config = apply_overrides(preset("tiny"), ["train.batch_size=4"])
    data = TASK.load_data(config)
    tokenizer = TASK.preprocessors(None, data, config, create=False)
    examples = data.train[:10]
    batches = list(TASK.make_dataset(examples, tokenizer, config, training=False))
    assert [int(b[1].shape[0]) for b in batches] == [4, 4, 2]
    features, target_out = batches[0]
    assert features["image"].shape == (4, 16, 48, 1)
    assert features["target_in"].shape == (4, 6) and target_out.shape == (4, 6)
    for row in range(4):
        ids = tokenizer.tokenize(tf.constant([examples[row].caption]))[0].numpy()
        n = len(ids)
        assert features["target_in"][row].numpy().tolist() == (
            [START, *ids] + [PAD] * (5 - n)
        )
        assert target_out[row].numpy().tolist() == [*ids, END] + [PAD] * (5 - n)
        pixels = np.asarray(Image.open(io.BytesIO(examples[row].image))) / 255.0
        np.testing.assert_allclose(features["image"][row, ..., 0], pixels, atol=1e-6)
    # Two replicas: every batch a multiple of two, a one-row batch dropped.
    two = list(TASK.make_dataset(examples[:9], tokenizer, config, True, replicas=2))
    assert [int(b[1].shape[0]) for b in two] == [4, 4]
    data2 = TASK.make_dataset(examples[:9], tokenizer, config, True, replicas=2)
    assert int(data2.cardinality()) == 2


def test_bleu_takes_every_reference_and_peaks_are_checked_against_boxes():
    # The first image's caption matches its second reference only.
    hypotheses = ["one two three four", "five six seven eight nine"]
    references = [("one two three", "one two three four"),
                  ("five six seven eight nine",)]  # fmt: skip
    scores = caption_bleu(hypotheses, references)
    assert scores["bleu"] == 100.0 and "lc" in scores["bleu_signature"]
    assert caption_bleu([h.upper() for h in hypotheses], references)["bleu"] == 100.0
    assert caption_bleu(hypotheses, [r[:1] for r in references])["bleu"] < 100.0
    # A 2 x 4 grid over an 8 x 16 image: cells of 4 x 4 pixels.
    attention = np.zeros((3, 2, 4))
    attention[0, 0, 1] = 1.0  # centre (2, 6): inside box 0
    attention[1, 1, 3] = 1.0  # centre (6, 14): outside box 1
    attention[2, 0, 0] = 1.0
    boxes = [(0, 4, 8, 8), (0, 8, 8, 12), (0, 0, 4, 4)]
    hits = peak_hits(attention, ["one", "two", "six"], ["one", "two", "three"],
                     boxes, (8, 16))  # fmt: skip
    assert hits == [True, False, None]  # the wrong word is not graded
    assert peak_hits(attention, ["one"], ["one"], None, (8, 16)) == [None]


# -- the export against the model -----------------------------------------------------


@pytest.fixture(scope="module")
def untrained():
    config = preset("tiny")
    data = TASK.load_data(config)
    tokenizer = TASK.preprocessors(None, data, config, create=False)
    model = TASK.build_model(config, tokenizer)
    module = TASK.serving_module(model, tokenizer, config)
    return config, data, tokenizer, model, module


def test_served_captions_follow_the_teacher_forced_model(untrained):
    """The export's greedy words are the argmax of the model fed the decoded
    image and the words before; its attention rows are the decoder's
    alignments, row-major over the grid, zero after [END]."""
    config, data, tokenizer, model, module = untrained
    examples = data.test[:6]
    fn = module.signatures()["serving_default"]
    out = fn(image=tf.constant([e.image for e in examples]),
             beam_width=tf.constant(1), length_penalty=tf.constant(0.0))  # fmt: skip
    out = {k: v.numpy() for k, v in out.items()}
    pixels = decode_images(tf.constant([e.image for e in examples]), config.image)
    rows = config.tokenizer.max_words + 1
    grid = model.grid
    assert out["attention"].shape == (6, rows, *grid)
    encoded = model.encode(pixels)
    for b in range(6):
        length = int(out["length"][b])
        words = [w.decode() for w in out["words"][b]]
        ids = [START]
        for t in range(length):
            logits = model.trainer({"image": pixels[b : b + 1],
                                    "target_in": tf.constant([ids])})  # fmt: skip
            best = int(np.argmax(logits[0, -1]))
            expected = "[END]" if best == END else tokenizer.id_to_token(
                tf.constant([best])).numpy()[0].decode()  # fmt: skip
            assert words[t] == expected, (b, t, words)
            ids.append(best)
        _, alignments = model.decoder(
            model.embedding(tf.constant([ids[:length]])),
            encoded["memory"][b : b + 1],
            initial_state=[encoded["state"][b : b + 1]],
            return_attention_scores=True,
        )
        np.testing.assert_allclose(
            out["attention"][b, :length].reshape(length, -1), alignments[0],
            rtol=1e-4, atol=1e-6,
        )  # fmt: skip
        assert not out["attention"][b, length:].any() and not any(words[length:])
        np.testing.assert_allclose(out["attention"][b, :length].sum((1, 2)), 1.0,
                                   rtol=1e-5)  # fmt: skip
        written = [w for w in words if w and w != "[END]"]
        assert out["caption"][b].decode() == " ".join(written)


def test_greedy_and_beam_decoding_return_the_same_fields(untrained):
    config, data, _, _, module = untrained
    images = tf.constant([e.image for e in data.test[:3]])
    fn = module.signatures()["serving_default"]
    greedy = fn(
        image=images, beam_width=tf.constant(1), length_penalty=tf.constant(0.0)
    )
    beam = fn(image=images, beam_width=tf.constant(3), length_penalty=tf.constant(0.0))
    assert (
        sorted(greedy)
        == sorted(beam)
        == ["attention", "caption", "length", "score", "words"]
    )
    for key in greedy:
        assert greedy[key].shape == beam[key].shape, key
    # Beam search finds a caption at least as likely as greedy's.
    assert np.all(beam["score"].numpy() >= greedy["score"].numpy() - 1e-4)
    assert captioning_data.is_image(data.test[0].image)
