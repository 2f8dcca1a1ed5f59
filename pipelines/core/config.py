"""Run configuration: dataclasses with defaults per preset, YAML in and out.

A run is described by one `TranslationConfig`. It starts from a preset
(``dates``, ``bible``, ``tiny``...), optionally overlaid with a YAML file
and with ``section.key=value`` overrides from the command line; the resolved
configuration is written beside the checkpoints as ``config.yaml``.

Example:

>>> from pipelines.core.config import preset, apply_overrides
>>> config = apply_overrides(preset("dates"), ["model.units=32"])
>>> config.model.units, config.tokenizer.kind
(32, 'char')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ATTENTIONS = (
    "bahdanau",
    "luong_dot",
    "luong_general",
    "luong_concat",
    "local_p",
    "none",
)
ARCHITECTURES = ("rnn", "transformer")


@dataclass
class DataConfig:
    """Which corpus, how to filter it and how to split it."""

    corpus: str = "dates"  # see pipelines.data.load_corpus for the forms
    max_source_words: int = 60
    max_target_words: int = 60
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    split_key: str = "source"  # "target" for dates: no date in two splits
    seed: int = 0
    limit: int | None = None  # keep only the first N pairs (quick runs)


@dataclass
class TokenizerConfig:
    """``char`` (dates) or ``subword`` (WordPiece learned with tf-text)."""

    kind: str = "subword"
    vocab_size: int = 4000  # subword only: the target size of each vocabulary
    max_source_tokens: int = 96  # longer inputs are cut
    max_target_tokens: int = 96  # decoding stops after this many tokens


@dataclass
class ModelConfig:
    """The encoder-decoder: an RNN with an attention, or a Transformer."""

    architecture: str = "rnn"
    attention: str = "bahdanau"  # one of ATTENTIONS (rnn only)
    embedding_dim: int = 64
    units: int = 128  # encoder GRU units per direction; the decoder has twice
    attention_units: int = 128
    input_feeding: bool = True
    local_window: int = 8  # D of local-p
    num_layers: int = 2  # transformer only
    num_heads: int = 4  # transformer only
    intermediate_dim: int = 512  # transformer only
    dropout: float = 0.1


@dataclass
class TrainConfig:
    """Optimisation, distribution and checkpointing."""

    batch_size: int = 64  # global, across replicas
    epochs: int = 10
    learning_rate: float = 2e-3
    clipnorm: float = 1.0
    strategy: str = "auto"  # auto | default | mirrored | multi_worker | tpu
    tpu: str | None = None  # TPU address for strategy "tpu"
    mixed_precision: str | None = None  # mixed_float16 | mixed_bfloat16
    early_stopping_patience: int = 3
    steps_per_epoch: int | None = None
    seed: int = 0


@dataclass
class DecodeConfig:
    """Decoding at evaluation and serving time."""

    beam_width: int = 4  # the most beams a serving request may ask for
    default_beam_width: int = 4
    length_penalty: float = 0.6  # GNMT alpha
    eval_batch_size: int = 128


@dataclass
class TranslationConfig:
    name: str = "dates"
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def validate(self) -> TranslationConfig:
        """Raise ``ValueError`` naming the field and the allowed values."""
        checks = [
            ("model.architecture", self.model.architecture, ARCHITECTURES),
            ("model.attention", self.model.attention, ATTENTIONS),
            ("tokenizer.kind", self.tokenizer.kind, ("char", "subword")),
            ("data.split_key", self.data.split_key, ("source", "target")),
            (
                "train.strategy",
                self.train.strategy,
                ("auto", "default", "mirrored", "multi_worker", "tpu"),
            ),
            (
                "train.mixed_precision",
                self.train.mixed_precision,
                (None, "mixed_float16", "mixed_bfloat16"),
            ),
        ]
        for name, value, allowed in checks:
            if value not in allowed:
                raise ValueError(
                    f"config: `{name}` must be one of {list(allowed)}, "
                    f"received {value!r}."
                )
        if not 1 <= self.decode.default_beam_width <= self.decode.beam_width:
            raise ValueError(
                "config: `decode.default_beam_width` must be in [1, "
                f"decode.beam_width={self.decode.beam_width}], received "
                f"{self.decode.default_beam_width}."
            )
        return self


def _presets() -> dict[str, TranslationConfig]:
    dates = TranslationConfig(
        name="dates",
        data=DataConfig(corpus="dates:22000", split_key="target", test_fraction=0.05),
        tokenizer=TokenizerConfig(
            kind="char", max_source_tokens=48, max_target_tokens=11
        ),
        model=ModelConfig(embedding_dim=32, units=64, attention_units=64, dropout=0.0),
        train=TrainConfig(epochs=4, batch_size=64, learning_rate=3e-3),
        decode=DecodeConfig(length_penalty=0.0),
    )
    bible = TranslationConfig(
        name="bible",
        data=DataConfig(corpus="bible", max_source_words=60, max_target_words=60),
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
    bible_none = dataclasses.replace(
        bible,
        name="bible-none",
        model=dataclasses.replace(bible.model, attention="none"),
    )
    ding = dataclasses.replace(
        bible, name="ding", data=dataclasses.replace(bible.data, corpus="ding")
    )
    tiny = TranslationConfig(
        name="tiny",
        data=DataConfig(corpus="dates:600", split_key="target", test_fraction=0.1),
        tokenizer=TokenizerConfig(
            kind="char", max_source_tokens=40, max_target_tokens=11
        ),
        model=ModelConfig(embedding_dim=8, units=8, attention_units=8, dropout=0.0),
        train=TrainConfig(epochs=1, batch_size=32, early_stopping_patience=1),
        decode=DecodeConfig(beam_width=3, default_beam_width=2, eval_batch_size=64),
    )
    return {c.name: c for c in (dates, bible, bible_none, ding, tiny)}


PRESETS = tuple(_presets())


def preset(name: str) -> TranslationConfig:
    """A fresh copy of the named preset (one of ``PRESETS``)."""
    presets = _presets()
    if name not in presets:
        raise ValueError(
            f"config: unknown preset {name!r}; choose one of {sorted(presets)} or "
            "give a YAML file."
        )
    return presets[name]


def _merge(instance: Any, values: dict[str, Any], where: str) -> Any:
    names = {f.name: f for f in dataclasses.fields(instance)}
    changes = {}
    for key, value in values.items():
        if key not in names:
            raise ValueError(
                f"config: unknown key `{where}{key}`; known keys: {sorted(names)}."
            )
        current = getattr(instance, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(
                    f"config: `{where}{key}` must be a mapping, received {value!r}."
                )
            value = _merge(current, value, f"{where}{key}.")
        changes[key] = value
    return dataclasses.replace(instance, **changes)


def from_dict(values: dict[str, Any], base: TranslationConfig | None = None):
    """Overlay a nested dict (as read from YAML) on ``base`` (or a preset)."""
    values = dict(values)
    if base is None:
        base = preset(values.pop("preset", "dates"))
    else:
        values.pop("preset", None)
    return _merge(base, values, "").validate()


def load(path_or_preset: str) -> TranslationConfig:
    """A preset name, or a YAML file (which may name a ``preset:`` to start from)."""
    path = Path(path_or_preset)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise FileNotFoundError(f"config: no such file {str(path)!r}.")
        values = yaml.safe_load(path.read_text()) or {}
        if not isinstance(values, dict):
            raise ValueError(f"config: {str(path)!r} must hold a mapping.")
        return from_dict(values)
    return preset(path_or_preset).validate()


def apply_overrides(config: TranslationConfig, overrides: list[str]):
    """Apply ``section.key=value`` strings; values are parsed as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(
                f"config: override {item!r} must look like section.key=value, "
                "for example model.units=64."
            )
        dotted, raw = item.split("=", 1)
        nested: dict[str, Any] = {}
        cursor = nested
        *parents, last = dotted.split(".")
        for part in parents:
            cursor = cursor.setdefault(part, {})
        cursor[last] = yaml.safe_load(raw)
        config = from_dict(nested, base=config)
    return config.validate()


def to_dict(config: TranslationConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def save(config: TranslationConfig, path: str | Path) -> None:
    """Write the resolved configuration as YAML (atomically)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".partial")
    tmp.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    tmp.replace(path)
