"""Held-out images laid out in ways the training generator never makes.

``captioning evaluate --robustness`` scores a trained captioner on each
`Layout` of the test split's scans: other digit sizes, touching and
overlapping digits, other strip sizes, lossy JPEG, low contrast. A layout
changes one thing against the generator's own strips, drawn on the
**reference canvas** (32 pixels high, the model's aspect: 32 x 96 for the
digit presets, where the generator's digits are 12 to 18 pixels), so the
rows compare with the first, ``generator``, and the export resizes every
image to the model's size as it would a user's. Each layout draws the same
strips from its seed (the test split's), so the rows differ in their
layout, not in their luck.

Digit strips get every layout, the generic ones (which change a given
image: its size, JPEG, contrast) applied to the ``generator`` strips;
Fashion-MNIST scenes and a user folder get the generic ones, applied to the
test split's own images.

Example:

>>> from pipelines.captioning.config import preset
>>> config = preset("digits-quick")
>>> [layout.name for layout in layouts_for(config)][:3]
['generator', 'digits 8 px', 'digits 10 px']
>>> strip = make_examples(LAYOUTS[5], config, count=1)[0]  # touching
>>> strip.caption, [(left, right) for _, left, _, right in strip.boxes]
('six three three', [(16.0, 24.0), (24.0, 31.0), (31.0, 38.5)])
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipelines.captioning.data import Example, digit_sizes
from pipelines.captioning.digit_strips import make_strips, png_bytes

REFERENCE_HEIGHT = 32  # the generator's default strip: 32 x 96, digits 12-18
GENERATOR_SIZES = digit_sizes(REFERENCE_HEIGHT)  # 12 to 18 pixels


def low_contrast(pixels: np.ndarray) -> np.ndarray:
    """Ink at a quarter of its contrast on a gray background (96 + x / 4)."""
    return (96 + pixels.astype("uint16") // 4).astype("uint8")


def jpeg_bytes(pixels: np.ndarray, quality: int) -> bytes:
    """The image as a JPEG of ``quality`` (PIL's encoder)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


@dataclass(frozen=True)
class Layout:
    """One row of the robustness table.

    ``strips``: `make_strips` arguments on the reference canvas, relative
    to the generator's (``height``/``width`` as multiples of the canvas,
    ``sizes`` the digits' smallest and largest size in pixels, ``gap``),
    or None to change
    the test split's own images (`generic`: every source). ``pixels``
    changes the pixels, ``jpeg`` encodes as a JPEG of that quality.
    """

    name: str
    what: str
    strips: dict | None = field(default_factory=dict)
    pixels: Callable[[np.ndarray], np.ndarray] | None = None
    jpeg: int = 0
    scale: float = 1.0  # a generic layout: the image resized by this factor

    @property
    def generic(self) -> bool:
        return self.strips is None


LAYOUTS = (
    Layout("generator", "the generator's strips, drawn on the reference canvas"),
    Layout("digits 8 px", "digits of 8 px (the generator: 12-18)", {"sizes": (8, 8)}),
    Layout("digits 10 px", "digits of 10 px", {"sizes": (10, 10)}),
    Layout("digits 20 px", "digits of 20 px, up to 4 a strip", {"sizes": (20, 20)}),
    Layout("digits 24 px", "digits of 24 px, up to 3 a strip", {"sizes": (24, 24)}),
    Layout("touching", "neighbours touching (no gap)", {"gap": 0}),
    Layout("overlapping", "neighbours overlapping by 3 px", {"gap": -3}),
    Layout(
        "wide strip", "a canvas 1.5 times as wide, digits 12-18", {"width": 1.5}
    ),  # fmt: skip
    Layout(
        "tall strip", "a canvas 1.5 times as high, digits 12-18", {"height": 1.5}
    ),  # fmt: skip
    Layout("twice the size", "the image resized to twice its size", None, scale=2.0),
    Layout("half the size", "the image resized to half its size", None, scale=0.5),
    Layout("JPEG quality 20", "lossy JPEG of quality 20", None, jpeg=20),
    Layout(
        "low contrast",
        "ink at a quarter of its contrast on gray",
        None,
        pixels=low_contrast,
    ),  # fmt: skip
)


def layouts_for(config) -> list[Layout]:
    """Every layout for digit strips; the generic ones for other sources."""
    digits = config.data.source.startswith("digits:")
    return [layout for layout in LAYOUTS if digits or layout.generic]


def make_examples(layout: Layout, config, count: int, base=()) -> list[Example]:
    """``count`` examples of ``layout``: digit strips drawn from the test
    scans, or ``base`` (the test split's examples) changed.

    Boxes are given in the model's image size, as the generator's are.
    """
    if not layout.generic:
        drawn = _strips(layout, config, count)
    elif config.data.source.startswith("digits:"):
        drawn = _strips(LAYOUTS[0], config, count)
    else:
        drawn = ((_pixels(e.image), e) for e in base[:count])
    return [_encoded(pixels, e, layout) for pixels, e in drawn]


def _strips(layout: Layout, config, count: int):
    """``(pixels, Example)`` of the layout's strips (boxes in model pixels)."""
    image, data = config.image, config.data
    height = round(REFERENCE_HEIGHT * layout.strips.get("height", 1.0))
    width = round(REFERENCE_HEIGHT * image.width / image.height
                  * layout.strips.get("width", 1.0))  # fmt: skip
    low, high = layout.strips.get("sizes", GENERATOR_SIZES)
    gap = layout.strips.get("gap")
    most = data.max_digits
    room = width - 2 if gap is None else width + gap
    most = min(most, room // (high + (0 if gap is None else gap)))
    strips = make_strips(count, "test", seed=data.seed + 2, height=height,
                         width=width, max_digits=most, min_size=low,
                         max_size=high, gap=gap)  # fmt: skip
    sy, sx = image.height / height, image.width / width
    for strip in strips:
        boxes = tuple((t * sy, left * sx, b * sy, r * sx)
                      for t, left, b, r in strip.boxes)  # fmt: skip
        yield strip.image, Example(b"", (strip.caption,), boxes)


def _pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as picture:
        return np.asarray(picture)


def _encoded(pixels: np.ndarray, example: Example, layout: Layout) -> Example:
    """The example's caption and boxes over ``pixels`` changed by ``layout``."""
    if layout.scale != 1.0:
        from PIL import Image

        height, width = pixels.shape[:2]
        size = (max(1, round(width * layout.scale)),
                max(1, round(height * layout.scale)))  # fmt: skip
        pixels = np.asarray(Image.fromarray(pixels).resize(size, Image.BILINEAR))
    if layout.pixels is not None:
        pixels = layout.pixels(pixels)
    data = jpeg_bytes(pixels, layout.jpeg) if layout.jpeg else png_bytes(pixels)
    return Example(data, example.captions, example.boxes, example.name)
