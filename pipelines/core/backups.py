"""End-of-epoch training state, two generations deep, checked before it is trusted.

Keras' ``BackupAndRestore`` keeps one generation by default, overwrites it in
place, and fails with a raw h5py traceback on every rerun once a kill has
truncated it; it also deletes the backup when training ends. This store
writes each generation to a hidden folder and renames it into place, records
the size and SHA-256 of every file, keeps the newest ``keep`` generations,
and on restore falls back past a damaged one to the one before, in one line
that names it, why, and where training resumes. The start of the run counts
as the generation before the first epoch's (a damaged first epoch is trained
again); if every generation of a later epoch is damaged, it stops and says
so rather than start afresh.

Layout: ``backup/epoch-NNNNNN/{model.weights.h5, best.weights.h5,
learned/, state.json}``; the weights file holds the model and the optimizer
(Keras saves both), ``best.weights.h5`` a copy of the run's best weights at
that epoch (when there are any), ``learned/`` copies of the files the
preprocessors learned (tokenizers), ``state.json`` the epoch count, the optimizer's
step count, the full history, the early stopping state and, from the
trainer, the task, the configuration and its fingerprint. The newest sound
generation is the run's source of truth: ``run.json``, ``config.yaml``,
``history.csv`` and the best weights are rebuilt from it
(`pipelines.core.recovery`). A ``state.json`` that parses but holds a value
of the wrong type counts as damaged.

Example:

>>> import tempfile, keras, numpy as np
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> model.compile("adam", "mse")
>>> _ = model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
>>> store = Backups(tempfile.mkdtemp())
>>> _ = store.save(model, {"epoch": 1})
>>> store.restore(model)["epoch"]
1
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from pipelines.core.run_dir import (
    PipelineError,
    commit_point,
    fsync,
    partial_name,
    read_json,
    remove_stale_partials,
    sha256,
    write_json,
)

WEIGHTS = "model.weights.h5"
BEST = "best.weights.h5"
LEARNED = "learned"  # copies of the preprocessors' files (`Task.learned_files`)
STATE = "state.json"
_GENERATION = re.compile(r"^epoch-(\d{6})$")
_NUMBER = (int, float)
# The types of state.json's values, when present (None allowed where listed).
_TYPES = {
    "iterations": (int,),
    "history": (list,),
    "best": _NUMBER,
    "best_epoch": (int, type(None)),
    "best_sha256": (str, type(None)),
    "wait": (int,),
    "stopped_early": (bool,),
    "phase": (int,),
    "phase_start": (int,),
    "learning_rate": _NUMBER,
    "lr_wait": (int,),
    "fingerprint": (str,),
    "task": (str,),
    "config": (dict,),
}


class Backups:
    """Generations of training state in ``folder``, newest first on restore."""

    def __init__(self, folder: str | Path, keep: int = 2, log=print):
        if keep < 1:
            raise ValueError(f"Backups: keep must be >= 1, received {keep}")
        self.folder = Path(folder)
        self.keep = keep
        self.log = log
        # The generations the last `restore` skipped, newest first, and why,
        # and the one it restored.
        self.skipped: list[tuple[Path, str]] = []
        self.restored: Path | None = None

    def generations(self) -> list[Path]:
        """Generation folders, newest (most epochs) first."""
        if not self.folder.is_dir():
            return []
        found = [p for p in self.folder.iterdir() if _GENERATION.match(p.name)]
        return sorted(found, key=lambda p: p.name, reverse=True)

    def save(
        self, model, state: dict, best: Path | None = None, learned: tuple = ()
    ) -> Path:
        """Write ``model`` (and its optimizer), a copy of the ``best`` weights
        file (if given and present), copies of the ``learned`` files (the
        preprocessors', under ``learned/``) and ``state`` as a new
        generation."""
        epoch = int(state["epoch"])
        name = f"epoch-{epoch:06d}"
        self.folder.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(self.folder)
        tmp = self.folder / partial_name(name)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            model.save_weights(str(tmp / WEIGHTS))
            if best is not None and best.is_file():
                shutil.copyfile(best, tmp / BEST)
            for path in learned:
                if Path(path).is_file():
                    (tmp / LEARNED).mkdir(exist_ok=True)
                    shutil.copyfile(path, tmp / LEARNED / Path(path).name)
            files = {}
            for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
                fsync(path)  # on the disk before its checksum is trusted
                files[path.relative_to(tmp).as_posix()] = {
                    "bytes": path.stat().st_size,
                    "sha256": sha256(path),
                }
            write_json(tmp / STATE, {**state, "files": files})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a full disk keeps no part
            raise
        final = self.folder / name
        if final.exists():  # a replayed epoch: the new state supersedes it
            commit_point(f"replace backup {name}")
            os.rename(final, self.folder / partial_name(f"{name}.old"))
            shutil.rmtree(self.folder / partial_name(f"{name}.old"))
        commit_point(f"backup {name}")
        os.rename(tmp, final)
        fsync(self.folder)
        for old in self.generations()[self.keep :]:
            commit_point(f"remove backup {old.name}")
            shutil.rmtree(old, ignore_errors=True)
        return final

    def problem(self, generation: Path) -> str | None:
        """Why ``generation`` cannot be trusted, or None if its files check out
        (present, of their recorded size and checksum) and its state's values
        have the types they should."""
        state_path = generation / STATE
        if not state_path.is_file():
            return f"{state_path} is missing"
        try:
            state = read_json(state_path)
        except PipelineError as error:
            return str(error).rstrip(".")
        wrong = _wrong_value(state, _epoch(generation))
        if wrong:
            return f"{state_path} is damaged ({wrong})"
        for name, expected in state["files"].items():
            path = generation / name
            if not path.is_file():
                return f"{path} is missing"
            size = path.stat().st_size
            if size != expected["bytes"]:
                return f"{path} is truncated ({size} of {expected['bytes']} bytes)"
            if sha256(path) != expected["sha256"]:
                return f"{path} does not match its checksum"
        return None

    def newest(self) -> tuple[Path, dict] | None:
        """The newest generation whose files check out (`problem`), and its
        state; None if there is none. Nothing is loaded."""
        for generation in self.generations():
            if self.problem(generation) is None:
                return generation, read_json(generation / STATE)
        return None

    def restore(self, model) -> dict | None:
        """Load the newest sound generation into ``model``; its state, or None
        when there is nothing to resume (no generation yet, or only a damaged
        first epoch: the run starts afresh).

        ``model`` must be compiled; its optimizer is built here so that the
        optimizer's variables (the step count among them) are restored too.
        A generation skipped as damaged is logged in one line, with the one
        resumed from.

        Raises:
            PipelineError: every generation is damaged and the newest is past
                the first epoch (starting afresh would lose more than it).
        """
        self.skipped, self.restored = [], None
        generations = self.generations()
        if not generations:
            return None
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        loaded = False  # a failed load may have set some of the variables
        for generation in generations:
            problem = self.problem(generation)
            if problem is None:
                try:
                    loaded = True
                    model.load_weights(str(generation / WEIGHTS))
                except Exception as error:  # h5py and Keras raise many types
                    problem = f"{generation / WEIGHTS} cannot be read ({error})"
            if problem is not None:
                self.skipped.append((generation, problem))
                continue
            state = read_json(generation / STATE)
            self.restored = generation
            if self.skipped:
                where = (
                    f"Resuming from {generation.name} (after epoch {state['epoch']})"
                )
                self.log(self._fallback(where, int(state["epoch"])))
            return state
        if _epoch(generations[0]) == 1 and not loaded:
            self.log(self._fallback("Starting afresh", 0))
            return None
        damaged = "; ".join(problem for _, problem in self.skipped)
        raise PipelineError(
            f"every backup in {self.folder} is damaged ({damaged}); "
            "nothing can be resumed. Rerun with --overwrite to start afresh."
        )

    def _fallback(self, resumed: str, epochs: int) -> str:
        """One line: where training resumes, what was skipped and why, and
        the epochs trained again."""
        names = [generation.name for generation, _ in self.skipped]
        reasons = "; ".join(problem for _, problem in self.skipped)
        first, last = epochs + 1, _epoch(self.skipped[0][0])
        if len(names) == 1:
            skipped = f"backup {names[0]} cannot be used"
        else:
            skipped = f"backups {', '.join(names[:-1])} and {names[-1]} cannot be used"
        again = f"epoch {first} is" if first == last else f"epochs {first}-{last} are"
        return f"{resumed}: {skipped}, {reasons}; {again} trained again."


def _wrong_value(state, epoch: int) -> str | None:
    """What is wrong with a parsed ``state.json`` of the generation of
    ``epoch``: a missing or mistyped value; None if nothing is."""
    if not isinstance(state, dict):
        return f"expected an object, received {type(state).__name__}"
    value = state.get("epoch")
    if isinstance(value, bool) or not isinstance(value, int) or value != epoch:
        return f"epoch is {value!r}, expected {epoch} (the folder's name)"
    for key, types in _TYPES.items():
        value = state.get(key)
        if key in state and (isinstance(value, bool) is not (bool in types)
                             or not isinstance(value, types)):  # fmt: skip
            return f"{key} is {value!r}, expected {_names(types)}"
    rows = state.get("history", [])
    if not all(isinstance(r, dict) and isinstance(r.get("epoch"), int) for r in rows):
        return "history holds a row that is not an epoch's"
    files = state.get("files")
    listed = isinstance(files, dict) and bool(files) and all(
        isinstance(e, dict)
        and isinstance(e.get("bytes"), int)
        and isinstance(e.get("sha256"), str)
        for e in files.values()
    )  # fmt: skip
    if not listed or WEIGHTS not in files:
        return "it lists no checksummed weights"
    return None


def _names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def _epoch(generation: Path) -> int:
    """The epochs done in ``generation`` (by its name)."""
    return int(_GENERATION.match(generation.name)[1])
