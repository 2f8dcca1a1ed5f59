"""The task interface: what a pipeline supplies, and what the core does with it.

`pipelines.core` runs every verb (train, evaluate, export, predict, demo) the
same way for every task; a task supplies only what is its own:

* its configuration (a `RunConfig` subclass) and presets, a ``tiny`` one
  among them for the pipeline contract;
* its data (`load_data`: train / valid / test examples and a report of what
  was dropped or cut);
* its preprocessing (`preprocessors`: tokenizers or image decoding, learned
  from the training split and saved in the run folder) and batches
  (`make_dataset`);
* its model (`build_model`: an object whose ``trainer`` is the Keras model
  that ``fit`` trains) and training loss and metrics (`compile_arguments`);
* its evaluation (`evaluate`);
* its serving module (`serving_module`: a `ServingModule` whose signatures
  take raw strings or image bytes), the samples ``demo`` shows, and how
  ``predict`` calls an export and prints what it returns.

Nothing here assumes a model that decodes step by step: an extractive or a
classification model fits the same interface.
"""

from __future__ import annotations

import abc
import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import tensorflow as tf

    from pipelines.core.config import Presets, RunConfig
    from pipelines.core.run_dir import RunDir
    from pipelines.core.serving import ServingModule


@dataclass
class Data:
    """The splits of a task's examples, and what loading them dropped.

    ``notes`` are lines for ``data_summary.txt``: how many examples were read
    and from where, how many each filter dropped.
    """

    train: list
    valid: list
    test: list
    notes: list[str] = field(default_factory=list)

    def split(self, name: str) -> list:
        if name not in ("train", "valid", "test"):
            raise ValueError(f"split must be train, valid or test, received {name!r}")
        return getattr(self, name)


@dataclass
class BadRequest:
    """A serving request that must be answered with an error or a defined result.

    ``error`` is a substring of the ``InvalidArgument`` message (it should name
    the input); with ``error=None`` the request must succeed and ``check``
    (``outputs -> None``, raising on failure) states the defined result.
    ``python=False`` marks requests that only a C client can send (a wrong
    rank: Python's signature wrapper refuses it before the graph runs).
    """

    name: str
    feed: dict
    error: str | None = None
    check: Any = None
    python: bool = True


@dataclass
class DataCase:
    """Overrides that point a task's config at bad data, for the contract."""

    overrides: list[str]
    path: str = ""


class Task(abc.ABC):
    """One pipeline task; see the module docstring for what each hook does."""

    name: ClassVar[str]
    description: ClassVar[str]
    default_preset: ClassVar[str]
    # Files the task writes into the run folder (removed by --overwrite).
    run_files: ClassVar[tuple[str, ...]] = ()
    # Files `evaluate` writes besides metrics.json (for the docs and contract).
    evaluate_files: ClassVar[tuple[str, ...]] = ()
    # Extra verbs that are aliases of predict.
    predict_aliases: ClassVar[tuple[str, ...]] = ()

    # -- configuration ------------------------------------------------------
    @abc.abstractmethod
    def presets(self) -> Presets:
        """Preset name -> a function returning a fresh config; ``tiny`` included."""

    # -- data and preprocessing ---------------------------------------------
    @abc.abstractmethod
    def load_data(self, config: RunConfig) -> Data:
        """The deterministic train / valid / test splits of the configured data."""

    @abc.abstractmethod
    def preprocessors(
        self, run: RunDir, data: Data | None, config: RunConfig, create: bool
    ) -> Any:
        """Load the run's preprocessors, or learn them from ``data.train``.

        With ``create`` (the chief worker of a training run), learned
        preprocessors are saved in ``run`` with atomic writes; otherwise they
        are loaded from ``run`` when present, or learned in memory.
        """

    def summary(self, data: Data, preprocessors: Any, config: RunConfig) -> str:
        """``data_summary.txt``: split sizes and the loading notes."""
        lines = [f"{name}: {len(data.split(name))} examples" for name in SPLITS]
        return "\n".join(lines + data.notes)

    @abc.abstractmethod
    def make_dataset(
        self,
        examples: Sequence,
        preprocessors: Any,
        config: RunConfig,
        training: bool,
        replicas: int = 1,
    ) -> tf.data.Dataset:
        """Training batches ``(features, targets)`` of ``examples``."""

    # -- model --------------------------------------------------------------
    @abc.abstractmethod
    def build_model(self, config: RunConfig, preprocessors: Any) -> Any:
        """The model; its ``trainer`` attribute is the Keras model to fit."""

    @abc.abstractmethod
    def compile_arguments(self, config: RunConfig) -> dict:
        """``loss`` and ``metrics`` for ``trainer.compile``."""

    def phases(self, config: RunConfig) -> tuple[int, ...]:
        """Epochs (0-based) at which a later training phase begins; none by
        default. Each phase has its own best epoch and early stopping (an
        early stop moves on to the next phase)."""
        return ()

    def start_phase(self, model: Any, config: RunConfig, phase: int) -> None:  # noqa: B027
        """Set the model up for ``phase`` (0 first) before its epochs run,
        also when a run resumes inside it (e.g. switch a loss term on)."""

    # -- evaluation ---------------------------------------------------------
    def add_evaluate_arguments(self, parser: argparse.ArgumentParser) -> None:  # noqa: B027
        """Task options of ``evaluate`` (``--split`` and ``--limit`` are core's)."""

    @abc.abstractmethod
    def evaluate(
        self,
        run: RunDir,
        model: Any,
        preprocessors: Any,
        config: RunConfig,
        examples: Sequence,
        args: argparse.Namespace,
    ) -> dict:
        """Score ``examples``; write the task's files; return metrics.json's body."""

    def evaluation_summary(self, metrics: dict) -> str:
        """One line for the end of ``demo``."""
        return ""

    # -- serving ------------------------------------------------------------
    @abc.abstractmethod
    def serving_module(
        self, model: Any, preprocessors: Any, config: RunConfig
    ) -> ServingModule:
        """The ``tf.Module`` to export, with its signatures and warmup requests."""

    @abc.abstractmethod
    def samples(self, config: RunConfig) -> list[str]:
        """Raw inputs ``demo`` sends to the export (texts, or image paths)."""

    def add_predict_arguments(self, parser: argparse.ArgumentParser) -> None:  # noqa: B027
        """Task options of ``predict`` (the inputs and ``--export`` are core's)."""

    @abc.abstractmethod
    def predict(self, export_dir, inputs: list[str], args: argparse.Namespace) -> None:
        """Call the export (TensorFlow and tensorflow-text only) and print."""

    def demo_arguments(self, run_dir) -> list[str]:
        """Extra ``predict`` arguments of ``demo`` (e.g. where to draw a plot)."""
        return []

    def demo_notes(self, run_dir) -> list[str]:
        """Extra items for the last line of ``demo`` (e.g. the plot's path)."""
        return []

    # -- the pipeline contract ----------------------------------------------
    @abc.abstractmethod
    def contract_requests(self, config: RunConfig) -> list[dict]:
        """``serving_default`` feeds that cover every input and option."""

    @abc.abstractmethod
    def bad_requests(self, config: RunConfig) -> list[BadRequest]:
        """Feeds that must give a clear ``InvalidArgument`` or a defined result."""

    @abc.abstractmethod
    def contract_data(self, folder) -> dict[str, DataCase]:
        """Bad data in ``folder``: ``"empty_file"`` (an empty user file, its
        path in the case) and ``"empty_valid"`` (a split with no validation
        examples)."""


SPLITS = ("train", "valid", "test")
