"""The translation task's configuration and presets.

A run is described by one `TranslationConfig`: the task's sections (data,
tokenizer, model, decode) beside the shared ``train`` and ``export`` ones.

Example:

>>> from pipelines.core.config import apply_overrides
>>> from pipelines.translation.config import preset
>>> config = apply_overrides(preset("dates"), ["model.units=32"])
>>> config.model.units, config.tokenizer.kind
(32, 'char')
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


@dataclass
class DataConfig(core_config.SplitConfig):
    """Which corpus (``source``), how to filter it and how to split it."""

    source: str = "dates"  # see pipelines.translation.corpus.SPECS
    max_source_words: int = field(default=60, metadata=POSITIVE)
    max_target_words: int = field(default=60, metadata=POSITIVE)
    valid_fraction: float = core_config.fraction(0.05)
    test_fraction: float = core_config.fraction(0.05)
    split_key: Literal["source", "target"] = "source"  # "target" for dates
    limit: int | None = field(default=None, metadata=POSITIVE)  # first N pairs


@dataclass
class TokenizerConfig:
    """``char`` (dates) or ``subword`` (WordPiece learned with tf-text)."""

    kind: Literal["char", "subword"] = "subword"
    vocab_size: int = field(default=4000, metadata={"range": (8, None)})
    max_source_tokens: int = field(default=96, metadata=POSITIVE)  # longer are cut
    max_target_tokens: int = field(default=96, metadata=POSITIVE)  # decoding stops


@dataclass
class ModelConfig:
    """The encoder-decoder: an RNN with an attention, or a Transformer."""

    architecture: Literal["rnn", "transformer"] = "rnn"
    attention: Literal[
        "bahdanau", "luong_dot", "luong_general", "luong_concat", "local_p", "none"
    ] = "bahdanau"  # rnn only
    embedding_dim: int = field(default=64, metadata=POSITIVE)
    units: int = field(default=128, metadata=POSITIVE)  # encoder GRU per direction
    attention_units: int = field(default=128, metadata=POSITIVE)
    input_feeding: bool = True
    local_window: int = field(default=8, metadata=POSITIVE)  # D of local-p
    num_layers: int = field(default=2, metadata=POSITIVE)  # transformer only
    num_heads: int = field(default=4, metadata=POSITIVE)  # transformer only
    intermediate_dim: int = field(default=512, metadata=POSITIVE)  # transformer
    dropout: float = field(default=0.1, metadata={"range": (0.0, 0.95)})


@dataclass
class TranslationConfig(RunConfig):
    name: str = "dates"
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    RENAMED: ClassVar[dict[str, str]] = {"data.corpus": "data.source"}


def _dates() -> TranslationConfig:
    return TranslationConfig(
        name="dates",
        data=DataConfig(source="dates:22000", split_key="target", test_fraction=0.05),
        tokenizer=TokenizerConfig(
            kind="char", max_source_tokens=48, max_target_tokens=11
        ),
        # No input feeding: the decoder GRU runs alone and the attention once
        # over all its states, which trains faster to the same exact match;
        # so does the rate of 5e-3 (docs/pipelines/results/translation.md has the
        # measurements, from benchmarks/bench_pipeline.py).
        model=ModelConfig(
            embedding_dim=32,
            units=64,
            attention_units=64,
            dropout=0.0,
            input_feeding=False,
        ),
        train=TrainConfig(epochs=2, batch_size=64, learning_rate=5e-3),
        decode=DecodeConfig(length_penalty=0.0),
    )


def _bible() -> TranslationConfig:
    return TranslationConfig(
        name="bible",
        data=DataConfig(source="bible", max_source_words=60, max_target_words=60),
        tokenizer=TokenizerConfig(
            kind="subword", vocab_size=4000, max_source_tokens=96, max_target_tokens=96
        ),
        # No input feeding: the decoder GRU runs alone and the attention once
        # over all its states, several times faster to train on a CPU.
        model=ModelConfig(
            embedding_dim=128, units=192, attention_units=128, input_feeding=False
        ),
        train=TrainConfig(epochs=8, batch_size=64, learning_rate=2e-3),
    )


def _bible_none() -> TranslationConfig:
    bible = _bible()
    return dataclasses.replace(
        bible,
        name="bible-none",
        model=dataclasses.replace(bible.model, attention="none"),
    )


def _ding() -> TranslationConfig:
    bible = _bible()
    return dataclasses.replace(
        bible, name="ding", data=dataclasses.replace(bible.data, source="ding")
    )


def _tiny() -> TranslationConfig:
    return TranslationConfig(
        name="tiny",
        data=DataConfig(source="dates:600", split_key="target", test_fraction=0.1),
        tokenizer=TokenizerConfig(
            kind="char", max_source_tokens=40, max_target_tokens=11
        ),
        model=ModelConfig(embedding_dim=8, units=8, attention_units=8, dropout=0.0),
        train=TrainConfig(epochs=1, batch_size=32, early_stopping_patience=1),
        decode=DecodeConfig(beam_width=3, default_beam_width=2, eval_batch_size=64),
    )


PRESETS = {
    "dates": _dates,
    "bible": _bible,
    "bible-none": _bible_none,
    "ding": _ding,
    "tiny": _tiny,
}


def preset(name: str) -> TranslationConfig:
    """A fresh copy of the named preset (one of `PRESETS`)."""
    return core_config.preset(PRESETS, name)
