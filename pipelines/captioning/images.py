"""Image bytes to model input, inside the graph: the same ops train and serve.

`decode_images` checks a ``[batch]`` string tensor of PNG or JPEG files,
decodes each (gray or RGB as configured), resizes it to the configured size
(bilinear, with antialiasing when it shrinks) and scales it to ``[0, 1]``.
A row that is empty, of another format, or cut short is refused with an
``InvalidArgument`` naming the input and the row; the whole request fails,
so no caption is returned for a row that could not be read, and the model
goes on serving the next request.

Example:

>>> import numpy as np, tensorflow as tf
>>> from pipelines.captioning.config import ImageConfig
>>> from pipelines.captioning.digit_strips import png_bytes
>>> gray = (np.arange(24 * 72) % 256).astype("uint8").reshape(24, 72)
>>> images = decode_images(tf.constant([png_bytes(gray)]), ImageConfig())
>>> tuple(images.shape), bool(np.allclose(images[0, ..., 0], gray / 255.0))
((1, 24, 72, 1), True)
"""

from __future__ import annotations

import tensorflow as tf

from pipelines.core.serving import checked_image_pixels

PNG_START, PNG_END = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"
JPEG_START, JPEG_END = b"\xff\xd8\xff", b"\xff\xd9"
MIN_BYTES = len(PNG_START) + len(PNG_END)


def _complete(data: tf.Tensor) -> tf.Tensor:
    """Per row: a PNG with its ``IEND`` trailer or a JPEG with its end marker."""
    png = tf.strings.substr(data, 0, len(PNG_START)) == PNG_START
    png &= tf.strings.substr(data, 12, 4) == b"IHDR"  # the first chunk
    png &= tf.strings.substr(data, -len(PNG_END), len(PNG_END)) == PNG_END
    jpeg = tf.strings.substr(data, 0, len(JPEG_START)) == JPEG_START
    jpeg &= tf.strings.substr(data, -len(JPEG_END), len(JPEG_END)) == JPEG_END
    return png | jpeg


def decode_images(
    data, image, name: str = "image", max_pixels: int | None = None
) -> tf.Tensor:
    """``[B]`` PNG or JPEG bytes to float32 ``[B, height, width, channels]``.

    ``image`` is the `ImageConfig` (size and channels). Checks come first: a
    ``[B]`` vector, every row a complete PNG or JPEG file and, given
    ``max_pixels``, no header declaring more pixels (read before decoding,
    `pipelines.core.serving.checked_image_pixels`). Images are decoded one at
    a time, so a request holds at most one at full size.
    """
    data = tf.convert_to_tensor(data, tf.string)
    rank = tf.rank(data)
    check = tf.debugging.Assert(
        tf.equal(rank, 1),
        [tf.strings.format(
            f"serving input `{name}` must be a vector of image files [batch]; "
            "received rank {}", rank)],
    )  # fmt: skip
    with tf.control_dependencies([check]):
        data = tf.reshape(data, [-1])
    # `substr` fails on a row shorter than its position: such rows (no image
    # is that short) are swapped for a placeholder before the look.
    long_enough = tf.strings.length(data) >= MIN_BYTES
    placeholder = tf.fill(tf.shape(data), "\0" * MIN_BYTES)
    ok = long_enough & _complete(tf.where(long_enough, data, placeholder))
    first_bad = tf.argmin(tf.concat([tf.cast(ok, tf.int32), [0]], 0))
    check = tf.debugging.Assert(
        tf.reduce_all(ok),
        [tf.strings.format(
            f"serving input `{name}` must hold PNG or JPEG files; row {{}} is not "
            "one (empty, another format, or cut short)", first_bad)],
    )  # fmt: skip
    with tf.control_dependencies([check]):
        data = tf.identity(data)
    if max_pixels is not None:
        data = checked_image_pixels(name, data, max_pixels)
    size = [image.height, image.width]

    def one(file):
        pixels = tf.io.decode_image(
            file, channels=image.channels, expand_animations=False
        )
        pixels = tf.image.convert_image_dtype(pixels, tf.float32)  # [0, 1]
        shape = tf.shape(pixels)[:2]
        same = tf.reduce_all(tf.equal(shape, size))
        pixels = tf.cond(
            same,
            lambda: pixels,
            lambda: tf.image.resize(pixels, size, antialias=True),
        )
        return tf.ensure_shape(pixels, [*size, image.channels])

    return tf.map_fn(
        one,
        data,
        fn_output_signature=tf.TensorSpec([*size, image.channels], tf.float32),
        parallel_iterations=1,
    )
