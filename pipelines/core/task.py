"""The task interface: the wiring a pipeline supplies to the core.

`pipelines.core` runs every verb (train, evaluate, export, predict, demo) the
same way for every task; a task supplies only what is its own:

* its configuration (a `RunConfig` subclass) and presets, a ``tiny`` one
  among them for the pipeline contract;
* its data (`load_data`: train / valid / test examples and a report of what
  was dropped or cut);
* its preprocessing (`preprocessors`: tokenizers or image decoding, learned
  from the training split and saved in the run folder; `saved_or_learned`
  does the loading and saving) and batches (`make_dataset`);
* its model (`build_model`: an object whose ``trainer`` is the Keras model
  that ``fit`` trains) and training loss and metrics (`compile_arguments`);
* its evaluation (`evaluate`) and its serving module (`serving_module`: a
  `ServingModule` whose signatures take raw strings or image bytes), and
  the raw inputs it is shown with (`samples`).

Two objects beside it hold the rest: ``client`` (a `Client`: the task's
command-line options, how ``predict`` prints an export's answers, what
``demo`` adds) and ``contract`` (its `ContractCases`, the pipeline
contract's requests and bad data). Nothing here assumes a model that decodes
step by step: an extractive or a classification model fits the same
interface.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pipelines.core.errors import PipelineError

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    import tensorflow as tf

    from pipelines.core.client import Client
    from pipelines.core.config import Presets, RunConfig
    from pipelines.core.contract_cases import ContractCases
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


def saved_or_learned(
    task: str,
    run: RunDir | None,
    data: Data | None,
    create: bool,
    files: Sequence[str],
    load: Callable[..., Any],
    learn: Callable[[Data], Any],
    save: Callable[..., None],
) -> Any:
    """A task's preprocessors: ``load(*paths)`` where every file of ``files``
    is in ``run``; else ``learn(data)``, saved with ``save(preprocessors,
    *paths)`` when ``create`` (the chief worker of a training run).

    Raises:
        PipelineError: a run folder without the files and no data to learn
            from (the run was never trained).
    """
    paths = None if run is None else [run / name for name in files]
    if paths is not None and all(path.exists() for path in paths):
        return load(*paths)
    if data is None:
        if run is None:
            raise ValueError("preprocessors: give a run folder or data to learn from.")
        raise PipelineError(
            f"{run.root} has no {'/'.join(files)}: train a model there first "
            f"(`attention-pipelines {task} train`)."
        )
    preprocessors = learn(data)
    if create and paths is not None:
        save(preprocessors, *paths)
    return preprocessors


def forward(module: str, function: str) -> Callable[..., Any]:
    """A `Task` method that calls ``function`` of ``module`` with its
    arguments, importing the module at the call: a task's heavy modules load
    only for the verbs that use them."""

    def method(self, *args, **kwargs):
        return getattr(importlib.import_module(module), function)(*args, **kwargs)

    method.__doc__ = f"`{module}.{function}`."
    return method


def served_evaluation(module: str, **options: Any) -> Callable[..., dict]:
    """A `Task.evaluate` that scores the task's `Task.serving_module` with
    ``module``'s ``evaluate(root, served, config, examples, split, *values)``,
    ``values`` read from the verb's arguments by the names of ``options``
    (their defaults where a verb has no such argument)."""

    def evaluate(self, run, model, preprocessors, config, examples, args) -> dict:
        served = self.serving_module(model, preprocessors, config)
        values = [getattr(args, name, default) for name, default in options.items()]
        score = importlib.import_module(module).evaluate
        return score(run.root, served, config, list(examples), args.split, *values)

    evaluate.__doc__ = f"`{module}.evaluate` of the served model."
    return evaluate


class Task(abc.ABC):
    """One pipeline task; see the module docstring for what each hook does."""

    name: ClassVar[str]
    description: ClassVar[str]
    default_preset: ClassVar[str]
    # Files the task writes into the run folder (removed by --overwrite).
    run_files: ClassVar[tuple[str, ...]] = ()
    # Those of them the preprocessors learn before training (tokenizers, an
    # answer list): a copy goes into every backup, and a missing or damaged
    # one is put back from it (`pipelines.core.recovery`).
    learned_files: ClassVar[tuple[str, ...]] = ()
    # Files `evaluate` writes besides metrics.json (for the docs and contract).
    evaluate_files: ClassVar[tuple[str, ...]] = ()
    # The command line's side of the task, and its pipeline-contract cases.
    client: ClassVar[Client]
    contract: ClassVar[ContractCases]

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

    # -- evaluation and serving ---------------------------------------------
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

    def plot_attention(
        self, module: ServingModule, config: RunConfig, examples: Sequence, folder: Path
    ) -> list[Path]:
        """PNG files in ``folder``: the attention ``module`` (the export's
        module over the model in training) gives ``examples``, a few
        validation examples; TensorBoard shows them each epoch
        (`pipelines.core.attention_board`). None by default."""
        return []

    @abc.abstractmethod
    def serving_module(
        self, model: Any, preprocessors: Any, config: RunConfig
    ) -> ServingModule:
        """The ``tf.Module`` to export, with its signatures and warmup requests."""

    @abc.abstractmethod
    def samples(self, config: RunConfig) -> list[str]:
        """Raw inputs ``demo`` sends to the export (texts, or image paths)."""


SPLITS = ("train", "valid", "test")
