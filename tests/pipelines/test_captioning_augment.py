"""Captioning's training augmentation and its robustness evaluation: the
boxes follow the pixels, nothing is augmented outside training, the layouts
are what they say, and the evaluation reproduces a known layout's numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipelines.captioning import robustness
from pipelines.captioning.augment import Augmenter, on_edge, zoom_factors
from pipelines.captioning.config import AugmentConfig, preset
from pipelines.captioning.data import Example, load_data, make_dataset, padded_boxes
from pipelines.captioning.digit_strips import png_bytes
from pipelines.core.config import apply_overrides
from pipelines.core.errors import ConfigError
from pipelines.core.text import WordTokenizer

pytestmark = pytest.mark.tf_only

AUGMENT = ["data.augment.scale=0.5", "data.augment.shift=0.1",
           "data.augment.contrast=0.5", "data.augment.jpeg_quality=30"]  # fmt: skip


def squares(n=64, seed=0):
    """White squares on black, each image's box exactly its square."""
    rng = np.random.default_rng(seed)
    images = np.zeros((n, 24, 72, 1), "float32")
    boxes = np.zeros((n, 2, 4), "float32")
    for i in range(n):
        for k in range(2):
            s = int(rng.integers(6, 12))
            top, left = (
                int(rng.integers(1, 23 - s)),
                int(rng.integers(1, 35 - s)) + 36 * k,
            )
            images[i, top : top + s, left : left + s] = 1.0
            boxes[i, k] = (top, left, top + s, left + s)
    return images, boxes


def ink_box(image, box):
    """The bright pixels' extent inside ``box`` grown by 2 pixels."""
    top, left, bottom, right = (int(v) for v in np.round(box))
    top, left = max(top - 2, 0), max(left - 2, 0)
    patch = image[top : bottom + 2, left : right + 2, 0] > 0.5
    rows, cols = np.nonzero(patch)
    return (
        top + rows.min(),
        left + cols.min(),
        top + rows.max() + 1,
        left + cols.max() + 1,
    )


def test_the_boxes_follow_the_pixels_and_no_object_is_cut():
    images, boxes = squares()
    augment = Augmenter(AugmentConfig(scale=0.5, stretch=0.3, shift=0.15), seed=3)
    out, moved = augment(images, boxes, np.ones(len(images), bool))
    out, moved = out.numpy(), moved.numpy()
    changed = ~np.all(out == images, axis=(1, 2, 3))
    assert 0.3 < changed.mean() < 1.0, changed.mean()  # some kept: a move cut them
    assert not on_edge(moved[changed], (24, 72)).numpy().any()
    for i in np.flatnonzero(changed):
        for k in range(2):
            np.testing.assert_allclose(
                ink_box(out[i], moved[i, k]), moved[i, k], atol=1.01,
                err_msg=f"image {i} box {k}")  # fmt: skip
    kept = ~changed
    np.testing.assert_array_equal(moved[kept], boxes[kept])


def test_an_image_without_boxes_is_moved_unchecked_and_tones_keep_the_range():
    images, boxes = squares(16)
    augment = Augmenter(AugmentConfig(scale=1.0, contrast=0.8, brightness=0.3,
                                      jpeg_quality=10), seed=0)  # fmt: skip
    out, _ = augment(images, boxes, np.zeros(16, bool))
    out = out.numpy()
    assert out.shape == images.shape and out.dtype == np.float32
    assert not np.any(np.all(out == images, axis=(1, 2, 3)))
    assert out.min() >= 0.0 and out.max() <= 1.0


def test_zoom_factors_scale_the_content_both_ways():
    lower, upper = zoom_factors(0.5)
    # RandomZoom scales the content by 1 / (1 + factor).
    assert 1 / (1 + lower) == pytest.approx(1.5) and 1 / (1 + upper) == pytest.approx(
        2 / 3
    )
    assert zoom_factors(0.0) == (0.0, 0.0)


def test_augmentation_is_for_training_batches_only():
    config = apply_overrides(preset("tiny"), ["data.source=digits:64", *AUGMENT])
    plain = apply_overrides(preset("tiny"), ["data.source=digits:64"])
    data = load_data(config)
    tokenizer = WordTokenizer.learn([e.caption for e in data.train], 50)

    def images(config, training):
        batches = make_dataset(data.train, tokenizer, config, training)
        return np.concatenate([f["image"].numpy() for f, _ in batches])

    assert set(next(iter(make_dataset(data.train, tokenizer, config, True)))[0]) == {
        "image", "target_in"}  # fmt: skip
    np.testing.assert_array_equal(images(config, False), images(plain, False))
    trained, untouched = images(config, True), images(plain, True)
    assert trained.shape == untouched.shape
    assert np.mean(np.any(trained != untouched, axis=(1, 2, 3))) > 0.9


def test_padded_boxes_skip_words_without_a_box():
    examples = [Example(b"", ("a bag left of a top",),
                        (None, (1, 2, 3, 4), None, None, None, (5, 6, 7, 8))),
                Example(b"", ("a cat",), None)]  # fmt: skip
    boxes, has = padded_boxes(examples, 4)
    np.testing.assert_array_equal(boxes[0], [[1, 2, 3, 4], [5, 6, 7, 8],
                                             [1, 2, 3, 4], [1, 2, 3, 4]])  # fmt: skip
    assert has.tolist() == [True, False] and not boxes[1].any()


def test_a_user_folder_trains_with_augmentation(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(8):
        png = png_bytes(rng.integers(0, 255, (20, 30), dtype=np.uint8))
        (tmp_path / f"{i}.png").write_bytes(png)
        rows.append(json.dumps({"image": f"{i}.png", "caption": f"noise {i % 2}"}))
    (tmp_path / "captions.jsonl").write_text("\n".join(rows) + "\n")
    folder = [f"data.source=folder:{tmp_path}", "data.valid_fraction=0",
              "data.test_fraction=0.2"]  # fmt: skip
    config = apply_overrides(preset("tiny"), [*folder, *AUGMENT])
    data = load_data(config)
    tokenizer = WordTokenizer.learn([e.caption for e in data.train], 50)
    (features, _), *_ = make_dataset(data.train, tokenizer, config, True)
    assert features["image"].shape[1:] == (16, 48, 1)


@pytest.mark.parametrize("bad", [
    "data.augment.scale=-1", "data.augment.shift=0.9", "data.augment.jpeg_quality=0",
    "data.augment.fill=wrap", "data.augment.zoom=2"])  # fmt: skip
def test_bad_augment_settings_are_named(bad):
    with pytest.raises(ConfigError, match="data.augment"):
        apply_overrides(preset("digits"), [bad])


# -- robustness layouts ---------------------------------------------------------


def test_layouts_are_what_they_say():
    config = preset("digits")
    made = {layout.name: robustness.make_examples(layout, config, 40)
            for layout in robustness.layouts_for(config)}  # fmt: skip
    sy, sx = config.image.height / 32, config.image.width / 96

    def sizes(name):  # in the reference canvas's pixels
        return {round((b - t) / sy) for e in made[name] for t, _, b, _ in e.boxes}

    assert sizes("generator") <= set(range(12, 19)) and sizes("digits 8 px") == {8}
    assert sizes("digits 24 px") == {24}
    assert max(len(e.boxes) for e in made["digits 24 px"]) == 3
    for name, gap in (("touching", 0), ("overlapping", -3)):
        for e in made[name]:
            lefts = [round(b[1] / sx) for b in e.boxes]
            rights = [round(b[3] / sx) for b in e.boxes]
            assert [r + gap for r in rights[:-1]] == lefts[1:], (name, e.boxes)
    assert all(e.image.startswith(b"\xff\xd8\xff") for e in made["JPEG quality 20"])
    pixels = [robustness._pixels(e.image) for e in made["low contrast"]]
    assert min(p.min() for p in pixels) == 96 and max(p.max() for p in pixels) <= 159
    twice = robustness._pixels(made["twice the size"][0].image)
    assert twice.shape == (64, 192)
    assert robustness._pixels(made["wide strip"][0].image).shape == (32, 144)
    # The same strips each time: the rows differ by their layout alone.
    again = robustness.make_examples(robustness.LAYOUTS[5], config, 40)
    assert [e.image for e in again] == [e.image for e in made["touching"]]
    assert [e.caption for e in made["generator"]] == [
        e.caption for e in made["low contrast"]
    ]


def test_other_sources_get_the_layouts_that_change_a_given_image():
    config = apply_overrides(preset("fashion"), ["data.source=folder:x"])
    names = [layout.name for layout in robustness.layouts_for(config)]
    assert names == [
        "twice the size",
        "half the size",
        "JPEG quality 20",
        "low contrast",
    ]
    rgb = np.zeros((10, 20, 3), "uint8")
    rgb[2:5, 3:9] = 200
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    example = Example(buffer.getvalue(), ("red",), ((2, 3, 5, 9),), "a.png")
    (twice,) = robustness.make_examples(robustness.LAYOUTS[9], config, 1, [example])
    assert robustness._pixels(twice.image).shape == (20, 40, 3)
    assert twice.boxes == example.boxes and twice.name == "a.png"


@pytest.mark.slow  # 75 s of evaluation: make test-slow
def test_the_evaluation_reproduces_a_known_layouts_numbers(pipeline_case, tmp_path):
    """``evaluate --robustness`` writes one row per layout; a layout that
    redraws the test split (its canvas, digit sizes and seed) scores exactly
    what the split scored."""
    from pipelines.captioning.evaluate import evaluate, robustness_rows

    case = pipeline_case("captioning")
    module, _ = case.module()
    config = case.config
    examples = case.task.load_data(config).test[:24]
    width = module.default_beam_width  # the decoding the rows use
    metrics = evaluate(tmp_path, module, config, examples, "test", (width,),
                       plots=0, robustness=True)  # fmt: skip
    rows = metrics["robustness"]
    assert list(rows) == [layout.name for layout in robustness.LAYOUTS]
    assert all(0 <= r["exact_match"] <= 1 and r["images"] == 24 for r in rows.values())
    height, width = config.image.height, config.image.width
    same = robustness.Layout("test split", "", {
        "height": height / 32, "width": width / (32 * width / height),
        "sizes": (6, 9)})  # fmt: skip
    # The layout redraws the split byte for byte, boxes included ...
    redrawn = robustness.make_examples(same, config, len(examples))
    assert [e.image for e in redrawn] == [e.image for e in examples]
    for got, expected in zip(redrawn, examples, strict=True):
        np.testing.assert_allclose(got.boxes, expected.boxes)
    # ... and its row scores what the split scored.
    (known,) = robustness_rows(module, config, examples, [same]).values()
    (scores,) = metrics["decoding"].values()
    assert {k: known[k] for k in ("exact_match", "bleu")} == {
        k: scores[k] for k in ("exact_match", "bleu")}  # fmt: skip
    again = robustness_rows(module, config, examples, robustness.LAYOUTS[1:3])
    assert again == {k: rows[k] for k in again}


def test_normalize_reads_an_image_alike_at_any_contrast():
    from pipelines.captioning.model import Captioner, PixelRange

    rng = np.random.default_rng(0)
    images = rng.uniform(0, 1, (3, 16, 48, 1)).astype("float32")
    dim = 0.376 + 0.25 * images  # low contrast on gray
    np.testing.assert_allclose(PixelRange()(dim), PixelRange()(images), atol=1e-5)
    assert float(np.max(PixelRange()(np.full((1, 4, 4, 1), 0.5, "float32")))) == 0.0
    config = apply_overrides(preset("tiny"), ["model.normalize=true"])
    model = Captioner(config.model, config.image, 20, max_length=6)
    grid = model.encode(images)
    again = model.encode(dim)
    for key in grid:
        np.testing.assert_allclose(again[key], grid[key], atol=1e-4, err_msg=key)
    assert "pixel_range" not in [
        layer.name for layer in Captioner(preset("tiny").model, config.image, 20, 6).cnn
    ]


def test_the_augmentation_benchmark_runs():
    """benchmarks/bench_augment.py stays runnable (a few seconds)."""
    from benchmarks.bench_augment import main

    out = main(["--rounds", "1", "--batches", "2", "--strips", "128"])
    assert 0 < out["ratio"]["median"] and out["train_step"]["median"] > 0
