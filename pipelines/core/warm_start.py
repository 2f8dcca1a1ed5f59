"""Start a run from another run's trained weights (``train.init_from``).

A fresh run (not a resumed one) loads every weight of the finished run named
by ``train.init_from`` that its model has in the same place and shape
(Keras' own structural matching, ``load_weights(skip_mismatch=True)``); the
rest keep their fresh initialisation, and the optimizer starts afresh. The
use: train one variant from another, e.g. hard attention from a trained soft
one (the same weights, plus the REINFORCE baseline). The two runs must share
the sections that make the preprocessors (`SECTIONS`): the same vocabulary,
the same ids, so the loaded embeddings mean what they did.

>>> import os, tempfile, keras
>>> from pipelines.core.warm_start import load_matching
>>> a = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, name="d")])
>>> _ = a.layers[0].bias.assign([1.0, 2.0, 3.0])
>>> path = os.path.join(tempfile.mkdtemp(), "a.weights.h5")
>>> a.save_weights(path)
>>> b = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, name="d"),
...                       keras.layers.Dense(1, name="head")], name="b")
>>> load_matching(b, path)
['b/head/kernel', 'b/head/bias']
>>> b.layers[0].bias.numpy().tolist()
[1.0, 2.0, 3.0]
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.core.errors import PipelineError
from pipelines.core.run_dir import RunDir
from pipelines.core.run_guard import run_config

SECTIONS = ("data", "tokenizer", "image")  # what the preprocessors are made of


def load_matching(model, path: str | Path) -> list[str]:
    """Load the weights in ``path`` that ``model`` has in the same place and
    shape; the paths of the weights the load left as they were. A compiled
    model's optimizer keeps its own state: ``load_weights`` would also load
    the file's optimizer variables (its step count and Adam's moments)."""
    before = [w.numpy() for w in model.weights]
    optimizer = getattr(model, "optimizer", None)
    own = list(optimizer.variables) if optimizer else []
    own_state = [v.numpy() for v in own]
    with warnings.catch_warnings():
        # Keras warns about each part the file lacks, naming its internals;
        # the returned list says what matters: the weights left as they were.
        warnings.simplefilter("ignore")
        model.load_weights(str(path), skip_mismatch=True)
    for variable, value in zip(own, own_state, strict=True):
        variable.assign(value)
    return [
        w.path
        for w, old in zip(model.weights, before, strict=True)
        if np.array_equal(w.numpy(), old)
    ]


def initialise_from(task, model: Any, config, source: str | Path) -> dict:
    """Load the matching weights of the finished run in ``source`` into
    ``model`` (a task model with ``trainer``); what was loaded."""

    run = RunDir(source)
    if not run.root.is_dir():
        raise PipelineError(f"train.init_from: {run.root} is not a run folder.")
    run.require_trained(task.name)
    theirs = run_config(task, run)
    for section in SECTIONS:
        mine = getattr(config, section, None)
        if mine != getattr(theirs, section, None):
            raise PipelineError(
                f"train.init_from: {run.root} was trained with another `{section}` "
                f"section ({getattr(theirs, section, None)} against {mine}); its "
                "weights would read other ids. Start from a run on the same data "
                "and tokenizer settings."
            )
    kept = load_matching(model.trainer, run.weights)
    total = len(model.trainer.weights)
    if len(kept) == total:
        raise PipelineError(
            f"train.init_from: no weight of {run.weights} fits this model (same "
            "layer, same shape); nothing to start from."
        )
    shown = ", ".join(kept[:6]) + (
        f" and {len(kept) - 6} more" if len(kept) > 6 else ""
    )
    print(
        f"Initialised {total - len(kept)} of {total} weights from {run.weights}"
        + (f"; as initialised: {shown}" if kept else "")
    )
    return {"from": str(run.weights), "loaded": total - len(kept), "kept": kept}
