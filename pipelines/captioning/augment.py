"""Training-image augmentation from Keras' preprocessing layers, boxes alongside.

`Augmenter` applies a `AugmentConfig`'s changes to a batch of decoded
images in the training input pipeline: ``RandomZoom`` and
``RandomTranslation`` move the pixels and each object's box together (Keras'
own bounding-box transforms); ``RandomContrast``, ``RandomBrightness`` and
``RandomGaussianBlur`` change the tones; ``tf.image.random_jpeg_quality``
re-encodes. An image whose zoom or shift would cut one of its objects (the
box ends on the image's edge after the move) keeps its untouched pixels for
that batch: its caption still names only what is whole in the picture.

Nothing here is written by hand that Keras or tf.image provide; what is ours
is the choice of layers, the mapping from the config's scale range to
``RandomZoom``'s factors, and the rule that keeps objects whole.

Example:

>>> import numpy as np
>>> from pipelines.captioning.config import AugmentConfig
>>> augment = Augmenter(AugmentConfig(scale=0.5, shift=0.1), seed=0)
>>> images = np.zeros((2, 24, 72, 1), "float32")
>>> boxes = np.tile(np.float32([[6, 30, 18, 42]]), (2, 1, 1))  # one digit each
>>> out, moved = augment(images, boxes, has_boxes=np.array([True, True]))
>>> tuple(out.shape), tuple(moved.shape)
((2, 24, 72, 1), (2, 1, 4))
"""

from __future__ import annotations

import keras
import tensorflow as tf


def zoom_factors(scale: float) -> tuple[float, float]:
    """``RandomZoom``'s ``(lower, upper)`` for content scaled by a factor in
    ``[1 / (1 + scale), 1 + scale]``.

    Keras samples the input at coordinates stretched by ``z`` drawn from
    ``[1 + lower, 1 + upper]``, which scales the content by ``1 / z``.

    >>> zoom_factors(0.5)
    (-0.3333333333333333, 0.5)
    """
    return 1.0 / (1.0 + scale) - 1.0, scale


class Augmenter:
    """The configured Keras layers, called on a batch in a `tf.data` map.

    ``augmenter(images, boxes, has_boxes)`` takes float images ``[B, H, W, C]``
    in ``[0, 1]``, boxes ``[B, N, 4]`` as ``(top, left, bottom, right)`` in
    pixels (pad an image's list with one of its own boxes) and ``has_boxes``
    ``[B]`` (False: nothing to keep whole); it returns the new images and
    the boxes where they moved to.
    """

    def __init__(self, config, seed: int = 0):
        self.config = c = config
        geometry = []
        box_format = {"bounding_box_format": "yxyx"}
        if c.scale or c.stretch:
            geometry.append(keras.layers.RandomZoom(
                zoom_factors(c.scale),
                zoom_factors(c.stretch) if c.stretch else None,
                fill_mode=c.fill, seed=seed, **box_format,
            ))  # fmt: skip
        if c.shift:
            geometry.append(keras.layers.RandomTranslation(
                c.shift, c.shift, fill_mode=c.fill, seed=seed + 1, **box_format,
            ))  # fmt: skip
        self.geometry = geometry
        tones = []
        if c.contrast:
            tones.append(keras.layers.RandomContrast(
                c.contrast, value_range=(0, 1), seed=seed + 2))  # fmt: skip
        if c.brightness:
            tones.append(keras.layers.RandomBrightness(
                c.brightness, value_range=(0, 1), seed=seed + 3))  # fmt: skip
        if c.blur:
            tones.append(keras.layers.RandomGaussianBlur(
                1.0, kernel_size=5, sigma=(0.0, c.blur), value_range=(0, 1),
                seed=seed + 4))  # fmt: skip
        self.tones = tones
        self.seed = seed

    def __call__(self, images, boxes, has_boxes):
        images = tf.convert_to_tensor(images, tf.float32)
        boxes = tf.convert_to_tensor(boxes, tf.float32)
        has_boxes = tf.convert_to_tensor(has_boxes, tf.bool)
        if self.geometry:
            data = {
                "images": images,
                "bounding_boxes": {
                    "boxes": boxes,
                    "labels": tf.zeros(tf.shape(boxes)[:2], tf.int32),
                },
            }
            for layer in self.geometry:
                data = layer(data, training=True)
            moved = tf.convert_to_tensor(data["bounding_boxes"]["boxes"], tf.float32)
            whole = ~has_boxes | ~on_edge(moved, tf.shape(images)[1:3])
            images = tf.where(whole[:, None, None, None], data["images"], images)
            boxes = tf.where(whole[:, None, None], moved, boxes)
        for layer in self.tones:
            images = tf.convert_to_tensor(layer(images, training=True))
        if self.config.jpeg_quality < 100:
            quality = self.config.jpeg_quality
            images = tf.map_fn(
                lambda image: tf.image.random_jpeg_quality(
                    image, quality, 100, seed=self.seed),
                images,
            )  # fmt: skip
        return tf.ensure_shape(images, images.shape), boxes

    def on_features(self, features, targets):
        """A `tf.data` map over batches of ``(features, targets)`` whose
        features hold ``boxes`` and ``has_boxes``: augments ``image`` and
        drops the boxes."""
        features = dict(features)
        boxes, has_boxes = features.pop("boxes"), features.pop("has_boxes")
        features["image"], _ = self(features["image"], boxes, has_boxes)
        return features, targets


def on_edge(boxes, size) -> tf.Tensor:
    """``[B]``: whether any of an image's boxes ``[B, N, 4]`` (top, left,
    bottom, right) reaches the edge of an image of ``size`` (height, width):
    Keras clips a box that a move cuts, so a cut box ends on the edge."""
    size = tf.cast(size, tf.float32)
    top, left, bottom, right = tf.unstack(boxes, axis=-1)
    edge = (top <= 0) | (left <= 0) | (bottom >= size[0]) | (right >= size[1])
    return tf.reduce_any(edge, axis=-1)
