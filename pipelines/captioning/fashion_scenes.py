"""Fashion-MNIST scenes for captioning: 2 to 4 clothing items on a 2 x 2 grid.

The items are the 28x28 scans of Fashion-MNIST (Xiao, Rasul, Vollgraf 2017,
MIT licence) as Debian's ``dataset-fashion-mnist`` package installs them:
the original gzipped IDX files in ``/usr/share/datasets/fashion-mnist``
(`DEFAULT_ROOT`). A scene is a 64 x 64 canvas of four 32-pixel cells; each
item sits in its cell with up to 4 pixels of jitter. The rows are filled
from the left, and the caption relates the items: the top row left to right
joined by "left of", then "above" and the bottom row,

    "a bag left of a sneaker above a shirt"

(a bag and a sneaker side by side over a shirt on the left), so a caption
fixes the layout. Every noun carries its item's box (the box of its ink);
the other words carry none.

The split is by scan: training scenes use 90% of the training file's scans,
validation scenes the other 10% (a fixed shuffle), test scenes the t10k
file's, so a test scene shows items no training scene does.

Example (with the package installed):

>>> scenes = make_scenes(2, "train", seed=0)  # doctest: +SKIP
>>> scenes[0].caption  # doctest: +SKIP
'a sandal left of a top above a bag'
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

# Fashion-MNIST's ten classes, one word each (its "T-shirt/top" is "top").
WORDS = ("top", "trouser", "pullover", "dress", "coat", "sandal", "shirt",
         "sneaker", "bag", "boot")  # fmt: skip
DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")
PACKAGE = "dataset-fashion-mnist"
SPLITS = ("train", "valid", "test")
VALID_SHARE = 0.1
CELL, SIZE, JITTER = 32, 28, 4  # a cell holds an item and its jitter
HEIGHT = WIDTH = 2 * CELL
# (top row, bottom row) item counts for 2, 3 and 4 items.
LAYOUTS = {2: ((2, 0), (1, 1)), 3: ((2, 1), (1, 2)), 4: ((2, 2),)}


@dataclass(frozen=True)
class Scene:
    """One captioned scene; ``boxes[k]`` is ``(top, left, bottom, right)`` of
    the item that word ``k`` names (bottom and right exclusive), None for the
    other words; ``sources`` are the items' scan indices in their file."""

    image: np.ndarray  # uint8 [64, 64]
    caption: str
    boxes: tuple[tuple[int, int, int, int] | None, ...]
    sources: tuple[int, ...]


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped or not) as a numpy array of its dimensions.

    IDX: two zero bytes, a type byte (0x08 is unsigned bytes), the number of
    dimensions, each dimension as a big-endian uint32, then the data.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (EOFError, gzip.BadGzipFile) as error:
        raise ValueError(
            f"{path} is not a whole gzip file (a cut file?): {error}"
        ) from None
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    rank = data[3]
    shape = tuple(
        int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(rank)
    )
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * rank)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: expected {int(np.prod(shape))} values for shape "
                         f"{shape}, found {body.size} (a cut file?)")  # fmt: skip
    return body.reshape(shape)


@cache
def scans(root: Path, part: str) -> tuple[np.ndarray, np.ndarray]:
    """``(images [N, 28, 28] uint8, labels [N])`` of ``part`` (``"train"`` or
    ``"t10k"``); a missing file names the Debian package."""
    paths = [
        root / f"{part}-{kind}-ubyte.gz" for kind in ("images-idx3", "labels-idx1")
    ]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(
                f"Fashion-MNIST scenes need Debian's {PACKAGE} package "
                f"(apt-get install {PACKAGE}), which installs the IDX files in "
                f"{DEFAULT_ROOT}; {path} is missing"
            )
    images, labels = (read_idx(p) for p in paths)
    if images.shape[1:] != (SIZE, SIZE) or len(images) != len(labels):
        raise ValueError(f"{paths[0]}: expected [N, 28, 28] images and N labels, "
                         f"found {images.shape} and {labels.shape}")  # fmt: skip
    return images, labels


def source_split(root: Path = DEFAULT_ROOT, seed: int = 0) -> dict[str, tuple]:
    """``{split: (file part, scan indices)}``: train and valid share the
    training file (a fixed shuffle, 90/10), test is the t10k file."""
    count = len(scans(Path(root), "train")[1])
    order = np.random.default_rng(seed).permutation(count)
    n_valid = round(VALID_SHARE * count)
    return {
        "train": ("train", np.sort(order[n_valid:])),
        "valid": ("train", np.sort(order[:n_valid])),
        "test": ("t10k", np.arange(len(scans(Path(root), "t10k")[1]))),
    }


def make_scenes(
    count: int, split: str, seed: int, root: Path | str = DEFAULT_ROOT
) -> list[Scene]:
    """``count`` scenes made of the scans of ``split`` (`source_split`),
    deterministic in ``seed``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, received {split!r}")
    root = Path(root)
    part, pool = source_split(root)[split]
    images, labels = scans(root, part)
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    return [_scene(rng, images, labels, pool) for _ in range(count)]


def _scene(rng, images, labels, pool) -> Scene:
    n = int(rng.integers(2, 5))
    layout = LAYOUTS[n][int(rng.integers(len(LAYOUTS[n])))]
    sources = rng.choice(pool, size=n, replace=False)
    canvas = np.zeros((HEIGHT, WIDTH), "uint8")
    words: list[str] = []
    boxes: list[tuple[int, int, int, int] | None] = []
    item = 0
    for row, items in enumerate(layout):
        for column in range(items):
            source = int(sources[item])
            item += 1
            top = row * CELL + int(rng.integers(0, JITTER + 1))
            left = column * CELL + int(rng.integers(0, JITTER + 1))
            scan = images[source]
            region = canvas[top : top + SIZE, left : left + SIZE]
            np.maximum(region, scan, out=region)
            if words:
                words += ["left", "of"] if column else ["above"]
            words += ["a", WORDS[int(labels[source])]]
            boxes += [None] * (len(words) - len(boxes) - 1) + [
                _ink_box(scan, top, left)
            ]
    return Scene(canvas, " ".join(words), tuple(boxes),
                 tuple(int(s) for s in sources))  # fmt: skip


def _ink_box(scan: np.ndarray, top: int, left: int) -> tuple[int, int, int, int]:
    """The box of a scan's nonzero pixels, on the canvas."""
    rows = np.flatnonzero(scan.any(axis=1))
    cols = np.flatnonzero(scan.any(axis=0))
    if not len(rows):  # a blank scan: its whole square
        return top, left, top + SIZE, left + SIZE
    return (top + int(rows[0]), left + int(cols[0]),
            top + int(rows[-1]) + 1, left + int(cols[-1]) + 1)  # fmt: skip
