"""The extractive question-answering task's configuration and presets.

A run is one `ExtractiveConfig`: the data (passages over real country facts
from `pipelines.extractive.countries`, or the user's JSON Lines), the word
vocabulary with its hashed out-of-vocabulary buckets and the lengths it
keeps, and the span model (BiDAF over BiGRU encodings, a span pointer),
beside the shared ``train`` and ``export`` sections.

Example:

>>> from pipelines.core.config import apply_overrides
>>> from pipelines.extractive.config import preset
>>> config = apply_overrides(preset("tiny"), ["model.units=8"])
>>> config.model.units, config.data.source
(8, 'countries')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipelines.core import config as core_config
from pipelines.core.config import POSITIVE, RunConfig, TrainConfig


@dataclass
class DataConfig(core_config.SplitConfig):
    """``countries`` (templated passages over `countryinfo`'s facts, split by
    country; `pipelines.extractive.countries.load_countries`) or ``jsonl:PATH``
    (the user's passages, `pipelines.extractive.countries.read_span_jsonl`).

    ``passages_per_country`` is how many passages (other sentence orders and
    phrasings) each training country gets; ``limit`` keeps the first
    questions of each split (the tiny preset). The fractions split the
    countries, or a JSON Lines file's passages.
    """

    source: str = "countries"
    passages_per_country: int = field(default=4, metadata=POSITIVE)
    limit: int | None = field(default=None, metadata=POSITIVE)
    test_fraction: float = core_config.fraction(0.2)


@dataclass
class TokenizerConfig:
    """Words and punctuation with their offsets
    (`pipelines.extractive.tokenizer.SpanTokenizer`): the ``vocab_size - 4``
    most frequent training words get ids (4 are reserved), every other word
    one of ``oov_buckets`` hashed ids (so an unknown name in the question and
    in the passage still share an id); the model embeds ``vocab_size +
    oov_buckets`` ids. Passages are read up to
    ``max_context_tokens``, questions up to ``max_question_tokens``."""

    vocab_size: int = field(default=4000, metadata={"range": (8, None)})
    oov_buckets: int = field(default=200, metadata=POSITIVE)
    max_context_tokens: int = field(default=256, metadata=POSITIVE)
    max_question_tokens: int = field(default=32, metadata=POSITIVE)


@dataclass
class ModelConfig:
    """BiDAF (Seo et al. 2017): a shared encoder of passage and question (the
    passage words carry a flag: does the word occur in the question),
    `attention_layers.BidirectionalAttentionFlow`, two modelling layers and
    `attention_layers.SpanPointer`. The encoder and modelling layers are the
    paper's BiGRUs (default) or Transformer blocks (``encoder: transformer``).
    Answers are at most ``max_span_length`` tokens
    (`attention_layers.best_span`)."""

    encoder: Literal["gru", "transformer"] = "gru"
    encoder_blocks: int = field(default=2, metadata=POSITIVE)  # transformer only
    heads: int = field(default=4, metadata=POSITIVE)  # transformer only
    embed_dim: int = field(default=64, metadata=POSITIVE)
    units: int = field(default=32, metadata=POSITIVE)  # encodings are 2 * units wide
    dropout: float = field(default=0.1, metadata={"range": (0.0, 0.9)})
    max_span_length: int = field(default=12, metadata=POSITIVE)
    eval_batch_size: int = field(default=64, metadata=POSITIVE)


@dataclass
class ExtractiveConfig(RunConfig):
    name: str = "countries"
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)


def _countries() -> ExtractiveConfig:
    return ExtractiveConfig(
        train=TrainConfig(
            epochs=15,
            batch_size=32,
            learning_rate=2e-3,
            early_stopping_patience=3,
            lr_reduce_factor=0.5,
            lr_reduce_patience=1,
        ),
    )


def _countries_quick() -> ExtractiveConfig:
    """The `countries` task (the same countries, validation and test
    questions) with its model, trained briefly, sized for a demo of a few
    minutes on two CPU cores: 2 passages per training country, 3 epochs of
    batches of 64 at twice the rate, halved after a worse validation
    loss."""
    return ExtractiveConfig(
        name="countries-quick",
        data=DataConfig(passages_per_country=2),
        train=TrainConfig(
            epochs=3,
            batch_size=64,
            learning_rate=4e-3,
            early_stopping_patience=2,
            lr_reduce_factor=0.5,
            lr_reduce_patience=1,
        ),
    )


def _tiny() -> ExtractiveConfig:
    return ExtractiveConfig(
        name="tiny",
        data=DataConfig(passages_per_country=1, limit=40),
        tokenizer=TokenizerConfig(vocab_size=300, oov_buckets=16),
        # No dropout: the contract compares runs on one and two devices. The
        # BiGRUs, not the Transformer blocks: with these, Adam's update of a
        # rarely seen word's embedding (a gradient near its epsilon) differed
        # by 7e-5 between one device and two, past the contract's tolerance.
        model=ModelConfig(
            embed_dim=8,
            units=4,
            heads=2,
            encoder_blocks=1,
            dropout=0.0,
            eval_batch_size=32,
        ),
        train=TrainConfig(epochs=2, batch_size=16, early_stopping_patience=1),
    )


PRESETS = {
    "countries": _countries,
    "countries-quick": _countries_quick,
    "tiny": _tiny,
}


def preset(name: str) -> ExtractiveConfig:
    """A fresh copy of the named preset (one of `PRESETS`)."""
    return core_config.preset(PRESETS, name)
