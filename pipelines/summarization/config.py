"""The summarization task's configuration and presets.

A run is one `SummarizationConfig`: data, tokenizer (one word vocabulary for
both sides, which the copy mechanism needs), model (``variant`` baseline,
pointer or coverage), the coverage phase, and decoding, beside the shared
``train`` and ``export`` sections.

Example:

>>> from pipelines.core.config import apply_overrides
>>> from pipelines.summarization.config import preset
>>> config = apply_overrides(preset("tiny"), ["model.variant=pointer"])
>>> config.model.variant, config.tokenizer.vocab_size
('pointer', 120)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pipelines.core import config as core_config
from pipelines.core.config import (
    POSITIVE,
    DecodeConfig,
    RunConfig,
    TrainConfig,
)
from pipelines.core.errors import ConfigError

VARIANTS = ("baseline", "pointer", "coverage")


@dataclass
class DataConfig(core_config.SplitConfig):
    """Which corpus (``source``, one of `pipelines.summarization.data.SPECS`),
    filtered and split."""

    source: str = "debian"
    max_source_words: int = field(default=400, metadata=POSITIVE)
    max_target_words: int = field(default=40, metadata=POSITIVE)
    valid_fraction: float = core_config.fraction(0.05)
    test_fraction: float = core_config.fraction(0.05)
    limit: int | None = field(default=None, metadata=POSITIVE)  # first N pairs


@dataclass
class TokenizerConfig:
    """One word vocabulary (`pipelines.core.text.WordTokenizer`) for both sides."""

    vocab_size: int = field(default=20000, metadata={"range": (8, None)})
    max_source_tokens: int = field(default=120, metadata=POSITIVE)  # longer: cut
    max_target_tokens: int = field(default=24, metadata=POSITIVE)  # decoding stops


@dataclass
class ModelConfig:
    """The pointer-generator network (`PointerSeq2Seq`) and its variants, or
    the Transformer with the copy layer (`TransformerPointer`; baseline or
    pointer)."""

    architecture: Literal["rnn", "transformer"] = "rnn"
    variant: Literal["baseline", "pointer", "coverage"] = "coverage"
    embedding_dim: int = field(default=128, metadata=POSITIVE)  # transformer width
    units: int = field(default=128, metadata=POSITIVE)  # encoder GRU per direction
    attention_units: int = field(default=128, metadata=POSITIVE)
    num_layers: int = field(default=2, metadata=POSITIVE)  # transformer only
    num_heads: int = field(default=4, metadata=POSITIVE)  # transformer only
    intermediate_dim: int = field(default=256, metadata=POSITIVE)  # transformer
    dropout: float = field(default=0.0, metadata={"range": (0.0, 0.95)})

    def validate(self, where: str = "model.") -> None:
        if self.architecture == "transformer" and self.variant == "coverage":
            raise ConfigError(
                f"config: `{where}variant` coverage is the RNN's; with "
                f"`{where}architecture` transformer choose baseline or pointer."
            )
        if self.architecture == "transformer" and self.embedding_dim % self.num_heads:
            raise ConfigError(
                f"config: `{where}embedding_dim` ({self.embedding_dim}) must be a "
                f"multiple of `{where}num_heads` ({self.num_heads})."
            )


@dataclass
class CoverageConfig:
    """The final phase of a ``coverage`` run: the coverage loss switched on.

    The last ``epochs`` of ``train.epochs`` train with the loss weighted by
    ``weight``; with ``epochs >= train.epochs`` it is on from the start, with
    0 never (the attention still sees the coverage vector).
    """

    epochs: int = field(default=1, metadata={"range": (0, None)})
    weight: float = field(default=1.0, metadata={"range": (0.0, None)})  # lambda


@dataclass
class SummaryDecodeConfig(DecodeConfig):
    """Beam search; ``min_length`` counts summary tokens before ``[END]``."""

    min_length: int = field(default=0, metadata={"range": (0, None)})


@dataclass
class SummarizationConfig(RunConfig):
    name: str = "debian"
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    coverage: CoverageConfig = field(default_factory=CoverageConfig)
    decode: SummaryDecodeConfig = field(default_factory=SummaryDecodeConfig)

    RENAMED: ClassVar[dict[str, str]] = {"data.corpus": "data.source"}

    def validate(self) -> SummarizationConfig:
        super().validate()
        if self.decode.min_length > self.tokenizer.max_target_tokens:
            raise ConfigError(
                "config: `decode.min_length` must be at most "
                f"`tokenizer.max_target_tokens` ({self.tokenizer.max_target_tokens})"
                f", received {self.decode.min_length}."
            )
        return self


def _debian() -> SummarizationConfig:
    # Sized for a CPU: 2,000 steps of 64 pairs (about two passes over the
    # training split), the last 500 with the coverage loss
    # (docs/pipelines/results/summarization.md has the measured table and times).
    return SummarizationConfig(
        name="debian",
        data=DataConfig(
            source="debian",
            max_source_words=400,
            max_target_words=30,
            valid_fraction=0.02,
        ),
        tokenizer=TokenizerConfig(
            vocab_size=8000, max_source_tokens=64, max_target_tokens=16
        ),
        model=ModelConfig(embedding_dim=64, units=64, attention_units=64),
        train=TrainConfig(
            epochs=4, steps_per_epoch=500, batch_size=64, learning_rate=2e-3
        ),
        coverage=CoverageConfig(epochs=1, weight=1.0),
        decode=SummaryDecodeConfig(
            beam_width=4, default_beam_width=4, length_penalty=1.0, min_length=3
        ),
    )


def _variant(base, name: str, variant: str):
    def make() -> SummarizationConfig:
        config = base()
        return dataclasses.replace(
            config,
            name=name,
            model=dataclasses.replace(config.model, variant=variant),
        )

    return make


def _blurbs() -> SummarizationConfig:
    return SummarizationConfig(
        name="blurbs",
        data=DataConfig(source="blurbs:6000", max_source_words=80),
        tokenizer=TokenizerConfig(
            vocab_size=400, max_source_tokens=64, max_target_tokens=16
        ),
        model=ModelConfig(embedding_dim=32, units=48, attention_units=48),
        train=TrainConfig(epochs=3, batch_size=64, learning_rate=3e-3),
        decode=SummaryDecodeConfig(
            beam_width=4, default_beam_width=4, length_penalty=1.0, min_length=3
        ),
    )


def _tiny() -> SummarizationConfig:
    return SummarizationConfig(
        name="tiny",
        data=DataConfig(source="blurbs:300", test_fraction=0.1, max_source_words=80),
        tokenizer=TokenizerConfig(
            vocab_size=120, max_source_tokens=48, max_target_tokens=12
        ),
        model=ModelConfig(embedding_dim=8, units=8, attention_units=8),
        train=TrainConfig(epochs=2, batch_size=32, early_stopping_patience=1),
        coverage=CoverageConfig(epochs=1, weight=1.0),
        decode=SummaryDecodeConfig(
            beam_width=3, default_beam_width=2, eval_batch_size=64, min_length=1
        ),
    )


PRESETS = {
    "debian": _debian,
    "debian-pointer": _variant(_debian, "debian-pointer", "pointer"),
    "debian-baseline": _variant(_debian, "debian-baseline", "baseline"),
    "blurbs": _blurbs,
    "blurbs-pointer": _variant(_blurbs, "blurbs-pointer", "pointer"),
    "blurbs-baseline": _variant(_blurbs, "blurbs-baseline", "baseline"),
    "tiny": _tiny,
}


def preset(name: str) -> SummarizationConfig:
    """A fresh copy of the named preset (one of `PRESETS`)."""
    return core_config.preset(PRESETS, name)
