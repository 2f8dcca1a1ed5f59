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
from pipelines.captioning.config import PRESETS, ImageConfig, preset
from pipelines.captioning.digit_strips import (
    WORDS,
    _scans,
    make_strips,
    png_bytes,
    source_split,
)
from pipelines.captioning.evaluate import caption_bleu, caption_cider, peak_hits
from pipelines.captioning.images import decode_images
from pipelines.captioning.task import TASK
from pipelines.core.config import apply_overrides
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.text import END, PAD, RESERVED, START

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
    with pytest.raises(
        PipelineError, match="line 1: expected a JSON object .*not JSON"
    ):
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
    # Box 1 moved to (0, 10, 8, 13): cell (1, 3) spans columns 12-16, so it
    # overlaps the box by one column while its centre (column 14) is outside.
    edge = [boxes[0], (0, 10, 8, 13), None]
    words = ["one", "two", "three"]
    assert peak_hits(attention, words, words, edge, (8, 16)) == [True, False, None]
    assert peak_hits(attention, words, words, edge, (8, 16), rule="overlap") == [
        True, True, None]  # fmt: skip
    far = [boxes[0], (0, 0, 8, 12), None]  # ends where cell (1, 3) starts
    assert peak_hits(attention, words, words, far, (8, 16), rule="overlap")[1] is False


def test_cider_is_the_coco_scorer_on_lowercased_13a_tokens():
    """CIDEr-D by hand: two images whose references share no n-gram give every
    n-gram the idf log 2 in both; a caption equal to its reference then has
    cosine 1 at every n (times 10: 10), an empty caption 0, so the corpus
    score is their mean, 5. A caption one word short scores less."""
    references = [("one two three four",), ("five six seven eight",)]
    assert caption_cider(["ONE two three four", ""], references) == {"cider": 5.0}
    short = caption_cider(["one two three", ""], references)["cider"]
    assert 0 < short < 5.0


# -- the export against the model -----------------------------------------------------


@pytest.fixture(scope="module")
def untrained():
    config = preset("tiny")
    data = TASK.load_data(config)
    tokenizer = TASK.preprocessors(None, data, config, create=False)
    model = TASK.build_model(config, tokenizer)
    # An untrained model may write [PAD], which the teacher-forced trainer
    # would mask as an input (mask_zero): keep it from writing that word.
    bias = model.projection.bias
    bias.assign(bias.numpy() - 10.0 * (np.arange(bias.shape[0]) == PAD))
    module = TASK.serving_module(model, tokenizer, config)
    return config, data, tokenizer, model, module


def test_served_captions_follow_the_teacher_forced_model(untrained):
    """The export's greedy words are the argmax of the model fed the decoded
    image and the words before; its attention rows are the decoder's
    alignments, row-major over the grid, zero after [END]."""
    config, data, tokenizer, model, module = untrained
    examples = data.test[:6]
    fn = module.signatures()["with_options"]
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
        # The caption drops the reserved tokens an untrained model may write.
        written = [w for w in words if w and w not in RESERVED]
        assert out["caption"][b].decode() == " ".join(written)


def test_greedy_and_beam_decoding_return_the_same_fields(untrained):
    config, data, _, _, module = untrained
    images = tf.constant([e.image for e in data.test[:3]])
    fn = module.signatures()["with_options"]
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


def test_an_xla_compiled_search_captions_as_the_plain_one(untrained):
    """``export.jit_compile=true``: the search compiled by XLA on a batch
    padded to a power of two (3 rows to 4) gives the plain module's outputs."""
    config, data, tokenizer, model, module = untrained
    compiled = TASK.serving_module(
        model, tokenizer, apply_overrides(config, ["export.jit_compile=true"])
    )
    assert compiled.compiles_decoding
    images = tf.constant([e.image for e in data.test[:3]])
    plain_fn = module.signatures()["with_options"]
    xla_fn = compiled.signatures()["with_options"]
    for width, batch in ((1, images), (3, images), (1, images[:0])):
        options = {"beam_width": tf.constant(width), "length_penalty": tf.constant(0.0)}
        want, got = plain_fn(image=batch, **options), xla_fn(image=batch, **options)
        for key, value in want.items():
            assert got[key].shape == value.shape, (width, key)
            if value.dtype == tf.string:
                assert got[key].numpy().tolist() == value.numpy().tolist(), key
            else:
                np.testing.assert_allclose(got[key], value, atol=1e-4, err_msg=key)


@pytest.mark.slow  # a model traced for training and for serving: 20 s
def test_hard_attention_trains_by_reinforce_and_serves_one_cell_per_word():
    """``model.attention=hard``: the targets reach the model's ReinforceLoss,
    the reported loss is the captions' NLL, the score-function term alone
    trains the attention's scores, and the export attends to one cell."""
    with pytest.raises(ConfigError, match="input_feeding=false"):
        apply_overrides(preset("tiny"), ["model.attention=hard",
                                         "model.input_feeding=true"])  # fmt: skip
    config = apply_overrides(preset("tiny"), [
        "model.attention=hard", "model.grid_kernel=1", "train.batch_size=8",
        "model.sample_probability=1.0", "model.entropy_weight=0.0"])  # fmt: skip
    data = TASK.load_data(config)
    tokenizer = TASK.preprocessors(None, data, config, create=False)
    features, target_out = next(
        iter(TASK.make_dataset(data.train[:8], tokenizer, config, training=True))
    )
    np.testing.assert_array_equal(features["target_out"], target_out)
    model = TASK.build_model(config, tokenizer)
    assert model.cnn[-1].kernel_size == (1, 1)
    trainer = model.trainer
    trainer.compile(optimizer="adam", **TASK.compile_arguments(config))
    nll = TASK.compile_arguments(preset("tiny"))["loss"]
    want = float(nll(target_out, trainer(features, training=False)))
    assert trainer.test_on_batch(features, target_out, return_dict=True)["loss"] == (
        pytest.approx(want, rel=1e-5))  # fmt: skip
    attention = model.decoder.cell.attention
    scores = [w.numpy().copy() for w in attention.trainable_weights]
    trainer.train_on_batch(features, target_out)
    moved = [not np.allclose(a, w.numpy()) for a, w in
             zip(scores, attention.trainable_weights, strict=True)]  # fmt: skip
    assert all(moved)  # only the score-function term reaches them
    fn = TASK.serving_module(model, tokenizer, config).signatures()["serving_default"]
    out = fn(image=tf.constant([e.image for e in data.test[:3]]))
    for b in range(3):
        rows = out["attention"][b, : int(out["length"][b])].numpy()
        assert ((rows == 0) | (rows == 1)).all() and (rows.sum((1, 2)) == 1).all()
    # decode.hard_attention=soft: the same weights read the expected context;
    # each word's map is the distribution whose peak the argmax path takes.
    soft = apply_overrides(config, ["decode.hard_attention=soft"])
    reread = TASK.build_model(soft, tokenizer)
    reread.trainer.set_weights(trainer.get_weights())
    fn = TASK.serving_module(reread, tokenizer, soft).signatures()["serving_default"]
    spread = fn(image=tf.constant([e.image for e in data.test[:3]]))
    first = spread["attention"][:, 0].numpy()
    np.testing.assert_allclose(first.sum((1, 2)), 1.0, rtol=1e-5)
    assert (first < 1).all() and (first > 0).any(axis=(1, 2)).all()
    np.testing.assert_array_equal(
        first.reshape(3, -1).argmax(-1),
        out["attention"][:, 0].numpy().reshape(3, -1).argmax(-1),
    )


def test_grid_kernel_sets_the_width_of_the_grid_convolutions():
    """The last stage's two convolutions are ``grid_kernel`` wide (1, 3 or
    5), the earlier stages' 3; another width is refused by name."""
    import keras

    tiny = preset("tiny")
    tokenizer = TASK.preprocessors(None, TASK.load_data(tiny), tiny, create=False)
    for width in (1, 3, 5):
        config = apply_overrides(tiny, [f"model.grid_kernel={width}"])
        model = TASK.build_model(config, tokenizer)
        kernels = [
            layer.kernel_size
            for layer in model.cnn
            if isinstance(layer, keras.layers.Conv2D)
        ]
        assert kernels == [(3, 3)] * 2 * config.model.pools + [(width, width)] * 2
    with pytest.raises(ConfigError, match="grid_kernel.*received 2"):
        apply_overrides(preset("tiny"), ["model.grid_kernel=2"])


def test_a_hard_model_loads_a_soft_ones_weights(tmp_path):
    """``train.init_from`` from soft to hard attention: every weight but the
    REINFORCE baseline's loads (HardAttention keeps Bahdanau's weights)."""
    from pipelines.core.warm_start import load_matching

    soft = apply_overrides(preset("tiny"), ["model.grid_kernel=1"])
    hard = apply_overrides(soft, ["model.attention=hard"])
    data = TASK.load_data(soft)
    tokenizer = TASK.preprocessors(None, data, soft, create=False)
    trained = TASK.build_model(soft, tokenizer).trainer
    for w in trained.weights:
        w.assign(np.full(w.shape, 0.5, w.dtype))
    trained.save_weights(tmp_path / "soft.weights.h5")
    model = TASK.build_model(hard, tokenizer).trainer
    kept = load_matching(model, tmp_path / "soft.weights.h5")
    assert kept == ["reinforce/baseline_average", "reinforce/baseline_steps"]
    for w in model.weights:
        if w.path not in kept:
            np.testing.assert_array_equal(w.numpy(), 0.5)


# -- Fashion-MNIST scenes ------------------------------------------------------------


def write_idx(path, array):
    import gzip

    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape
    )
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype("uint8").tobytes())


@pytest.fixture
def fashion_root(tmp_path):
    """Debian's layout with small IDX files: each scan is a block of ink."""
    rng = np.random.default_rng(0)
    for part, n in (("train", 60), ("t10k", 20)):
        scans = np.zeros((n, 28, 28), "uint8")
        for k in range(n):
            top, left = rng.integers(0, 14, size=2)
            scans[k, top : top + 10, left : left + 12] = 100 + k
        write_idx(tmp_path / f"{part}-images-idx3-ubyte.gz", scans)
        write_idx(tmp_path / f"{part}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    return tmp_path


def test_fashion_scenes_relate_their_items_and_box_them(fashion_root):
    from pipelines.captioning import fashion_scenes as fs

    scenes = fs.make_scenes(30, "train", seed=1, root=fashion_root)
    again = fs.make_scenes(30, "train", seed=1, root=fashion_root)
    assert [s.caption for s in scenes] == [s.caption for s in again]
    images, labels = fs.scans(fashion_root, "train")
    layouts = set()
    for scene in scenes:
        words = scene.caption.split()
        # "a X" items joined by "left of" within a row and "above" between rows.
        rows = [row.split(" left of ") for row in scene.caption.split(" above ")]
        layouts.add(tuple(len(r) for r in rows))
        assert all(item.split()[0] == "a" for row in rows for item in row)
        nouns = [k for k, b in enumerate(scene.boxes) if b is not None]
        assert len(scene.boxes) == len(words) and len(nouns) == len(scene.sources)
        assert [words[k] for k in nouns] == [fs.WORDS[labels[s]] for s in scene.sources]
        ink = scene.image > 0
        covered = np.zeros_like(ink)
        for k, source in zip(nouns, scene.sources, strict=True):
            top, left, bottom, right = scene.boxes[k]
            # The box holds exactly the item's block of ink, at the item's value.
            assert (scene.image[top:bottom, left:right] == 100 + source).all()
            covered[top:bottom, left:right] = True
        assert not (ink & ~covered).any()
    assert layouts == {(2,), (1, 1), (2, 1), (1, 2), (2, 2)}
    valid = fs.make_scenes(30, "valid", seed=1, root=fashion_root)
    test = fs.make_scenes(5, "test", seed=1, root=fashion_root)
    seen = {s for scene in scenes for s in scene.sources}
    assert not seen & {s for scene in valid for s in scene.sources}
    t10k = fs.scans(fashion_root, "t10k")[0]
    for scene in test:  # the t10k file's scans
        for k, source in zip([k for k, b in enumerate(scene.boxes) if b], scene.sources,
                             strict=True):  # fmt: skip
            top, left, bottom, right = scene.boxes[k]
            assert (scene.image[top:bottom, left:right] == t10k[source].max()).all()


def test_fashion_scenes_in_the_task_and_their_errors(fashion_root, tmp_path):
    from pipelines.captioning.fashion_scenes import read_idx

    config = apply_overrides(preset("fashion"), [
        "data.source=fashion:8", "data.valid_size=2", "data.test_size=2",
        f"data.fashion_root={fashion_root}", "image.height=32",
        "image.width=32"])  # fmt: skip
    data = TASK.load_data(config)
    example = data.train[0]
    assert Image.open(io.BytesIO(example.image)).size == (64, 64)
    boxes = [b for b in example.boxes if b is not None]
    assert all(0 <= t < b <= 32 and 0 <= lf < r <= 32 for t, lf, b, r in boxes)
    missing = apply_overrides(config, [f"data.fashion_root={tmp_path / 'none'}"])
    with pytest.raises(PipelineError, match="dataset-fashion-mnist.*missing"):
        TASK.load_data(missing)
    cut = tmp_path / "cut.gz"
    (fashion_root / "train-images-idx3-ubyte.gz").rename(cut)
    import gzip

    cut.write_bytes(gzip.compress(gzip.decompress(cut.read_bytes())[:-5]))
    with pytest.raises(ValueError, match="a cut file"):
        read_idx(cut)  # a whole gzip stream of too few values
    cut.write_bytes(cut.read_bytes()[:-12])
    with pytest.raises(ValueError, match="not a whole gzip file"):
        read_idx(cut)  # the gzip stream itself cut short
    with pytest.raises(ConfigError, match="fashion:N"):
        TASK.load_data(apply_overrides(config, ["data.source=fashion:x"]))


# -- a keras.applications backbone ----------------------------------------------------


def test_an_application_backbone_reads_gray_images_and_a_weights_file(tmp_path):
    from pipelines.captioning.model import Captioner

    config = apply_overrides(preset("tiny"), [
        "model.backbone=MobileNetV2", "image.height=64", "image.width=96"])  # fmt: skip
    model = Captioner(config.model, config.image, vocab_size=12, max_length=6)
    assert model.grid == (2, 3)  # MobileNetV2 reduces by 32
    images = np.random.default_rng(0).random((2, 64, 96, 1)).astype("float32")
    logits = model.trainer({"image": images, "target_in": np.ones((2, 4), "int32")})
    assert logits.shape == (2, 4, 12)
    # The gray image reaches the network as three equal channels in [-1, 1].
    seen = model.cnn[0](images)
    assert seen.shape == (2, 64, 96, 3)
    np.testing.assert_allclose(seen[..., 2], images[..., 0] * 2 - 1, atol=1e-5)
    backbone = model.cnn[1]
    path = tmp_path / "notop.weights.h5"
    backbone.save_weights(path)
    given = apply_overrides(config, [f"model.backbone_weights={path}",
                                     "model.backbone_trainable=false"])  # fmt: skip
    again = Captioner(given.model, given.image, vocab_size=12, max_length=6)
    for a, b in zip(backbone.weights, again.cnn[1].weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not again.cnn[1].trainable_weights
    missing = apply_overrides(config, [f"model.backbone_weights={tmp_path / 'x.h5'}"])
    with pytest.raises(PipelineError, match="backbone_weights: no such file"):
        Captioner(missing.model, missing.image, vocab_size=12, max_length=6)
    small = apply_overrides(config, ["image.height=16", "image.width=16"])
    with pytest.raises(PipelineError, match="MobileNetV2 cannot read 16 x 16"):
        Captioner(small.model, small.image, vocab_size=12, max_length=6)


@pytest.mark.slow  # a Transformer traced for training and for serving: 15 s
def test_a_transformer_decoder_serves_what_it_reads_teacher_forced():
    """``model.decoder=transformer``: the export's greedy words are the argmax
    of the teacher-forced blocks, and each word's attention (the last
    block's cross-attention, averaged over heads) is a distribution over the
    grid."""
    with pytest.raises(ConfigError, match="decoder=transformer.*attention=hard"):
        apply_overrides(preset("tiny"), ["model.decoder=transformer",
                                         "model.attention=hard"])  # fmt: skip
    config = apply_overrides(preset("tiny"), [
        "model.decoder=transformer", "model.num_heads=2", "model.intermediate_dim=16",
        "model.num_layers=2"])  # fmt: skip
    data = TASK.load_data(config)
    tokenizer = TASK.preprocessors(None, data, config, create=False)
    model = TASK.build_model(config, tokenizer)
    module = TASK.serving_module(model, tokenizer, config)
    images = [e.image for e in data.test[:2]]
    out = module.signatures()["with_options"](
        image=tf.constant(images), beam_width=tf.constant(1)
    )
    pixels = decode_images(tf.constant(images), config.image)
    for b in range(2):
        length = int(out["length"][b])
        ids = [START]
        for _ in range(length):
            logits = model.trainer({"image": pixels[b : b + 1],
                                    "target_in": tf.constant([ids])})  # fmt: skip
            ids.append(int(np.argmax(logits[0, -1])))
        # detokenize cuts at [END]; at the length cap every word is written.
        written = tokenizer.detokenize(tf.constant([ids[1:]])).numpy()[0]
        assert out["caption"][b].numpy().decode() == written.decode()
        assert ids[length] == END or length == config.tokenizer.max_words + 1
        rows = out["attention"][b].numpy()
        np.testing.assert_allclose(rows[:length].sum((1, 2)), 1.0, rtol=1e-5)
        assert not rows[length:].any()


# -- presets --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates_and_builds(name):
    """Each preset passes its own validation and builds a model of its sizes
    (the tiny data's vocabulary: the caption words are the same ten digits)."""
    tiny = preset("tiny")
    tokenizer = TASK.preprocessors(None, TASK.load_data(tiny), tiny, create=False)
    config = preset(name).validate()
    model = TASK.build_model(config, tokenizer)
    assert model.trainer.count_params() > 0
    cells = 2**config.model.pools
    assert model.grid == (config.image.height // cells, config.image.width // cells)


def test_the_quick_preset_is_the_digits_task_on_smaller_strips():
    """``digits-quick`` (the demo's) captions what ``digits`` does, strips of
    1 to 5 digits with the same decoding, on smaller strips with a coarser
    grid and less training; its strips fit the image and no caption is cut."""
    quick, digits = preset("digits-quick"), preset("digits")
    assert quick.data.max_digits == digits.data.max_digits == 5
    assert quick.decode == digits.decode
    assert quick.model.pools > digits.model.pools
    assert quick.image.height * quick.image.width < (
        digits.image.height * digits.image.width
    )
    strips = {c.name: int(c.data.source.partition(":")[2]) for c in (quick, digits)}
    assert strips["digits-quick"] * quick.train.epochs < (
        strips["digits"] * digits.train.epochs
    )
    config = apply_overrides(
        quick, ["data.source=digits:30", "data.valid_size=5", "data.test_size=5"]
    )
    data = TASK.load_data(config)
    cut = f"cut 0 of 40 captions longer than {quick.tokenizer.max_words} words"
    assert data.notes[-1].startswith(cut)
    assert {len(e.caption.split()) for e in data.train} <= set(range(1, 6))
    pixels = decode_images(tf.constant([e.image for e in data.test]), config.image)
    assert pixels.shape == (5, 16, 48, 1)
