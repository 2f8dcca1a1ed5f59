"""Typed run configuration: dataclass sections, presets, YAML and ``--set``.

A task's configuration is a dataclass that subclasses `RunConfig`, which
brings the sections every task shares (`TrainConfig`, `ExportConfig`; tasks
that decode step by step add `DecodeConfig`). A run starts from one of the
task's presets, optionally overlaid with a YAML file (which may name a
``preset:`` to start from) and with ``section.key=value`` overrides; the
resolved configuration is written beside the checkpoints as ``config.yaml``.

Every value is checked against its field's type hint when it is loaded:
``epochs: two`` is refused with the key, the expected type and the value;
``learning_rate: 3e-3``, which YAML 1.1 reads as a string, becomes a float.
A field's ``metadata`` may give a ``range`` ``(low, high)`` (inclusive; None
for no bound). A key renamed since is listed in the configuration's
`RunConfig.RENAMED`: its old name still loads, from ``--set``, a YAML file or
an older run folder's ``config.yaml``, with a one-line notice (`deprecated`).

Example:

>>> from dataclasses import dataclass, field
>>> @dataclass
... class ToyConfig(RunConfig):
...     units: int = field(default=8, metadata={"range": (1, None)})
>>> config = apply_overrides(ToyConfig(), ["units=16", "train.learning_rate=3e-3"])
>>> config.units, config.train.learning_rate
(16, 0.003)
>>> try:
...     apply_overrides(config, ["train.epochs=two"])
... except ConfigError as error:
...     print(str(error).split(", from")[0])
config: `train.epochs` must be an int, received 'two' (str)
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.files import read_file
from pipelines.core.run_dir import write_text

# Field metadata: the range a value must lie in (checked on load and --set).
POSITIVE = {"range": (1, None)}
FRACTION = {"range": (0.0, 1.0)}


def fraction(default: float):
    """A dataclass field for a share in ``[0, 1]`` with this ``default``."""
    return field(default=default, metadata=FRACTION)


@dataclass
class SplitConfig:
    """How a task's examples are held out: the base of every task's
    ``DataConfig``. ``valid_fraction`` and ``test_fraction`` of them (hashed,
    `pipelines.data.split_pairs`; a task with generated data may hold out
    sizes instead), and the ``seed`` of that hash and of generated data. A
    task sets other defaults with `fraction`."""

    valid_fraction: float = fraction(0.1)
    test_fraction: float = fraction(0.1)
    seed: int = 0

    def validate(self, where: str = "data.") -> None:
        check_fractions(self.valid_fraction, self.test_fraction, where)


@dataclass
class TrainConfig:
    """Optimisation, distribution and checkpointing (every task)."""

    batch_size: int = field(default=64, metadata={"range": (1, None)})  # global
    epochs: int = field(default=10, metadata={"range": (1, None)})
    learning_rate: float = field(default=2e-3, metadata={"range": (0.0, None)})
    clipnorm: float | None = 1.0
    # Adam, or plain SGD (no momentum), as MemN2N trained on bAbI.
    optimizer: Literal["adam", "sgd"] = "adam"
    strategy: Literal["auto", "default", "mirrored", "multi_worker", "tpu"] = "auto"
    tpu: str | None = None  # TPU address for strategy "tpu"
    mixed_precision: Literal["mixed_float16", "mixed_bfloat16"] | None = None
    early_stopping_patience: int = field(default=3, metadata={"range": (1, None)})
    # Reduce on plateau: the rate times lr_reduce_factor after lr_reduce_patience
    # epochs without a better validation loss (1.0: never), down to min_learning_rate.
    lr_reduce_factor: float = field(default=1.0, metadata={"range": (0.0, 1.0)})
    lr_reduce_patience: int = field(default=2, metadata={"range": (1, None)})
    min_learning_rate: float = field(default=0.0, metadata={"range": (0.0, None)})
    # A step schedule instead (> 0): the rate times lr_reduce_factor every
    # lr_step_epochs epochs of a phase, whatever the validation loss does.
    lr_step_epochs: int = field(default=0, metadata={"range": (0, None)})
    steps_per_epoch: int | None = field(default=None, metadata={"range": (1, None)})
    seed: int = 0
    deterministic: bool = False  # tf.config.experimental.enable_op_determinism
    jit_compile: bool = False  # XLA train step over static, bucketed shapes
    # A finished run of the same task and data whose matching weights start
    # this run (pipelines.core.warm_start); a resumed run ignores it.
    init_from: str | None = None
    # Validation examples whose attention TensorBoard shows each epoch (0: none).
    attention_images: int = field(default=3, metadata={"range": (0, 16)})
    # The most time drawing them may take, as a share of the training time.
    attention_budget: float = field(default=0.05, metadata={"range": (0.0, None)})

    def validate(self, where: str = "train.") -> None:
        if self.deterministic and self.jit_compile:
            raise ConfigError(
                f"config: `{where}deterministic` and `{where}jit_compile` cannot both "
                "be true: op determinism turns XLA off in Keras (silently)."
            )
        if self.lr_reduce_factor <= 0.0:
            raise ConfigError(
                f"config: `{where}lr_reduce_factor` must be in (0, 1] (1: never "
                f"reduce), received {self.lr_reduce_factor}"
            )
        if self.lr_step_epochs and self.lr_reduce_factor == 1.0:
            raise ConfigError(
                f"config: `{where}lr_step_epochs` multiplies the rate by "
                f"`{where}lr_reduce_factor`, which must then be below 1; received "
                f"{self.lr_reduce_factor}"
            )
        if self.lr_reduce_factor < 1.0 and (
            (
                not self.lr_step_epochs
                and self.lr_reduce_patience >= self.early_stopping_patience
            )
            or self.min_learning_rate >= self.learning_rate
        ):
            raise ConfigError(
                f"config: with `{where}lr_reduce_factor` below 1 the rate would "
                f"never be reduced: `{where}lr_reduce_patience` must be below "
                f"`{where}early_stopping_patience` and `{where}min_learning_rate` "
                f"below `{where}learning_rate`; received {self.lr_reduce_patience} "
                f"and {self.early_stopping_patience}, {self.min_learning_rate} and "
                f"{self.learning_rate}"
            )
        if self.strategy == "tpu" and not self.tpu:
            raise ConfigError(
                f"config: `{where}strategy: tpu` needs `{where}tpu`, the TPU's address."
            )


@dataclass
class DecodeConfig:
    """Step-by-step decoding at evaluation and serving time."""

    beam_width: int = field(default=4, metadata={"range": (1, 64)})  # most beams
    default_beam_width: int = field(default=4, metadata={"range": (1, 64)})
    length_penalty: float = field(default=0.6, metadata={"range": (0.0, None)})
    eval_batch_size: int = field(default=128, metadata={"range": (1, None)})

    def validate(self, where: str = "decode.") -> None:
        if self.default_beam_width > self.beam_width:
            raise ConfigError(
                f"config: `{where}default_beam_width` must be in [1, "
                f"{where}beam_width={self.beam_width}], received "
                f"{self.default_beam_width}."
            )


@dataclass
class ExportConfig:
    """The SavedModel: its compute dtype (whatever the training process used),
    its warmup file, whether XLA compiles its decoding, and the request limits
    its signatures check (``max_*``)."""

    dtype: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"
    warmup: bool = True  # write assets.extra/tf_serving_warmup_requests
    # Decode with XLA, inputs padded to a few shapes (pipelines.core.compiled);
    # TF Serving then needs --xla_cpu_compilation_enabled=true.
    jit_compile: bool = False
    # The most one request may hold, checked in the served graph before any
    # work (pipelines.core.serving.RequestLimits; docs/pipelines/deploying.md):
    # rows of every input, bytes of each text string and of each image file,
    # and pixels an image's header declares (read before it is decoded).
    max_batch_rows: int = field(default=128, metadata=POSITIVE)
    max_string_bytes: int = field(default=65_536, metadata=POSITIVE)
    max_image_bytes: int = field(default=20 * 2**20, metadata=POSITIVE)
    max_image_pixels: int = field(default=40_000_000, metadata=POSITIVE)


@dataclass
class RunConfig:
    """Base of every task's configuration: a name and the shared sections.

    Sections named in `NOT_FINGERPRINTED` may change between the runs of one
    folder (a rerun with more ``train.epochs`` trains on; ``decode`` and
    ``export`` settings apply to the next evaluate or export); everything
    else is part of the run's fingerprint. `RENAMED` maps a key's old dotted
    name to its new one (``{"data.corpus": "data.source"}``): the old name is
    read as the new, with a deprecation notice.
    """

    name: str = "run"
    train: TrainConfig = field(default_factory=TrainConfig)
    export: ExportConfig = field(default_factory=ExportConfig)

    NOT_FINGERPRINTED: ClassVar[tuple[str, ...]] = (
        "name",
        "decode",
        "export",
        "train.epochs",
        "train.early_stopping_patience",
        "train.strategy",
        "train.tpu",
        "train.attention_images",
        "train.attention_budget",
    )
    RENAMED: ClassVar[dict[str, str]] = {}

    def validate(self) -> RunConfig:
        """Cross-field checks; sections with a ``validate`` method run theirs."""
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            if dataclasses.is_dataclass(section) and hasattr(section, "validate"):
                section.validate(f"{f.name}.")
        return self


# -- type checking -----------------------------------------------------------


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + str(list(typing.get_args(hint)))
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        return " or ".join(_type_name(a) for a in args)
    if origin in (list, tuple):
        return f"a list of {_type_name(typing.get_args(hint)[0])}"
    if hint is type(None):
        return "null"
    names = {int: "an int", float: "a float", str: "a string", bool: "true or false"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


_NO = object()


def _coerce(value: Any, hint: Any) -> Any:
    """``value`` as ``hint`` asks, or ``_NO``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            out = _coerce(value, arg)
            if out is not _NO:
                return out
        return _NO
    if origin is Literal:
        return value if value in typing.get_args(hint) else _NO
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return _NO
        item = typing.get_args(hint)[0]
        items = [_coerce(v, item) for v in value]
        return _NO if any(i is _NO for i in items) else origin(items)
    if hint is type(None):
        return None if value is None else _NO
    if hint is bool:
        return value if isinstance(value, bool) else _NO
    if hint is int:
        if isinstance(value, bool):
            return _NO
        return value if isinstance(value, int) else _NO
    if hint is float:
        if isinstance(value, bool):
            return _NO
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 3e-3 as a string
            try:
                return float(value)
            except ValueError:
                return _NO
        return _NO
    if hint is str:
        if isinstance(value, str):
            return value
        return (
            str(value)
            if isinstance(value, int) and not isinstance(value, bool)
            else _NO
        )
    return value


def check_fractions(valid: float, test: float, where: str = "data.") -> None:
    """Refuse ``valid_fraction + test_fraction`` over 1 (no example left to train)."""
    if valid + test > 1.0:
        raise ConfigError(
            f"config: `{where}valid_fraction` + `{where}test_fraction` must be "
            f"at most 1, received {valid} + {test}."
        )


def check_value(key: str, value: Any, hint: Any, metadata, origin: str = "") -> Any:
    """``value`` converted to ``hint``; `ConfigError` naming ``key`` if it cannot."""
    out = _coerce(value, hint)
    where = f", from {origin}" if origin else ""
    if out is _NO:
        raise ConfigError(
            f"config: `{key}` must be {_type_name(hint)}, received {value!r} "
            f"({type(value).__name__}){where}."
        )
    if isinstance(out, float) and not math.isfinite(out):
        raise ConfigError(
            f"config: `{key}` must be a finite number, received {value!r}{where}."
        )
    low, high = metadata.get("range", (None, None))
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        if (low is not None and out < low) or (high is not None and out > high):
            bounds = f"[{low if low is not None else '-inf'}, "
            bounds += f"{high if high is not None else 'inf'}]"
            raise ConfigError(
                f"config: `{key}` must be in {bounds}, received {value!r}{where}."
            )
    return out


def _merge(instance: Any, values: dict, where: str, origin: str) -> Any:
    hints = typing.get_type_hints(type(instance))
    fields = {f.name: f for f in dataclasses.fields(instance)}
    changes = {}
    for key, value in values.items():
        if key not in fields:
            source = f", from {origin}" if origin else ""
            raise ConfigError(
                f"config: unknown key `{where}{key}`{source}; known keys: "
                f"{sorted(fields)}."
            )
        current = getattr(instance, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"config: `{where}{key}` must be a mapping, received {value!r}."
                )
            changes[key] = _merge(current, value, f"{where}{key}.", origin)
        else:
            changes[key] = check_value(
                where + key, value, hints[key], fields[key].metadata, origin
            )
    return dataclasses.replace(instance, **changes)


# -- renamed keys ------------------------------------------------------------

_NOTICED: set[str] = set()


def deprecated(old: str, new: str, origin: str = "") -> None:
    """Say on stderr, once per process, that ``old`` is the deprecated name of
    ``new`` (``origin``: where the old name was read)."""
    if old in _NOTICED:
        return
    _NOTICED.add(old)
    where = f" (from {origin})" if origin else ""
    print(f"warning: {old} is deprecated, use {new}{where}.", file=sys.stderr)


def _section(values: dict, path: list[str], create: bool = False) -> dict | None:
    for part in path:
        if create and part not in values:
            values[part] = {}
        values = values.get(part)
        if not isinstance(values, dict):
            return None
    return values


def _renamed(config_type: type[RunConfig], values: dict, origin: str) -> dict:
    """``values`` (nested, as read) with every old name of
    ``config_type.RENAMED`` moved to its new one."""
    renames = config_type.RENAMED
    if not renames:
        return values
    values = copy.deepcopy(values)
    for old, new in renames.items():
        *path, last = old.split(".")
        section = _section(values, path)
        if section is None or last not in section:
            continue
        *new_path, new_last = new.split(".")
        target = _section(values, new_path, create=True)
        if target is None:  # not a mapping: _merge says so
            continue
        if new_last in target:
            source = f", from {origin}" if origin else ""
            raise ConfigError(
                f"config: `{old}` is the old name of `{new}`; give only "
                f"`{new}`{source}."
            )
        target[new_last] = section.pop(last)
        deprecated(f"config key `{old}`", f"`{new}`", origin)
    return values


# -- loading -----------------------------------------------------------------

Presets = dict[str, Callable[[], RunConfig]]


def preset(presets: Presets, name: str) -> RunConfig:
    """A fresh copy of the named preset."""
    if name not in presets:
        raise ConfigError(
            f"config: unknown preset {name!r}; choose one of {sorted(presets)} or "
            "give a YAML file."
        )
    return presets[name]().validate()


def from_dict(
    values: dict,
    presets: Presets,
    base: RunConfig | None = None,
    origin: str = "",
    default: str | None = None,
) -> RunConfig:
    """Overlay a nested dict (as read from YAML) on ``base``, or on its
    ``preset:`` (``default`` when it names none)."""
    values = dict(values)
    name = values.pop("preset", None)
    if base is None:
        name = default if name is None else name
        if name is None:
            raise ConfigError(
                f"config: {origin or 'the mapping'} names no `preset:` to start "
                f"from; add one of {sorted(presets)}."
            )
        base = preset(presets, str(name))
    values = _renamed(type(base), values, origin)
    return _merge(base, values, "", origin).validate()


class _NotYamlError(ConfigError):
    """The text does not parse as YAML (``--set`` then takes it as a string)."""


class _NoAliasLoader(yaml.SafeLoader):
    """YAML's safe subset without anchors and aliases (``&name``, ``*name``):
    an alias expands to a copy of its anchor's node, so a few hundred bytes
    of nested aliases ("billion laughs") would become gigabytes."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            mark = event.start_mark
            raise ConfigError(
                f"line {mark.line + 1}, column {mark.column + 1}: YAML anchors "
                f"and aliases (&{event.anchor}, *{event.anchor}) are not "
                "accepted; write the value out in full (quote it if it is text)"
            )
        return super().compose_node(parent, index)


def parse_yaml(text: str, where: str) -> Any:
    """The value of one YAML document from ``where`` (a file, ``--set KEY``),
    with no anchors or aliases (`_NoAliasLoader`).

    Raises:
        ConfigError: an anchor or alias, naming ``where`` and the line; or
            text that is not YAML (`_NotYamlError`).
    """
    loader = _NoAliasLoader(text)
    try:
        return loader.get_single_data()
    except ConfigError as error:
        raise ConfigError(f"config: {where}: {error}.") from None
    except yaml.YAMLError as error:
        raise _NotYamlError(f"config: {where} is not valid YAML ({error}).") from None
    finally:
        loader.dispose()


def load(
    path_or_preset: str, presets: Presets, default: str | None = None
) -> RunConfig:
    """A preset name, or a YAML file (which may name a ``preset:`` to start
    from; ``default`` otherwise)."""
    path = Path(path_or_preset)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"config: no such file {str(path)!r}.")
        try:
            text = read_file(path, "a YAML config file").decode("utf-8")
        except (PipelineError, OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"config: {path}: cannot be read ({error}).") from None
        values = parse_yaml(text, str(path)) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"config: {str(path)!r} must hold a mapping.")
        return from_dict(values, presets, origin=str(path), default=default)
    return preset(presets, path_or_preset)


def apply_overrides(config: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``section.key=value`` strings; values are parsed as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"config: override {item!r} must look like section.key=value, "
                "for example train.epochs=5."
            )
        dotted, raw = item.split("=", 1)
        nested: dict[str, Any] = {}
        cursor = nested
        *parents, last = dotted.strip().split(".")
        for part in parents:
            cursor = cursor.setdefault(part, {})
        try:
            cursor[last] = parse_yaml(raw, f"--set {dotted}") if raw.strip() else ""
        except _NotYamlError:
            cursor[last] = raw
        nested = _renamed(type(config), nested, f"--set {item}")
        config = _merge(config, nested, "", f"--set {item}")
    return config.validate()


def to_dict(config: RunConfig) -> dict[str, Any]:
    """The configuration as plain data: the name, the task's sections, then ours."""
    data = dataclasses.asdict(config)
    shared = [f.name for f in dataclasses.fields(RunConfig)]
    order = ["name"] + [k for k in data if k not in shared] + shared[1:]
    return {k: data[k] for k in order}


def save(config: RunConfig, path: str | Path) -> None:
    """Write the resolved configuration as YAML (atomically)."""
    write_text(path, yaml.safe_dump(to_dict(config), sort_keys=False))


def _flat(data: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _fingerprinted(config: RunConfig) -> dict[str, Any]:
    skip = type(config).NOT_FINGERPRINTED
    return {
        k: v
        for k, v in _flat(to_dict(config)).items()
        if not any(k == s or k.startswith(s + ".") for s in skip)
    }


def fingerprint(config: RunConfig) -> str:
    """SHA-256 of everything the trained weights depend on (see `RunConfig`)."""
    text = json.dumps(_fingerprinted(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def differences(old: RunConfig, new: RunConfig, limit: int = 4) -> str:
    """``key: old -> new`` for the fingerprinted keys that differ."""
    a, b = _fingerprinted(old), _fingerprinted(new)
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    shown = [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:limit]]
    if len(keys) > limit:
        shown.append(f"and {len(keys) - limit} more")
    return "; ".join(shown)
