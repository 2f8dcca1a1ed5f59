"""Digit strips for captioning: handwritten digits pasted in a row, with boxes.

The digits are the 1,797 8x8 scans of scikit-learn's ``load_digits`` (the
UCI optical recognition set, bundled with scikit-learn: nothing to download).
A strip holds 1 to 5 of them, each scaled to its own size and pasted at its
own height, left to right with random gaps; its caption is the digits in
words (``"three one four"``), and every digit's box is recorded so that a
model's attention can be graded. The scans are split before any strip is
made (`source_split`): a test strip is made only of scans that no training
strip uses.

Example:

>>> strips = make_strips(3, "train", seed=0)
>>> [s.caption for s in strips]
['four nine six four six', 'zero four two eight five', 'one']
>>> strips[0].image.shape, strips[0].image.dtype
((32, 96), dtype('uint8'))
>>> strips[0].boxes[0]  # top, left, bottom, right of the first "four"
(13, 13, 25, 25)
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import cache

import numpy as np

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SPLITS = ("train", "valid", "test")
# Shares of the 1,797 scans held out for validation and test.
VALID_SHARE, TEST_SHARE = 0.1, 0.15


@dataclass(frozen=True)
class Strip:
    """One captioned image.

    ``boxes[k]`` is ``(top, left, bottom, right)`` of the ``k``-th word's
    digit (bottom and right exclusive); ``sources[k]`` its scan's index in
    ``load_digits``.
    """

    image: np.ndarray  # uint8 [height, width], 0 is the background
    caption: str
    boxes: tuple[tuple[int, int, int, int], ...]
    sources: tuple[int, ...]

    def png(self) -> bytes:
        """The image as PNG bytes (lossless: decoding gives ``image`` back)."""
        return png_bytes(self.image)


def png_bytes(image: np.ndarray) -> bytes:
    """A uint8 image, gray ``[H, W]`` or RGB ``[H, W, 3]``, as PNG bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


@cache
def _scans() -> tuple[np.ndarray, np.ndarray]:
    """``load_digits``' images as uint8 0-255 ``[1797, 8, 8]`` and labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # pragma: no cover - an install without extras
        raise ImportError(
            "digit strips need scikit-learn (its bundled load_digits scans): "
            "pip install 'attention-layers[pipelines]' or pip install scikit-learn"
        ) from error
    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype("uint8")
    return images, digits.target.astype("int64")


def source_split(seed: int = 0) -> dict[str, np.ndarray]:
    """The scans' indices of each split: a fixed shuffle, 75/10/15 percent."""
    count = len(_scans()[1])
    order = np.random.default_rng(seed).permutation(count)
    n_test, n_valid = round(TEST_SHARE * count), round(VALID_SHARE * count)
    return {
        "test": np.sort(order[:n_test]),
        "valid": np.sort(order[n_test : n_test + n_valid]),
        "train": np.sort(order[n_test + n_valid :]),
    }


def make_strips(
    count: int,
    split: str,
    seed: int,
    height: int = 32,
    width: int = 96,
    min_digits: int = 1,
    max_digits: int = 5,
    min_size: int = 12,
    max_size: int = 18,
    split_seed: int = 0,
    gap: int | None = None,
) -> list[Strip]:
    """``count`` strips made of the scans of ``split`` (`source_split`).

    Each digit is scaled (bilinear) to a square of ``min_size`` to
    ``max_size`` pixels, at a random height; the digits sit left to right
    with random gaps, so a strip of 5 needs ``width >= 5 * max_size``.
    A ``gap`` sets every gap between neighbours instead (0: touching,
    negative: overlapping by that many pixels, ink kept by the brighter
    pixel), the row at a random offset: layouts the training strips do not
    have (`pipelines.captioning.robustness`).
    Deterministic in ``seed`` (and ``split_seed``, which fixes the split).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, received {split!r}")
    if not 1 <= min_digits <= max_digits:
        raise ValueError(
            "digits per strip: expected 1 <= min_digits <= max_digits, received "
            f"{min_digits} and {max_digits}"
        )
    if not 1 <= min_size <= max_size <= height:
        raise ValueError(
            "digit size: expected 1 <= min_size <= max_size <= height, received "
            f"{min_size}, {max_size} and height {height}"
        )
    if gap is not None and not -min_size < gap:
        raise ValueError(
            f"gap: digits may overlap by less than their size ({min_size}), "
            f"received gap {gap}"
        )
    if gap is not None and max_digits * max_size + (max_digits - 1) * gap > width:
        raise ValueError(
            f"a strip {width} pixels wide cannot hold {max_digits} digits of "
            f"{max_size} pixels {gap} pixels apart"
        )
    if gap is None and max_digits * max_size + 2 > width:
        raise ValueError(
            f"a strip {width} pixels wide cannot hold {max_digits} digits of "
            f"{max_size} pixels: make it at least {max_digits * max_size + 2} wide"
        )
    images, labels = _scans()
    pool = source_split(split_seed)[split]
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    return [
        _strip(rng, images, labels, pool, height, width,
               (min_digits, max_digits), (min_size, max_size), gap)
        for _ in range(count)
    ]  # fmt: skip


def _strip(rng, images, labels, pool, height, width, digits, sizes, gap) -> Strip:
    from PIL import Image

    k = int(rng.integers(digits[0], digits[1] + 1))
    sources = rng.choice(pool, size=k)
    size = rng.integers(sizes[0], sizes[1] + 1, size=k)
    if gap is None:
        # The free columns, shared at random among the k + 1 gaps.
        free = width - int(size.sum())
        cuts = np.sort(rng.integers(0, free + 1, size=k))
        gaps = np.diff(np.concatenate([[0], cuts]))
    else:  # a random margin, then `gap` between neighbours
        free = width - int(size.sum()) - (k - 1) * gap
        gaps = np.array([rng.integers(0, free + 1)] + [gap] * (k - 1))
    canvas = np.zeros((height, width), "uint8")
    boxes, left = [], 0
    for source, s, gap in zip(sources, size, gaps, strict=True):
        left += int(gap)
        top = int(rng.integers(0, height - s + 1))
        scan = Image.fromarray(images[source]).resize((int(s), int(s)), Image.BILINEAR)
        region = canvas[top : top + s, left : left + s]
        np.maximum(region, np.asarray(scan), out=region)
        boxes.append((top, left, top + int(s), left + int(s)))
        left += int(s)
    caption = " ".join(WORDS[labels[source]] for source in sources)
    return Strip(canvas, caption, tuple(boxes), tuple(int(s) for s in sources))
