"""The captioner: a CNN over the image, an attention RNN decoder over its grid.

Show, Attend and Tell (Xu et al. 2015) with a small CNN trained from scratch,
or a keras.applications backbone (`ModelConfig.backbone`): the image becomes
a grid of feature vectors with 2-D sinusoidal positions
(`attention_layers.SinusoidalPositionEncoding2D`), flattened into the memory
of an `attention_layers.AttentionDecoder` (GRU, Bahdanau attention, the
context gate ``beta_i``). The GRU starts from the grid's mean. In training
the doubly stochastic penalty (`attention_layers.doubly_stochastic_loss`) is
added to the cross-entropy.

With ``decoder="transformer"`` pre-norm `attention_layers.TransformerDecoderBlock`
layers replace the GRU: they cross-attend to the grid, and decode through
their KV caches (`attention_layers.decoding.transformer_step_fn`).

With ``attention="hard"`` the attention is `attention_layers.HardAttention`
and the caption's mean negative log-likelihood per word trains it by REINFORCE
(`attention_layers.ReinforceLoss`, which adds the whole loss itself: the
trainer then takes the targets as the input ``target_out`` too and is
compiled without a loss).

Like the translation models it exposes ``trainer`` (teacher-forced
``{"image", "target_in"} -> logits``), ``encode(images)``,
``initial_state(encoded)`` and ``step_fn(encoded)`` for
`attention_layers.decoding`, plus ``grid`` (the grid's rows and columns).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
from keras import ops

import attention_layers as al
from attention_layers.decoding import (
    rnn_step_fn,
    transformer_initial_state,
    transformer_step_fn,
)
from pipelines.core.metrics import SequenceNLL
from pipelines.core.text import PAD

# The grid is a few dozen cells wide: wavelengths up to 2 pi 100 tell them apart.
GRID_WAVELENGTH = 100


class TrainingPenalty(keras.layers.Layer):
    """Adds ``weight * mean_b doubly_stochastic_loss(alignments, target_mask)`` to the
    losses in training only (the validation loss stays the cross-entropy the
    early stopping compares) and returns the logits unchanged."""

    def __init__(self, weight: float, **kwargs):
        super().__init__(**kwargs)
        self.weight = float(weight)

    def call(self, logits, alignments, target_mask, training=None):
        if training and self.weight:
            penalty = al.doubly_stochastic_loss(alignments, target_mask)
            self.add_loss(self.weight * ops.mean(penalty))
        return ops.copy(logits)

    def compute_mask(self, inputs, mask=None):
        return None  # the loss skips PAD targets itself (ignore_class)

    def compute_output_shape(self, logits_shape, *_, **__):
        return logits_shape

    def get_config(self):
        return {**super().get_config(), "weight": self.weight}


# The keras.applications backbones `ModelConfig.backbone` offers, and the
# module of each (its `preprocess_input`).
BACKBONES = {
    "MobileNetV2": "mobilenet_v2",
    "ResNet50": "resnet50",
    "EfficientNetB0": "efficientnet",
    "DenseNet121": "densenet",
    "VGG16": "vgg16",
}


@keras.saving.register_keras_serializable(package="attention_pipelines")
class PixelRange(keras.layers.Layer):
    """Each image's pixels stretched to ``[0, 1]``: ``(x - min) / (max -
    min)`` over the image (an image of one value becomes 0), so that a
    caption does not depend on the image's contrast or brightness
    (`ModelConfig.normalize`)."""

    def call(self, images):
        low = ops.min(images, axis=(1, 2, 3), keepdims=True)
        high = ops.max(images, axis=(1, 2, 3), keepdims=True)
        return (images - low) / ops.maximum(high - low, 1e-3)


@keras.saving.register_keras_serializable(package="attention_pipelines")
class ApplicationInput(keras.layers.Layer):
    """Images in ``[0, 1]`` (gray or RGB) to what a keras.applications backbone
    reads: three channels, 0-255, then its module's ``preprocess_input``."""

    def __init__(self, module: str, **kwargs):
        super().__init__(**kwargs)
        self.module = module

    def call(self, images):
        if images.shape[-1] == 1:
            images = ops.repeat(images, 3, axis=-1)
        application = getattr(keras.applications, self.module)
        return application.preprocess_input(ops.cast(images, "float32") * 255.0)

    def compute_output_shape(self, shape):
        return (*shape[:-1], 3)

    def get_config(self):
        return {**super().get_config(), "module": self.module}


def application_backbone(m, image) -> keras.Model:
    """``keras.applications.<m.backbone>`` without its top, its weights from
    ``m.backbone_weights`` (a file) or random; a clear error when the image
    is too small for it."""
    from pipelines.core.errors import PipelineError

    build = getattr(keras.applications, m.backbone)
    weights = m.backbone_weights or None
    if weights is not None and not Path(weights).is_file():
        raise PipelineError(f"model.backbone_weights: no such file: {weights}")
    try:
        backbone = build(include_top=False, weights=weights,
                         input_shape=(image.height, image.width, 3))  # fmt: skip
    except ValueError as error:
        raise PipelineError(
            f"model.backbone={m.backbone} cannot read {image.height} x {image.width} "
            f"images with the weights {weights or 'None'}: {error}"
        ) from None
    backbone.trainable = m.backbone_trainable
    return backbone


class Captioner:
    """CNN encoder, attention decoder; see the module docstring."""

    def __init__(
        self,
        config,
        image,
        vocab_size: int,
        max_length: int,
        hard_inference: str = "argmax",
    ):
        m = config  # ModelConfig
        self.config = m
        images = keras.Input((image.height, image.width, image.channels), name="image")
        target_in = keras.Input((None,), dtype="int32", name="target_in")
        inputs = {"image": images, "target_in": target_in}
        if m.backbone == "cnn":
            self.cnn = [
                layer for stage in range(m.pools + 1) for layer in self._stage(m, stage)
            ]
            self.grid = (image.height // 2**m.pools, image.width // 2**m.pools)
        else:
            backbone = application_backbone(m, image)
            self.cnn = [ApplicationInput(BACKBONES[m.backbone], name="backbone_input"),
                        backbone]  # fmt: skip
            self.grid = tuple(backbone.output.shape[1:3])
        if m.normalize:
            self.cnn.insert(0, PixelRange(name="pixel_range"))
        self.to_memory = keras.layers.Dense(m.units, name="grid_projection")
        self.positions = al.SinusoidalPositionEncoding2D(
            max_wavelength=GRID_WAVELENGTH, name="grid_positions"
        )
        self.max_length = max_length
        self.projection = keras.layers.Dense(vocab_size, name="logits")
        if m.decoder == "transformer":
            logits = self._transformer_decoder(m, images, target_in, vocab_size)
        else:
            logits = self._rnn_decoder(
                m, hard_inference, images, target_in, vocab_size, inputs
            )
        self.trainer = keras.Model(inputs, logits, name="show_attend_tell")

    def _rnn_decoder(self, m, hard_inference, images, target_in, vocab_size, inputs):
        """GRU and attention (soft or hard) over the grid; the logits."""
        hard = m.attention == "hard"
        self.bridge = keras.layers.Dense(m.units, activation="tanh", name="bridge")
        self.embedding = keras.layers.Embedding(
            vocab_size, m.embedding_dim, mask_zero=True, name="word_embedding"
        )
        attention = (
            al.HardAttention(
                m.attention_units,
                sample_probability=m.sample_probability,
                inference=hard_inference,
            )
            if hard
            else al.BahdanauAttention(m.attention_units)
        )
        self.decoder = al.AttentionDecoder(
            al.AttentionRNNCell(
                keras.layers.GRUCell(m.units),
                attention,
                output_units=m.units,
                input_feeding=m.input_feeding,
                context_gate=m.context_gate,
            ),
            name="decoder",
        )
        self.dropout = keras.layers.Dropout(m.dropout, name="dropout")
        memory = self._encode(images)
        outputs, alignments, *sampled = self.decoder(
            self.embedding(target_in),
            memory,
            initial_state=[self._first_state(memory)],
            return_attention_scores=True,
            return_log_prob=hard,
        )
        logits = self.projection(self.dropout(outputs))
        logits = TrainingPenalty(m.doubly_stochastic, name="doubly_stochastic")(
            logits, alignments, ops.not_equal(target_in, PAD)
        )
        if hard:
            target_out = keras.Input((None,), dtype="int32", name="target_out")
            inputs["target_out"] = target_out
            logits = al.ReinforceLoss(
                SequenceNLL(pad_id=PAD),
                baseline_decay=m.baseline_decay,
                entropy_weight=m.entropy_weight,
                name="reinforce",
            )(target_out, logits, *sampled)
        return logits

    def _transformer_decoder(self, m, images, target_in, vocab_size):
        """Pre-norm Transformer decoder blocks over the words, cross-attending
        to the grid (Vaswani et al. 2017); the logits."""
        self.embedding = keras.layers.Embedding(
            vocab_size, m.units, name="word_embedding"
        )
        self.word_positions = al.SinusoidalPositionEncoding(name="word_positions")
        self.blocks = [
            al.TransformerDecoderBlock(
                num_heads=m.num_heads, intermediate_dim=m.intermediate_dim,
                dropout=m.dropout, norm_first=True, name=f"decoder_{i}",
            )
            for i in range(m.num_layers)
        ]  # fmt: skip
        self.decoder_norm = keras.layers.LayerNormalization(name="decoder_norm")
        memory = self._encode(images)
        x = self.embedding(target_in)
        x = x + ops.cast(self.word_positions(x), x.dtype)
        for block in self.blocks:
            x = block(x, memory, decoder_padding_mask=ops.not_equal(target_in, PAD))
        return self.projection(self.decoder_norm(x))

    @staticmethod
    def _stage(m, stage: int) -> list:
        last = stage == m.pools
        convolutions = [
            keras.layers.Conv2D(m.filters * 2**stage, m.grid_kernel if last else 3,
                                padding="same", activation="relu",
                                name=f"conv_{stage}_{i}")
            for i in range(2)
        ]  # fmt: skip
        return (
            convolutions
            if last
            else convolutions + [keras.layers.MaxPool2D(name=f"pool_{stage}")]
        )

    def _encode(self, images, training=None):
        x = images
        for layer in self.cnn:
            x = layer(x)
        x = self.to_memory(x)
        x = x + self.positions(x)
        return ops.reshape(x, (-1, self.grid[0] * self.grid[1], self.config.units))

    def _first_state(self, memory):
        """The GRU's first state, from the grid's mean (Xu et al.)."""
        return self.bridge(ops.mean(memory, axis=1))

    def encode(self, images) -> dict[str, Any]:
        """The grid as memory ``[B, H' * W', units]``, its mask, and the GRU's
        first state (RNN decoder)."""
        memory = self._encode(images, training=False)
        mask = ops.ones(ops.shape(memory)[:2], dtype="bool")
        encoded = {"memory": memory, "mask": mask}
        if self.config.decoder == "rnn":
            encoded["state"] = self._first_state(memory)
        return encoded

    def initial_state(self, encoded: dict[str, Any]):
        batch = ops.shape(encoded["memory"])[0]
        if self.config.decoder == "transformer":
            return transformer_initial_state(
                self.blocks, batch, self.max_length, encoded["memory"], encoded["mask"]
            )
        return self.decoder.initial_states(batch, [encoded["state"]])

    def step_fn(self, encoded: dict[str, Any]):
        """``step_fn(ids, state) -> (logits, state, alignment)``; see decoding.
        A Transformer's memory travels in the state (its caches)."""
        if self.config.decoder == "transformer":
            return transformer_step_fn(
                self.embedding,
                self.blocks,
                lambda x: self.projection(self.decoder_norm(x)),
                self.word_positions,
            )
        return rnn_step_fn(
            self.embedding,
            self.decoder.cell,
            self.projection,
            encoded["memory"],
            encoded["mask"],
        )
