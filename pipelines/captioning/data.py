"""Captioned images: digit strips or the user's folder, and training batches.

An `Example` is one image as PNG or JPEG bytes (what the export takes),
every caption it has, and, for generated images (digit strips, Fashion-MNIST
scenes), the box of the object each caption word names (None for a word
that names none). Images are decoded and resized by `decode_images`, the same function
the export runs, so training sees what serving sees.

A user folder holds the images and a ``captions.jsonl`` (one object per
line: ``{"image": "a.png", "caption": "..."}`` or ``"captions": [...]``)
or a ``captions.csv`` (columns ``image`` and ``caption``, one row per
caption). Image paths are relative to the folder.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.errors import PipelineError
from pipelines.core.files import read_file
from pipelines.core.task import Data
from pipelines.data.user_files import jsonl_objects, read_lines

CAPTION_FILES = ("captions.jsonl", "captions.csv")
SAMPLE_COUNT = 3  # images demo shows


@dataclass(frozen=True)
class Example:
    image: bytes  # PNG or JPEG
    captions: tuple[str, ...]
    boxes: tuple[tuple[int, int, int, int] | None, ...] | None = None  # per word
    name: str = ""  # the image's file, for a user folder

    @property
    def caption(self) -> str:
        return self.captions[0]


def load_data(config) -> Data:
    """The configured examples split into train / valid / test, with notes."""
    from pipelines.core.errors import ConfigError

    d = config.data
    kind, _, argument = d.source.partition(":")
    if kind == "digits" and argument.isdigit() and int(argument) > 0:
        train, valid, test, notes = _digit_splits(int(argument), config)
    elif kind == "fashion" and argument.isdigit() and int(argument) > 0:
        train, valid, test, notes = _fashion_splits(int(argument), config)
    elif kind == "folder" and argument:
        train, valid, test, notes = _folder_splits(argument, config)
    else:
        raise ConfigError(
            "config: `data.source` must be digits:N (N generated training strips), "
            "fashion:N (N Fashion-MNIST scenes) or folder:PATH, received "
            f"{d.source!r}."
        )
    limit = config.tokenizer.max_words
    captions = [c for e in train + valid + test for c in e.captions]
    cut = sum(len(c.split()) > limit for c in captions)
    notes.append(
        f"cut {cut} of {len(captions)} captions longer than {limit} words "
        "(tokenizer.max_words)"
    )
    return Data(train, valid, test, notes)


def _digit_splits(count: int, config):
    from pipelines.captioning.digit_strips import make_strips

    d, image = config.data, config.image
    if image.channels != 1:
        raise PipelineError("data: digit strips are gray: set image.channels=1.")
    sizes = digit_sizes(image.height)
    kwargs = dict(height=image.height, width=image.width, max_digits=d.max_digits,
                  min_size=sizes[0], max_size=sizes[1])  # fmt: skip
    try:
        splits = [
            make_strips(n, split, seed=d.seed + offset, **kwargs)
            for offset, (n, split) in enumerate(
                ((count, "train"), (d.valid_size, "valid"), (d.test_size, "test"))
            )
        ]
    except ValueError as error:
        raise PipelineError(f"data: digit strips: {error}") from None
    examples = [
        [Example(s.png(), (s.caption,), s.boxes) for s in strips] for strips in splits
    ]
    notes = [
        f"generated {count} training, {d.valid_size} validation and {d.test_size} "
        f"test strips of 1 to {d.max_digits} digits ({image.height}x{image.width} "
        f"pixels, digits of {sizes[0]} to {sizes[1]}), test strips made of scans "
        "that no training strip uses"
    ]
    return (*examples, notes)


def _fashion_splits(count: int, config):
    from pipelines.captioning import fashion_scenes as fs
    from pipelines.captioning.digit_strips import png_bytes

    d, image = config.data, config.image
    if image.channels != 1:
        raise PipelineError(
            "data: Fashion-MNIST scenes are gray: set image.channels=1."
        )
    # Boxes on the model's image size (the scenes are 64 x 64).
    sy, sx = image.height / fs.HEIGHT, image.width / fs.WIDTH

    def scaled(box):
        if box is None:
            return None
        top, left, bottom, right = box
        return (round(top * sy), round(left * sx), round(bottom * sy),
                round(right * sx))  # fmt: skip

    try:
        splits = [
            fs.make_scenes(n, split, seed=d.seed + offset, root=d.fashion_root)
            for offset, (n, split) in enumerate(
                ((count, "train"), (d.valid_size, "valid"), (d.test_size, "test"))
            )
        ]
    except (FileNotFoundError, ValueError) as error:
        raise PipelineError(f"data: {error}") from None
    examples = [
        [Example(png_bytes(s.image), (s.caption,),
                 tuple(scaled(b) for b in s.boxes)) for s in scenes]
        for scenes in splits
    ]  # fmt: skip
    notes = [
        f"generated {count} training, {d.valid_size} validation and {d.test_size} "
        "test Fashion-MNIST scenes of 2 to 4 items (64x64 pixels), test scenes "
        "made of the t10k scans"
    ]
    return (*examples, notes)


def digit_sizes(height: int) -> tuple[int, int]:
    """Digit squares of 3/8 to 9/16 of the strip's height (12-18 of 32)."""
    return max(1, round(height * 3 / 8)), max(1, round(height * 9 / 16))


def read_folder(folder: str | Path) -> list[Example]:
    """The captioned images of a user folder (see the module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PipelineError(f"data: no such folder: {folder}")
    found = [folder / name for name in CAPTION_FILES if (folder / name).is_file()]
    if not found:
        raise PipelineError(
            f"data: {folder} has neither {' nor '.join(CAPTION_FILES)}: put the "
            "captions there, one image and caption per line or row."
        )
    path = found[0]
    captions: dict[str, list[str]] = {}
    for where, image, caption in _caption_rows(path):
        if not isinstance(image, str) or not image:
            raise PipelineError(f"data: {where}: no `image` file name")
        texts = caption if isinstance(caption, list) else [caption]
        if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise PipelineError(
                f"data: {where}: `caption` must be a non-empty string "
                f"(or `captions` a list of them), received {caption!r}"
            )
        captions.setdefault(image, []).extend(" ".join(t.split()) for t in texts)
    examples = []
    for name, texts in captions.items():
        file = folder / name
        if not file.exists():
            raise PipelineError(f"data: {path} names {name}, which is not in {folder}")
        try:
            data = read_file(file, "an image file (PNG or JPEG)")
        except OSError as error:
            raise PipelineError(
                f"data: {file}: cannot be read ({error.strerror})"
            ) from None
        if not is_image(data):
            raise PipelineError(f"data: {file} is not a PNG or JPEG image")
        examples.append(Example(data, tuple(texts), None, name))
    return examples


def _caption_rows(path: Path):
    """``(where, image, caption or list)`` of a captions file, ``where`` its
    path and line for messages."""
    if path.suffix == ".csv":
        text = "\n".join(read_lines(path, "a CSV file of images and captions"))
        with io.StringIO(text, newline="") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames and not {"image", "caption"} <= set(reader.fieldnames):
                raise PipelineError(
                    f"data: {path} must have the columns `image` and `caption`, "
                    f"received {reader.fieldnames}"
                )
            for number, row in enumerate(reader, start=2):
                yield f"{path}, line {number}", row.get("image"), row.get("caption")
        return
    expected = 'a JSON object with "image" and "caption" (or "captions")'
    for where, row in jsonl_objects(path, expected):
        yield where, row.get("image"), row.get("captions", row.get("caption"))


def is_image(data: bytes) -> bool:
    """Whether ``data`` starts like a PNG or a JPEG file."""
    return data.startswith((b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff"))


def _folder_splits(folder: str, config):
    from pipelines.data import split_pairs

    d = config.data
    examples = read_folder(folder)
    if not examples:
        raise PipelineError(f"data: no examples in {Path(folder) / CAPTION_FILES[0]}.")
    keyed = [(e.name, e) for e in examples]
    splits = split_pairs(keyed, d.valid_fraction, d.test_fraction, seed=d.seed)
    train, valid, test = ([e for _, e in part] for part in splits)
    notes = [
        f"read {len(examples)} images with "
        f"{sum(len(e.captions) for e in examples)} captions from {folder}"
    ]
    return train, valid, test, notes


def make_dataset(examples, tokenizer, config, training: bool, replicas: int = 1):
    """Teacher-forcing batches ``({"image", "target_in"}, target_out)``
    (``target_out`` among the features too with hard attention).

    One row per caption (an image with three captions gives three rows).
    Images are decoded once, by `decode_images`; captions get ``[START]``
    in front of the decoder input and ``[END]`` after the expected output,
    padded to ``tokenizer.max_words + 1`` (static shapes, so an XLA train
    step compiles once). Training batches go through ``data.augment``
    (`pipelines.captioning.augment`) when it is on, each image with its
    boxes; evaluation batches never do. Under a strategy with ``replicas``
    replicas every batch is cut to a multiple of them. The number of batches
    is stated up front (a real progress bar).
    """
    import numpy as np
    import tensorflow as tf

    from pipelines.captioning.images import decode_images
    from pipelines.core.datasets import example_order
    from pipelines.core.text import END, PAD, START

    rows = [(i, c) for i, e in enumerate(examples) for c in e.captions]
    length = config.tokenizer.max_words + 1
    ids = tokenizer.tokenize(tf.constant([c for _, c in rows]))[:, : length - 1]
    target_in = tf.concat([tf.fill([ids.nrows(), 1], START), ids], axis=1).to_tensor(
        PAD, shape=[None, length]
    )
    target_out = tf.concat([ids, tf.fill([ids.nrows(), 1], END)], axis=1).to_tensor(
        PAD, shape=[None, length]
    )
    images = decode_images(
        tf.constant([e.image for e in examples]), config.image, name="image"
    )
    image_of_row = tf.constant(np.array([i for i, _ in rows], "int64"))
    order = example_order(len(rows), config, training)

    # Hard attention's REINFORCE loss is inside the model: it reads the targets.
    hard = config.model.attention == "hard"
    augmenter = None
    if training and config.data.augment.on:
        from pipelines.captioning.augment import Augmenter

        augmenter = Augmenter(config.data.augment, seed=config.train.seed)
        boxes, has_boxes = (tf.constant(a) for a in padded_boxes(examples, length))

    def row(i):
        j = image_of_row[i]
        features = {"image": tf.gather(images, j), "target_in": target_in[i]}
        if hard:
            features["target_out"] = target_out[i]
        if augmenter:  # the image's boxes, to move with its pixels
            features["boxes"], features["has_boxes"] = boxes[j], has_boxes[j]
        return features, target_out[i]

    batch = config.train.batch_size
    data = order.map(row, num_parallel_calls=tf.data.AUTOTUNE).batch(batch)
    if augmenter:
        data = data.map(augmenter.on_features, num_parallel_calls=tf.data.AUTOTUNE)
    if replicas > 1:
        # Keras fails on a batch that leaves a replica empty: cut each batch
        # to a multiple of the replicas, drop one with fewer rows.
        data = data.map(lambda f, t: _cut_to_multiple(f, t, replicas)).filter(
            lambda f, t: tf.shape(t)[0] > 0
        )
    rest = len(rows) % batch
    total = len(rows) // batch + (1 if rest >= replicas else 0)
    data = data.apply(tf.data.experimental.assert_cardinality(total))
    return data.prefetch(tf.data.AUTOTUNE)


def padded_boxes(examples, length: int):
    """``(boxes [n, length, 4] float32, has_boxes [n] bool)`` of the
    examples: each image's object boxes (words without a box left out),
    padded with its first box; zeros and False for an image with none."""
    import numpy as np

    boxes = np.zeros((len(examples), length, 4), "float32")
    has_boxes = np.zeros(len(examples), bool)
    for i, example in enumerate(examples):
        found = [b for b in example.boxes or () if b is not None][:length]
        if found:
            boxes[i] = found[0]
            boxes[i, : len(found)] = found
            has_boxes[i] = True
    return boxes, has_boxes


def _cut_to_multiple(features, targets, replicas):
    import tensorflow as tf

    keep = tf.shape(targets)[0] // replicas * replicas
    return {k: v[:keep] for k, v in features.items()}, targets[:keep]


def sample_strips(config) -> list[Path]:
    """The first test strips of the configured size as PNG files (written
    once, atomically, to the pipelines' cache folder)."""
    from pipelines.captioning.digit_strips import make_strips
    from pipelines.core.run_dir import cache_dir, write_bytes

    image, d = config.image, config.data
    folder = cache_dir() / (
        f"captioning-samples-{image.height}x{image.width}-{d.max_digits}-{d.seed}"
    )
    paths = [folder / f"strip_{k}.png" for k in range(SAMPLE_COUNT)]
    if not all(p.is_file() for p in paths):
        low, high = digit_sizes(image.height)
        strips = make_strips(SAMPLE_COUNT, "test", seed=d.seed + 2, height=image.height,
                             width=image.width, max_digits=d.max_digits,
                             min_size=low, max_size=high)  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        for path, strip in zip(paths, strips, strict=True):
            write_bytes(path, strip.png())
    return paths


def samples_for(config) -> list[str]:
    """Paths of images for ``demo``: the first test strips (`sample_strips`)
    or a user folder's first images."""
    kind, _, argument = config.data.source.partition(":")
    if kind == "folder":
        examples = read_folder(argument)[:SAMPLE_COUNT]
        return [str(Path(argument) / e.name) for e in examples]
    return [str(p) for p in sample_strips(config)]
