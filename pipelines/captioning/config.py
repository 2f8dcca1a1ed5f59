"""The image-captioning task's configuration and presets.

A run is one `CaptioningConfig`: the data (digit strips generated from
scikit-learn's scans, or the user's folder of images), the image size the
model reads, the caption vocabulary, the CNN encoder and the attention
decoder (Show, Attend and Tell: soft attention, the context gate, the doubly
stochastic penalty), beside the shared ``train``, ``decode`` and ``export``
sections.

Example:

>>> from pipelines.core.config import apply_overrides
>>> from pipelines.captioning.config import preset
>>> config = apply_overrides(preset("digits"), ["model.units=64"])
>>> config.model.units, config.data.source, config.image.height
(64, 'digits:20000', 24)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipelines.core import config as core_config
from pipelines.core.config import (
    POSITIVE,
    DecodeConfig,
    RunConfig,
    TrainConfig,
)
from pipelines.core.errors import ConfigError


@dataclass
class AugmentConfig:
    """Random changes to each training image (`pipelines.captioning.augment`),
    drawn anew every epoch; evaluation, ``predict`` and the export never see
    them. Each is off at its default.

    * ``scale``: the image's content scaled by a factor in ``[1 / (1 + scale),
      1 + scale]`` about its centre (Keras' ``RandomZoom``); ``stretch``
      draws the width's factor from ``[1 / (1 + stretch), 1 + stretch]``
      apart from the height's (0: the aspect is kept);
    * ``shift``: moved by up to this fraction of the height and the width
      (``RandomTranslation``); uncovered pixels are filled by ``fill``
      (``constant`` is black, the background of digit strips and scenes);
    * ``contrast``: the contrast multiplied by a factor in ``[1 - contrast,
      1 + contrast]`` (``RandomContrast``), ``brightness`` shifted by up to
      this fraction of the range (``RandomBrightness``);
    * ``blur``: blurred by a Gaussian of up to this sigma in pixels
      (``RandomGaussianBlur``, a 5 x 5 kernel), as an image upscaled from a
      smaller one looks;
    * ``jpeg_quality``: below 100, re-encoded as a JPEG of a random quality
      from it to 100 (``tf.image.random_jpeg_quality``).

    With boxes (digit strips, scenes), an image whose zoom or shift would put
    an object's box on the image's edge (cut it, or push it out) keeps its
    pixels that epoch, so a caption never names a digit that is not whole
    in the picture. A user folder has no boxes: there nothing is checked,
    so keep ``scale`` and ``shift`` small if the captions name things near
    the edges.
    """

    scale: float = field(default=0.0, metadata={"range": (0.0, 3.0)})
    stretch: float = field(default=0.0, metadata={"range": (0.0, 3.0)})
    shift: float = field(default=0.0, metadata={"range": (0.0, 0.5)})
    fill: Literal["constant", "nearest", "reflect"] = "constant"
    contrast: float = field(default=0.0, metadata={"range": (0.0, 1.0)})
    brightness: float = field(default=0.0, metadata={"range": (0.0, 1.0)})
    blur: float = field(default=0.0, metadata={"range": (0.0, 5.0)})
    jpeg_quality: int = field(default=100, metadata={"range": (1, 100)})

    @property
    def on(self) -> bool:
        return bool(
            self.scale or self.stretch or self.shift or self.contrast
            or self.brightness or self.blur or self.jpeg_quality < 100
        )  # fmt: skip


@dataclass
class DataConfig(core_config.SplitConfig):
    """``digits:N`` (N training strips, `pipelines.captioning.digit_strips`),
    ``fashion:N`` (N Fashion-MNIST scenes, `pipelines.captioning.fashion_scenes`,
    read from ``fashion_root``: Debian's ``dataset-fashion-mnist``) or
    ``folder:PATH`` (the user's images and a ``captions.jsonl`` or
    ``captions.csv`` beside them; `pipelines.captioning.data.read_folder`).

    Digit strips and scenes: ``valid_size`` and ``test_size`` images are
    made from the held-out scans. A folder: ``valid_fraction`` and
    ``test_fraction`` of its images are held out, all captions of an image in
    one split. ``augment`` changes the training images (`AugmentConfig`).
    """

    source: str = "digits:20000"
    valid_size: int = field(default=1000, metadata={"range": (0, None)})
    test_size: int = field(default=1000, metadata=POSITIVE)
    max_digits: int = field(default=5, metadata={"range": (1, 5)})
    fashion_root: str = "/usr/share/datasets/fashion-mnist"
    augment: AugmentConfig = field(default_factory=AugmentConfig)


@dataclass
class ImageConfig:
    """The size every image is decoded and resized to (in the graph, both
    in training and in the export), and its channels (1 gray, 3 RGB)."""

    height: int = field(default=24, metadata={"range": (8, 1024)})
    width: int = field(default=72, metadata={"range": (8, 1024)})
    channels: Literal[1, 3] = 1


@dataclass
class TokenizerConfig:
    """The caption words (`pipelines.core.text.WordTokenizer`); captions
    longer than ``max_words`` are cut, and decoding writes at most that
    many words."""

    vocab_size: int = field(default=5000, metadata={"range": (8, None)})
    max_words: int = field(default=16, metadata=POSITIVE)


@dataclass
class ModelConfig:
    """A CNN encoder and an attention RNN decoder (Xu et al. 2015).

    The CNN has ``pools`` stages of two 3x3 convolutions (``filters``,
    doubled at each stage) and a 2x2 max-pool, then one more pair of
    convolutions at the grid's resolution, ``grid_kernel`` wide: an image of
    ``H x W`` becomes a grid of ``H / 2^pools x W / 2^pools`` cells,
    projected to ``units`` features with 2-D sinusoidal positions added. The
    decoder's GRU starts from the grid's mean (through a ``tanh`` layer), as
    in the paper.

    ``attention="hard"`` samples one cell per word in training (Xu et al.'s
    stochastic hard attention), trained by REINFORCE
    (`attention_layers.ReinforceLoss`: the caption's mean negative
    log-likelihood per word, `SequenceNLL`, as the cost, a moving-average baseline with
    ``baseline_decay``, an entropy bonus of ``entropy_weight``); each caption
    samples with ``sample_probability`` and otherwise attends softly (Xu et
    al.: 0.5). Decoding attends to the most probable cell, or with
    ``decode.hard_attention=soft`` to all of them by their probabilities. It
    needs ``input_feeding=False``.

    ``backbone`` replaces the small CNN with a keras.applications network
    without its top (`pipelines.captioning.model.BACKBONES`), its last
    feature map as the grid; its weights are random, or read from
    ``backbone_weights`` (a weights file, such as Keras' ImageNet ``notop``
    files), and ``backbone_trainable=false`` freezes them. Gray images are
    repeated to three channels and given the network's own preprocessing.
    ``pools``, ``filters`` and ``grid_kernel`` are the small CNN's.

    ``decoder="transformer"`` replaces the GRU with ``num_layers`` pre-norm
    Transformer decoder blocks (``num_heads`` heads, a feed-forward layer of
    ``intermediate_dim``, width ``units``) that cross-attend to the grid;
    the exported attention is the last block's, averaged over its heads. Hard
    attention, the context gate and the doubly stochastic penalty belong to
    the RNN decoder.

    ``normalize`` stretches each image's pixels to ``[0, 1]`` (its darkest
    to 0, its brightest to 1) before the CNN, so a caption does not depend
    on the image's contrast or brightness.

    ``grid_kernel`` sets how far a cell sees. With two pools a cell is 4
    pixels wide and sees 16 pixels with ``grid_kernel=1``, 32 with 3; with
    one pool a cell is 2 pixels wide and sees 14 pixels with 3, 22 with 5
    (see docs/pipelines/results/captioning.md for what each did to the localisation).
    """

    backbone: Literal[
        "cnn", "MobileNetV2", "ResNet50", "EfficientNetB0", "DenseNet121", "VGG16"
    ] = "cnn"
    backbone_weights: str = ""
    backbone_trainable: bool = True
    normalize: bool = False
    filters: int = field(default=16, metadata=POSITIVE)
    pools: int = field(default=2, metadata={"range": (0, 5)})
    grid_kernel: Literal[1, 3, 5] = 3
    units: int = field(default=128, metadata=POSITIVE)
    attention_units: int = field(default=64, metadata=POSITIVE)
    embedding_dim: int = field(default=32, metadata=POSITIVE)
    decoder: Literal["rnn", "transformer"] = "rnn"
    num_layers: int = field(default=2, metadata=POSITIVE)  # Transformer
    num_heads: int = field(default=4, metadata=POSITIVE)  # Transformer
    intermediate_dim: int = field(default=256, metadata=POSITIVE)  # Transformer
    context_gate: bool = True  # beta_i on the context
    attention: Literal["soft", "hard"] = "soft"
    sample_probability: float = field(default=0.5, metadata={"range": (0.01, 1.0)})
    baseline_decay: float = field(default=0.9, metadata={"range": (0.0, 0.999)})
    entropy_weight: float = field(default=0.001, metadata={"range": (0.0, None)})
    input_feeding: bool = False
    # lambda of the doubly stochastic penalty (0: off), added in training only.
    # It sums over the grid's cells: with far more cells than words (108 and
    # 6 on a digit strip) it pulls each word's attention flat; keep it small.
    doubly_stochastic: float = field(default=0.0, metadata={"range": (0.0, None)})
    dropout: float = field(default=0.0, metadata={"range": (0.0, 0.95)})


@dataclass
class CaptionDecodeConfig(DecodeConfig):
    """Decoding; ``hard_attention`` is how a ``model.attention=hard`` model
    reads the grid at evaluation and serving: the most probable cell
    (``argmax``) or the expected context over every cell (``soft``, Xu et
    al.'s deterministic approximation). The first word's attention peaks on
    the same cell either way; after it the contexts differ, and so may the
    captions and the peaks."""

    hard_attention: Literal["argmax", "soft"] = "argmax"


@dataclass
class CaptioningConfig(RunConfig):
    name: str = "digits"
    data: DataConfig = field(default_factory=DataConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    decode: CaptionDecodeConfig = field(default_factory=CaptionDecodeConfig)

    def validate(self) -> CaptioningConfig:
        super().validate()
        cells = 2**self.model.pools
        small_cnn = self.model.backbone == "cnn"
        if small_cnn and (self.image.height % cells or self.image.width % cells):
            raise ConfigError(
                f"config: `image.height` and `image.width` must be multiples of "
                f"2^model.pools = {cells}; received {self.image.height} x "
                f"{self.image.width}"
            )
        m = self.model
        if m.decoder == "transformer" and (
            m.attention == "hard" or m.doubly_stochastic
        ):
            raise ConfigError(
                "config: `model.decoder=transformer` attends with its own "
                "multi-head cross-attention: it takes neither `model.attention=hard` "
                "nor `model.doubly_stochastic`; received attention="
                f"{m.attention}, doubly_stochastic={m.doubly_stochastic}"
            )
        if m.decoder == "transformer" and m.units % m.num_heads:
            raise ConfigError(
                f"config: `model.units` ({m.units}) must be a multiple of "
                f"`model.num_heads` ({m.num_heads}) for the Transformer decoder"
            )
        if self.model.attention == "hard" and self.model.input_feeding:
            raise ConfigError(
                "config: `model.attention=hard` needs `model.input_feeding=false` "
                "(the sampled cells are drawn once the recurrence has run); "
                "received input_feeding=true"
            )
        return self


def _digits() -> CaptioningConfig:
    """Strips of 1 to 5 digits, 24 x 72 pixels; a fine grid (one pooling
    stage: 12 x 36 cells of 2 pixels, each seeing 22 with 5-wide grid
    convolutions); each image's pixels stretched to [0, 1]; training images
    zoomed by up to 1.8 either way, stretched, shifted, blurred and
    JPEG-compressed (`AugmentConfig`), so that the model reads digit sizes
    and layouts its generator never draws (docs/pipelines/captioning.md,
    Robustness)."""
    return CaptioningConfig(
        name="digits",
        data=DataConfig(augment=AugmentConfig(
            scale=0.8, stretch=0.3, shift=0.05, blur=1.0, jpeg_quality=20)),
        model=ModelConfig(pools=1, grid_kernel=5, normalize=True),
        train=TrainConfig(
            epochs=14,
            batch_size=64,
            learning_rate=2e-3,
            early_stopping_patience=4,
            lr_reduce_factor=0.5,
            lr_reduce_patience=2,
        ),
        decode=CaptionDecodeConfig(
            beam_width=4, default_beam_width=1, length_penalty=0.0
        ),
    )  # fmt: skip


def _digits_quick() -> CaptioningConfig:
    """The `digits` task (strips of 1 to 5 digits, every caption word boxed)
    with its decoding, on smaller strips, a coarser grid (two pooling
    stages: 4 x 12 cells) and a fraction of its training, sized for a demo
    of a few minutes on two CPU cores: 16 x 48 strips (digits of 6 to 9
    pixels; the scans are 8 x 8), 8,000 training strips, 12 epochs of
    batches of 32, the rate halved after a worse validation loss; pixels
    stretched to [0, 1], training images zoomed by up to 1.3 either way,
    blurred and JPEG-compressed."""
    return CaptioningConfig(
        name="digits-quick",
        data=DataConfig(
            source="digits:8000",
            valid_size=500,
            test_size=1000,
            augment=AugmentConfig(scale=0.3, blur=0.5, jpeg_quality=30),
        ),
        model=ModelConfig(normalize=True),
        image=ImageConfig(height=16, width=48),
        tokenizer=TokenizerConfig(max_words=6),
        train=TrainConfig(
            epochs=12,
            batch_size=32,
            learning_rate=3e-3,
            early_stopping_patience=3,
            lr_reduce_factor=0.5,
            lr_reduce_patience=1,
        ),
        decode=CaptionDecodeConfig(
            beam_width=4, default_beam_width=1, length_penalty=0.0
        ),
    )


def _tiny() -> CaptioningConfig:
    return CaptioningConfig(
        name="tiny",
        data=DataConfig(source="digits:300", valid_size=40, test_size=40, max_digits=3),
        image=ImageConfig(height=16, width=48),
        tokenizer=TokenizerConfig(max_words=5),
        model=ModelConfig(
            filters=4, pools=1, units=8, attention_units=8, embedding_dim=8
        ),  # fmt: skip
        train=TrainConfig(epochs=1, batch_size=32, early_stopping_patience=1),
        decode=CaptionDecodeConfig(
            beam_width=3, default_beam_width=2, eval_batch_size=64
        ),
    )


def _fashion() -> CaptioningConfig:
    """The `digits` run's training and decoding, on 64 x 64 scenes."""
    config = _digits()
    config.name = "fashion"
    config.data = DataConfig(source="fashion:20000")
    config.image = ImageConfig(height=64, width=64)
    config.tokenizer = TokenizerConfig(max_words=13)  # 4 items: 13 words
    config.model = ModelConfig(pools=3)
    return config


PRESETS = {
    "digits": _digits,
    "digits-quick": _digits_quick,
    "fashion": _fashion,
    "tiny": _tiny,
}


def preset(name: str) -> CaptioningConfig:
    """A fresh copy of the named preset (one of `PRESETS`)."""
    return core_config.preset(PRESETS, name)
