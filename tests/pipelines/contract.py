"""The pipeline contract: what every registered task must do, on its ``tiny`` preset.

`tests/contract.py` proves every layer; this module proves every task the
same way, through the task interface and the console script only, so a new
task is covered by registering it. ``tests/pipelines/test_contract.py`` runs
the clauses; a `Case` is one task trained once per test run (``demo``:
train, evaluate, export, predict) and shared by all of them.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
# Two epochs: two backup generations for the damaged-backup clause.
TINY = [
    "--config",
    "tiny",
    "--set",
    "train.epochs=2",
    "--set",
    "train.strategy=default",
    "--set",
    "train.attention_budget=100",  # every epoch drawn: the images are checked
]


def cli(*args, env=None, check=True, timeout=900) -> subprocess.CompletedProcess:
    """``attention-pipelines ARGS`` in a subprocess, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *map(str, args)],
        cwd=ROOT,
        env={**QUIET, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@dataclass
class Case:
    """One task trained and exported once: what every clause looks at.

    The ``demo`` run is made on first use: the slow clauses that train runs
    of their own need the task only.
    """

    name: str
    root: Path
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def demo(self) -> subprocess.CompletedProcess:
        """``demo`` on the tiny preset: train, evaluate, export, predict (clause 1)."""
        if "demo" not in self._cache:
            self._cache["demo"] = cli(self.name, "demo", *TINY, "--run-dir", self.run)
        return self._cache["demo"]

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def task(self):
        from pipelines import registry

        return registry.get(self.name)

    @property
    def run_dir(self) -> Path:
        """The trained run's folder (made by `demo` on first use)."""
        self.demo  # noqa: B018
        return self.run

    @property
    def export_dir(self) -> Path:
        from pipelines.core.serving import latest_version

        # demo exports to <run>/serving/<the run folder's name>/
        return latest_version(self.run_dir / "serving" / self.run_dir.name)

    @property
    def config(self):
        from pipelines.core.run_dir import RunDir
        from pipelines.core.run_guard import run_config

        return run_config(self.task, RunDir(self.run_dir))

    def module(self):
        """The in-process serving module of the trained run (built once)."""
        if "module" not in self._cache:
            from pipelines.core.trainer import load_trained

            config, preprocessors, model = load_trained(self.task, self.run_dir)
            module = self.task.serving_module(model, preprocessors, config)
            self._cache["module"] = (module, module.signatures())
        return self._cache["module"]

    def reference(self, feed: dict) -> dict:
        """The in-process module's outputs for ``feed``: ``serving_default``
        for the main inputs alone, ``with_options`` for a feed with options."""
        import tensorflow as tf

        _, signatures = self.module()
        out = signatures[route(signatures, feed)](
            **{k: tf.constant(v) for k, v in feed.items()}
        )
        return {k: v.numpy() for k, v in out.items()}

    @property
    def main_inputs(self) -> set[str]:
        return set(self.task.contract.main_inputs)

    def main_feed(self, feed: dict) -> dict:
        """``feed`` without its options: the main inputs alone."""
        return {k: v for k, v in feed.items() if k in self.main_inputs}


def route(signatures, feed: dict) -> str:
    """``serving_default`` where it takes every input of ``feed`` (the main
    inputs alone), else ``with_options`` (the per-request options)."""
    takes = {spec.name for spec in signatures["serving_default"].input_signature}
    return "serving_default" if set(feed) <= takes else "with_options"


def train_case(name: str, root: Path) -> Case:
    """The task's case; its ``demo`` runs when a clause first needs it."""
    return Case(name, root)


def assert_outputs_equal(got: dict, expected: dict, where: str) -> None:
    """Strings and integers exactly, floats to float32 noise."""
    assert sorted(got) == sorted(expected), (where, sorted(got), sorted(expected))
    for key, value in expected.items():
        value, other = np.asarray(value), np.asarray(got[key])
        assert other.shape == value.shape, (where, key, other.shape, value.shape)
        if value.dtype.kind in "fc":
            np.testing.assert_allclose(
                other, value, rtol=1e-4, atol=1e-5, err_msg=f"{where}: {key}"
            )
        else:
            np.testing.assert_array_equal(other, value, err_msg=f"{where}: {key}")


# A process where this project cannot be imported: TensorFlow and
# tensorflow-text only, like any client of the SavedModel. Runs each request
# (the main inputs alone through serving_default, with options through
# with_options, whose inputs left out take the SignatureDef's defaults) and
# records the outputs or the error.
FRESH = textwrap.dedent(
    """
    import json, pickle, sys
    sys.modules["attention_layers"] = None
    sys.modules["pipelines"] = None
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401
    from tensorflow.python.tools import saved_model_utils

    export_dir, requests_path, out_path = sys.argv[1:]
    with open(requests_path, "rb") as f:
        job = pickle.load(f)
    meta = saved_model_utils.get_meta_graph_def(export_dir, "serve")
    loaded = tf.saved_model.load(export_dir)
    signatures = loaded.signatures
    main = set(meta.signature_def["serving_default"].inputs)

    def run(fn, inputs):
        out = fn(**{k: tf.constant(v) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in out.items()}

    results = []
    for feed in job["requests"]:
        name = "serving_default" if set(feed) <= main else "with_options"
        defaults = {
            k: tf.make_ndarray(v)
            for k, v in meta.signature_def[name].defaults.items()
        }
        try:
            results.append({"ok": run(signatures[name], {**defaults, **feed})})
        except tf.errors.InvalidArgumentError as error:
            results.append({"error": error.message})

    # The main inputs alone: serving_default's signature, the loaded object's
    # function, and TF Serving's REST bodies as the server reads them (rows
    # stack each instance's named inputs along a batch axis; columns take
    # each input as it is; scalars cannot be rows, hence with_options).
    feed, paths = job["main"], {}
    if feed is not None:
        paths["signature"] = run(signatures["serving_default"], feed)
        paths["function"] = run(loaded.serving_default, feed)
        if hasattr(loaded, "with_options"):
            paths["with_options function"] = run(loaded.with_options, feed)
    if feed is not None and job["rest"]:
        names = sorted(feed)
        text = {k: [str(x, "utf-8") if isinstance(x, bytes) else str(x) for x in v]
                for k, v in feed.items()}
        instances = [dict(zip(names, r)) for r in zip(*(text[k] for k in names))]
        rows = json.loads(json.dumps({"instances": instances}))["instances"]
        rows = {k: np.array([i[k] for i in rows], object) for k in names}
        paths["rest rows"] = run(signatures["serving_default"], rows)
        columns = json.loads(json.dumps({"inputs": text}))["inputs"]
        columns = {k: np.array(v, object) for k, v in columns.items()}
        paths["rest columns"] = run(signatures["serving_default"], columns)
    with open(out_path, "wb") as f:
        pickle.dump({"requests": results, "main": paths}, f)
    """
)


def serve_fresh(
    export_dir: Path,
    requests: list[dict],
    workdir: Path,
    main: dict | None = None,
    rest: bool = False,
) -> dict:
    """Run ``requests`` in a fresh process that cannot import this project:
    ``{"requests": [{"ok": outputs} or {"error": message}, ...], "main":
    {path: outputs}}``, the second for the ``main`` feed (main inputs alone)
    through each path a Python client has (``rest``: REST bodies too)."""
    requests_path, out_path = workdir / "requests.pkl", workdir / "results.pkl"
    job = {"requests": requests, "main": main, "rest": rest}
    requests_path.write_bytes(pickle.dumps(job))
    env = {k: v for k, v in QUIET.items() if k != "PYTHONPATH"}
    command = [sys.executable, "-c", FRESH, str(export_dir)]
    proc = subprocess.run(
        [*command, str(requests_path), str(out_path)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pickle.loads(out_path.read_bytes())


def bfloat16_ops(export_dir: Path) -> int:
    """How many graph nodes of the SavedModel carry a bfloat16 dtype."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((export_dir / "saved_model.pb").read_bytes())
    count = 0
    for meta in proto.meta_graphs:
        nodes = list(meta.graph_def.node)
        for fn in meta.graph_def.library.function:
            nodes += list(fn.node_def)
        for node in nodes:
            for attr in node.attr.values():
                if attr.type == types_pb2.DT_BFLOAT16 or types_pb2.DT_BFLOAT16 in (
                    attr.list.type
                ):
                    count += 1
                    break
    return count


def history_epochs(run_dir: Path) -> list[int]:
    import csv

    path = run_dir / "history.csv"
    if not path.exists():
        return []
    with open(path) as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


def run_state(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())
