"""The pipeline contract (tests/pipelines/contract.py) run on every registered task.

One ``demo`` run per task (tiny preset, two epochs) is shared by all the
clauses; the root conftest.py schedules a task's tests on one xdist worker so
the run is made once. The
slow clauses (kill and resume, MirroredStrategy and multi-worker against a
single device, determinism, two exports at once) run in ``make test-slow``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.pipelines import contract
from tests.pipelines.contract import (
    QUIET,
    ROOT,
    TINY,
    assert_outputs_equal,
    cli,
    history_epochs,
    route,
    run_state,
)

pytestmark = pytest.mark.tf_only


def _task_names():
    from pipelines import registry

    return registry.names()


TASKS = _task_names()  # the root conftest.py keeps each task's tests together


@pytest.fixture(scope="module", params=TASKS)
def case(request, pipeline_case):
    return pipeline_case(request.param)


def _requests(case):
    """Good requests, then each bad one followed by a good one."""
    good = case.task.contract.requests(case.config)
    bad = case.task.contract.bad_requests(case.config)
    return good, bad


def _check_bad(bad, response_error, response_outputs, where):
    if bad.error is None:
        assert response_error is None, (where, bad.name, response_error)
        bad.check(response_outputs)
    else:
        assert response_error is not None, (where, bad.name, "no error")
        assert bad.error in response_error, (where, bad.name, response_error[:300])


# -- 1. train, evaluate, export, predict -----------------------------------------


def test_commands_write_what_the_docs_say(case):
    run, task = case.run_dir, case.task
    out = case.demo.stdout + case.demo.stderr
    assert "Demo done" in case.demo.stdout
    assert "ran out of data" not in out  # the batch count is known up front
    for name in ("run.json", "config.yaml", "data_summary.txt", "history.csv",
                 "model.weights.h5", "checkpoints/best.weights.h5", "metrics.json",
                 *task.run_files, *task.evaluate_files):  # fmt: skip
        assert (run / name).is_file() and (run / name).stat().st_size > 0, name
    state = run_state(run)
    assert state["task"] == case.name and state["status"] == "finished"
    assert state["epochs"] == 2 and history_epochs(run) == [0, 1]
    assert sorted(p.name for p in (run / "backup").iterdir()) == [
        "epoch-000001",
        "epoch-000002",
    ]
    assert list((run / "logs").rglob("events.out.tfevents*"))
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["split"] == "test"
    # Trivial baselines, each said in words, scored beside the model: in
    # metrics.json, in evaluate's table and in demo's last line.
    assert metrics["baselines"]
    assert all(entry["what"] for entry in metrics["baselines"].values())
    assert "beside" in case.demo.stdout
    (done,) = [line for line in case.demo.stdout.splitlines() if "Demo done" in line]
    assert "baseline" in done
    export = case.export_dir
    extra = "assets.extra/"
    for name in ("saved_model.pb", "variables/variables.index", extra + "op_audit.json",
                 extra + "tf_serving_warmup_requests"):  # fmt: skip
        assert (export / name).is_file(), name
    assert [p.name for p in export.parent.iterdir()] == ["1"]
    # predict ran in its own process on every sample (each line of it: a
    # passage asked several questions is printed once).
    predicted = case.demo.stdout.split("Predicting with the exported SavedModel")[1]
    for sample in task.samples(case.config):
        for line in sample.splitlines():
            assert line in predicted, (line, sample)
    assert not list(run.rglob("*.partial*"))


def test_tensorboard_shows_the_attention_every_epoch(case):
    """The demo's two epochs each wrote the attention of the first three
    validation examples as images, read back from the event files as
    TensorBoard reads them; training said what they cost."""
    if case.name in EXAMPLE_TASKS:
        pytest.skip("the example task draws no attention")
    from pipelines.core.attention_board import read_images

    images = read_images(case.run_dir / "logs" / "attention")
    assert {step for _, step, _ in images} == {0, 1}
    tags = sorted({tag for tag, _, _ in images})
    assert len(tags) == 3 and len(images) == 6, tags
    for tag, step, pixels in images:
        assert pixels.ndim == 3 and pixels.shape[2] == 3, (tag, pixels.shape)
        assert min(pixels.shape[:2]) > 100 and pixels.std() > 10, (tag, step)
    assert "Attention images for TensorBoard:" in case.demo.stdout


def test_warmup_requests_are_served_requests(case):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    warmup = case.export_dir / "assets.extra" / "tf_serving_warmup_requests"
    logs = [
        prediction_log_pb2.PredictionLog.FromString(r.numpy())
        for r in tf.data.TFRecordDataset(str(warmup))
    ]
    assert 1 <= len(logs) <= 1000
    from pipelines.cloader import signature_tensors

    inputs, _ = signature_tensors(case.export_dir)
    assert set(inputs) == case.main_inputs  # serving_default: the main inputs
    for log in logs:
        request = log.predict_log.request
        assert request.model_spec.signature_name == "serving_default"
        assert set(request.inputs) == set(inputs)


# -- 2, 3 and 9. the main input alone, on every path ------------------------------


def test_the_main_input_alone_is_answered_on_every_path(case, tmp_path):
    """A request that holds only the main inputs (no option) is answered by
    ``serving_default`` in a process without this library (its signature,
    the loaded object's function, TF Serving's REST rows and columns) and by
    TF's C++ loader, as the in-process module answers it."""
    from pipelines import cloader

    good, _ = _requests(case)
    feed = case.main_feed(good[0])
    assert set(feed) == case.main_inputs, sorted(feed)
    expected = case.reference(feed)
    results = _fresh(case, tmp_path)["main"]
    text = case.name != "captioning"  # image bytes go to REST as {"b64": ...}
    assert ("rest rows" in results) == text and "function" in results
    if case.name in ("translation", "summarization", "captioning"):
        assert "with_options function" in results
    for where, got in results.items():
        assert_outputs_equal(got, expected, where)
    (response,) = cloader.serve(case.export_dir, [feed], workdir=tmp_path)
    assert response.ok, response.message[:500]
    assert_outputs_equal(response.outputs, expected, "C loader, main input alone")


# -- 2 and 9. served where the library cannot be imported ------------------------


def _fresh(case, tmp_path):
    if "fresh" not in case._cache:
        good, bad = _requests(case)
        follow = good[0]
        requests = list(good)
        for item in bad:
            if item.python:
                requests += [item.feed, follow]
        case._cache["fresh"] = contract.serve_fresh(
            case.export_dir, requests, tmp_path, main=case.main_feed(good[0]),
            rest=case.name != "captioning",
        )  # fmt: skip
    return case._cache["fresh"]


def test_export_serves_without_the_library(case, tmp_path):
    good, _ = _requests(case)
    results = _fresh(case, tmp_path)["requests"]
    for i, feed in enumerate(good):
        assert "ok" in results[i], results[i]
        assert_outputs_equal(results[i]["ok"], case.reference(feed), f"request {i}")


def test_bad_requests_in_python(case, tmp_path):
    good, bad = _requests(case)
    results = _fresh(case, tmp_path)["requests"][len(good) :]
    python = [b for b in bad if b.python]
    assert len(results) == 2 * len(python)
    for item, result, after in zip(python, results[::2], results[1::2], strict=True):
        _check_bad(item, result.get("error"), result.get("ok"), "python")
        assert "ok" in after, (item.name, "the model stopped serving", after)


# -- 3 and 9. TF's C++ loader, no Python in the process --------------------------


def _c_loader(case, tmp_path):
    if "c" not in case._cache:
        from pipelines import cloader

        good, bad = _requests(case)
        requests = list(good)
        for item in bad:
            requests += [item.feed, good[0]]
        signature = route(case.module()[1], {k: 0 for feed in good for k in feed})
        case._cache["c"] = cloader.serve(
            case.export_dir, requests, workdir=tmp_path, signature=signature
        )
    return case._cache["c"]


def test_c_loader_serves_every_string_input(case, tmp_path):
    from tensorflow.python.tools import saved_model_utils

    from pipelines.cloader import signature_tensors

    good, _ = _requests(case)
    meta = saved_model_utils.get_meta_graph_def(str(case.export_dir), "serve")
    signature = route(case.module()[1], {k: 0 for feed in good for k in feed})
    strings = {
        k for k, v in meta.signature_def[signature].inputs.items() if v.dtype == 7
    }
    assert strings and strings <= {k for feed in good for k in feed}, strings
    inputs, _ = signature_tensors(case.export_dir, signature)
    assert {k for feed in good for k in feed} == set(inputs)  # every input fed
    responses = _c_loader(case, tmp_path)
    for i, feed in enumerate(good):
        assert responses[i].ok, (i, responses[i].message[:500])
        assert_outputs_equal(
            responses[i].outputs, case.reference(feed), f"C request {i}"
        )
    audit = json.loads((case.export_dir / "assets.extra" / "op_audit.json").read_text())
    assert audit["unknown"] == [] and audit["core"]


def test_bad_requests_in_the_c_loader(case, tmp_path):
    good, bad = _requests(case)
    responses = _c_loader(case, tmp_path)[len(good) :]
    for item, response, after in zip(bad, responses[::2], responses[1::2], strict=True):
        if item.error is not None:
            assert response.status == "INVALID_ARGUMENT", (item.name, response.status)
        _check_bad(
            item, None if response.ok else response.message, response.outputs, "C"
        )
        assert after.ok, (item.name, "the model stopped serving", after.message)


# -- 5. a damaged newest backup --------------------------------------------------


def _damage(path: Path, kind: str) -> None:
    data = path.read_bytes()
    path.write_bytes(b"" if kind == "empty" else data[: len(data) // 2])


@pytest.mark.parametrize(
    "damaged",
    # test_core.py checks every kind of damage on the backups alone; a damaged
    # state.json is the core's clause, run on one task (`CORE_CLAUSE_TASK`).
    ["model.weights.h5", pytest.param("state.json", marks=pytest.mark.slow)],
)
def test_damaged_backup_resumes_from_the_one_before(case, tmp_path, damaged, capsys):
    from pipelines.core import config as config_lib
    from pipelines.core.trainer import train

    if damaged == "state.json" and case.name != CORE_CLAUSE_TASK:
        pytest.skip(f"a clause of the core's backups, run on {CORE_CLAUSE_TASK}")

    run = tmp_path / "run"
    shutil.copytree(case.run_dir, run, ignore=shutil.ignore_patterns("serving"))
    steps = run_state(run)["optimizer_iterations"] // 2
    victim = run / "backup" / "epoch-000002" / damaged
    _damage(victim, "truncate")
    config = config_lib.apply_overrides(case.config, ["train.epochs=3"])
    state = train(case.task, config, run)
    out = capsys.readouterr().out
    assert str(victim) in out and "Resuming from epoch-000001" in out, out[-2000:]
    # Epoch 2 (index 1) is replayed, epoch 3 follows; the steps continue.
    assert history_epochs(run) == [0, 1, 2]
    assert state["epochs"] == 3 and state["optimizer_iterations"] == 3 * steps


def test_every_backup_damaged_is_refused(case, tmp_path):
    from pipelines.core import config as config_lib
    from pipelines.core.errors import PipelineError
    from pipelines.core.trainer import train

    run = tmp_path / "run"
    shutil.copytree(case.run_dir, run, ignore=shutil.ignore_patterns("serving"))
    for generation in (run / "backup").iterdir():
        _damage(generation / "model.weights.h5", "empty")
    config = config_lib.apply_overrides(case.config, ["train.epochs=3"])
    with pytest.raises(PipelineError, match="every backup .* is damaged"):
        train(case.task, config, run)
    assert history_epochs(run) == [0, 1]  # nothing was overwritten


def test_a_run_killed_after_its_last_backup_finishes_on_rerun(case, tmp_path, capsys):
    """Killed after the backup of its last epoch (or rerun with ``train.epochs``
    raised to where it stood), a run is finished by a rerun that fits no
    epoch: the best weights written, the optimizer's step count kept."""
    from pipelines.core.run_dir import read_json, write_json
    from pipelines.core.trainer import train

    if case.name != "translation":
        pytest.skip("a clause of the core's trainer, run on translation (make test)")
    run = tmp_path / "run"
    shutil.copytree(case.run_dir, run, ignore=shutil.ignore_patterns("serving"))
    steps = run_state(run)["optimizer_iterations"]
    state = read_json(run / "run.json")
    write_json(run / "run.json", {k: state[k] for k in ("task", "fingerprint")}
               | {"status": "training"})  # fmt: skip
    (run / "model.weights.h5").unlink()
    state = train(case.task, case.config, run)
    assert "Resuming after epoch 2" in capsys.readouterr().out
    assert state["status"] == "finished" and state["optimizer_iterations"] == steps
    best = run / "best"  # the best epoch's weights, in _weights' layout
    best.mkdir()
    shutil.copy(run / "checkpoints" / "best.weights.h5", best / "model.weights.h5")
    for a, b in zip(_weights(run), _weights(best), strict=True):
        np.testing.assert_array_equal(a, b)
    assert history_epochs(run) == [0, 1]


# -- 6. publication --------------------------------------------------------------


def test_failed_audit_publishes_nothing(case, tmp_path, monkeypatch):
    from pipelines.core import export
    from pipelines.core.errors import PipelineError

    module, signatures = case.module()
    monkeypatch.setattr(export, "core_ops", lambda: {"NoOp"})
    with pytest.raises(PipelineError, match="no version was published"):
        export.publish(
            module, signatures, tmp_path, "m", warmup=("serving_default",
            module.warmup_requests()),
        )  # fmt: skip
    assert list((tmp_path / "m").iterdir()) == []


# -- 7. the fingerprint guard ------------------------------------------------------


def _main(capfd, *args):
    from pipelines.cli import main

    code = main([str(a) for a in args])
    out, err = capfd.readouterr()
    return code, out, err


def test_another_configuration_is_refused(case, capfd):
    code, _, err = _main(
        capfd, case.name, "train", *TINY, "--run-dir", case.run_dir,
        "--set", "train.seed=7",
    )  # fmt: skip
    assert code == 2
    assert "trained with another configuration (train.seed: 0 -> 7)" in err
    code, out, _ = _main(capfd, case.name, "train", *TINY, "--run-dir", case.run_dir)
    assert code == 0 and "already trained (2 epochs); nothing to do" in out


def test_overwrite_starts_afresh(case, tmp_path, capsys):
    from pipelines.core import config as config_lib
    from pipelines.core.run_dir import RunDir
    from pipelines.core.run_guard import check_run

    run = tmp_path / "run"
    shutil.copytree(case.run_dir, run)
    config = config_lib.apply_overrides(case.config, ["train.seed=7"])
    assert check_run(case.task, config, RunDir(run), overwrite=True) is None
    left = sorted(p.name for p in run.iterdir())
    assert left == [".lock", "serving"], left  # exports are never removed


# -- 8. typed configuration --------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epochs=two", "`train.epochs` must be an int, received 'two' (str)"),
        ("train.batch_size=big", "`train.batch_size` must be an int, received 'big'"),
        ("train.learning_rate=fast", "`train.learning_rate` must be a float"),
        ("train.batch_size=0", "`train.batch_size` must be in [1, inf]"),
        ("train.strategy=gpu", "`train.strategy` must be one of ['auto'"),
        ("train.nope=1", "unknown key `train.nope`"),
    ],
)
def test_config_values_are_type_checked(case, capfd, tmp_path, override, message):
    code, _, err = _main(
        capfd, case.name, "train", "--config", "tiny", "--run-dir", tmp_path / "r",
        "--set", override,
    )  # fmt: skip
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "r").exists()


def test_yaml_values_are_typed(case, tmp_path):
    from pipelines.core import config as config_lib

    path = tmp_path / "c.yaml"
    path.write_text("preset: tiny\ntrain:\n  learning_rate: 3e-3\n  epochs: 3\n")
    config = config_lib.load(str(path), case.task.presets())
    assert config.train.learning_rate == 0.003 and config.train.epochs == 3
    path.write_text("preset: tiny\ntrain:\n  epochs: two\n")
    with pytest.raises(
        config_lib.ConfigError, match=r"`train.epochs` must be an int.*c.yaml"
    ):
        config_lib.load(str(path), case.task.presets())


# -- 10. bad data ------------------------------------------------------------------


def test_bad_data_is_named_before_training(case, tmp_path):
    from pipelines.core import config as config_lib
    from pipelines.core.errors import PipelineError
    from pipelines.core.trainer import train

    cases = case.task.contract.data(tmp_path)
    empty = config_lib.apply_overrides(case.config, cases["empty_file"].overrides)
    with pytest.raises(
        PipelineError, match=f"no examples in {cases['empty_file'].path}"
    ):
        train(case.task, empty, tmp_path / "a")
    split = config_lib.apply_overrides(case.config, cases["empty_valid"].overrides)
    with pytest.raises(PipelineError, match="the valid split is empty"):
        train(case.task, split, tmp_path / "b")
    assert not (tmp_path / "b" / "model.weights.h5").exists()
    summary = (case.run_dir / "data_summary.txt").read_text()
    assert "dropped" in summary or "cut" in summary, summary


# -- 11. one line per failure --------------------------------------------------------


def test_cli_failures_are_one_line(case, tmp_path, capfd):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    broken = tmp_path / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "saved_model.pb").write_bytes(b"\x00garbage")
    runs = [
        ([case.name, "evaluate", "--run-dir", tmp_path / "nowhere"], "train first"),
        ([case.name, "export", "--run-dir", case.run_dir, "--base", blocker / "x"], ""),
        ([case.name, "predict", "--export", broken, "x"], ""),
        ([case.name, "predict", "--export", tmp_path / "none", "x"], "no such export"),
        ([case.name, "evaluate", "--run-dir", case.run_dir, "--set", "train.seed=3"],
         "changes what"),
    ]  # fmt: skip
    for args, message in runs:
        code, _, err = _main(capfd, *args)
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(lines) == 1, (args, err[-2000:])
        assert message in lines[0] and "Traceback" not in err, (args, lines)


# -- 12. the export's dtype ------------------------------------------------------------


def test_export_dtype_follows_the_config_not_the_process(case, tmp_path):
    from pipelines.cli import export_run

    assert contract.bfloat16_ops(case.export_dir) == 0  # the CLI's, a new process
    keras.config.set_dtype_policy("mixed_bfloat16")  # as after mixed training
    path = export_run(case.task, case.run_dir, tmp_path, "m", None, [])
    assert contract.bfloat16_ops(path) == 0
    path = export_run(
        case.task, case.run_dir, tmp_path, "m", None, ["export.dtype=mixed_bfloat16"]
    )
    assert contract.bfloat16_ops(path) > 0
    assert keras.config.dtype_policy().name == "mixed_bfloat16"  # left as it was


# -- 15. XLA ---------------------------------------------------------------------------


def test_train_step_compiles_with_xla_at_static_shapes(case):
    import tensorflow as tf

    _skip_example(case)  # translation's model, which translation compiles

    from pipelines.core import config as config_lib
    from pipelines.core.trainer import build_compiled

    task = case.task
    config = config_lib.apply_overrides(case.config, ["train.jit_compile=true"])
    data = task.load_data(config)
    preprocessors = task.preprocessors(contract_run(case), None, config, create=False)
    dataset = task.make_dataset(data.train, preprocessors, config, True)
    shapes = {
        tuple(tuple(t.shape[1:]) for t in tf.nest.flatten(batch)) for batch in dataset
    }
    assert len(shapes) <= 16, shapes  # one shape per bucket, not per length
    model = build_compiled(task, config, preprocessors, tf.distribute.get_strategy())
    model.trainer.fit(dataset.take(2), epochs=1, verbose=0, shuffle=False)
    assert model.trainer.jit_compile is True


def contract_run(case):
    from pipelines.core.run_dir import RunDir

    return RunDir(case.run_dir)


# -- slow clauses ----------------------------------------------------------------------

# Clauses whose subject is the core rather than the task run on one task:
# `publish`'s version claim (two exports at once), the workers' agreement on
# the chief's backup when a MultiWorkerMirroredStrategy run resumes, and a
# resume past a damaged state.json. Every task still resumes after a kill
# and trains alike on one device, two devices and two workers. The task is
# one whose contract runs in `make test-slow` and whose runs are quick: the
# slow session then never makes translation's demo run (`make test` does).
CORE_CLAUSE_TASK = "qa"
# Two workers train the default pipeline and the core clause task.
MULTI_WORKER_TASKS = {"translation", CORE_CLAUSE_TASK}
# The example task of adding_a_task.md (a translation-like model on the
# core's trainer) proves that a new task needs no new test code with the
# clauses above; the slow ones below test the core's training loop again.
EXAMPLE_TASKS = {"locale"}


def _skip_example(case) -> None:
    if case.name in EXAMPLE_TASKS:
        pytest.skip("the example task runs the contract's task clauses only")


EPOCHS = 4


@pytest.mark.slow
def test_killed_run_resumes_without_losing_an_epoch(case, tmp_path):
    _skip_example(case)
    run = tmp_path / "run"
    command = [
        sys.executable, "-m", "pipelines.cli", case.name, "train", *TINY,
        "--run-dir", str(run), "--set", f"train.epochs={EPOCHS}",
        "--set", "train.early_stopping_patience=10",
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=ROOT, env=QUIET, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.time() + 600
    while len(history_epochs(run)) < 2 and time.time() < deadline:
        assert proc.poll() is None, "training ended before it could be killed"
        time.sleep(0.02)
    # At once: a tiny qa epoch takes ~0.1 s, so any wait could let it finish.
    proc.send_signal(signal.SIGKILL)  # no clean-up, like a lost machine
    proc.wait()
    done = history_epochs(run)
    assert done[:2] == [0, 1] and not (run / "model.weights.h5").exists()
    backups = sorted(p.name for p in (run / "backup").iterdir())
    finished = subprocess.run(
        command, cwd=ROOT, env=QUIET, capture_output=True, text=True, timeout=900
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    last = int(backups[-1].split("-")[1])
    assert f"Resuming after epoch {last}" in finished.stdout
    assert history_epochs(run) == list(range(EPOCHS))
    state = run_state(run)
    steps = state["optimizer_iterations"] // EPOCHS
    assert state["optimizer_iterations"] == EPOCHS * steps and steps > 0


@pytest.mark.slow
def test_two_exports_at_once_take_two_versions(case, distributed, tmp_path):
    """Two processes export one run (`distributed`'s first) at once."""
    if case.name != CORE_CLAUSE_TASK:
        pytest.skip(f"a clause of the core's export, run on {CORE_CLAUSE_TASK}")
    base = tmp_path / "serving"
    command = [sys.executable, "-m", "pipelines.cli", case.name, "export",
               "--run-dir", str(distributed / "single-0"), "--base", str(base),
               "--name", "m"]  # fmt: skip
    procs = [
        subprocess.Popen(command, cwd=ROOT, env=QUIET, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
    assert sorted(p.name for p in (base / "m").iterdir()) == ["1", "2"]


DISTRIBUTED = """
import sys
from pipelines.core.strategy import split_cpu
split_cpu(2)  # before TensorFlow starts; the default strategy uses one of them
from pipelines import registry
from pipelines.core import config as config_lib
from pipelines.core.trainer import train
name, root, repeat = sys.argv[1:]
task = registry.get(name)
base = config_lib.apply_overrides(
    config_lib.preset(task.presets(), "tiny"),
    ["train.epochs=1", "train.steps_per_epoch=3", "train.deterministic=true"],
)
runs = [("single-0", "default"), ("mirrored", "mirrored")]
if repeat == "repeat":
    runs.append(("single-1", "default"))
for run, strategy in runs:
    config = config_lib.apply_overrides(base, [f"train.strategy={strategy}"])
    train(task, config, f"{root}/{run}")
"""


@pytest.fixture(scope="module")
def distributed(case, tmp_path_factory) -> Path:
    """One process per task: a single-device run under op determinism and a
    MirroredStrategy run over 2 CPUs (same global batch, 3 steps); on
    `CORE_CLAUSE_TASK` a second single-device run with the same seed (op
    determinism is the core's). The multi-worker clause compares against
    the first run too."""
    _skip_example(case)
    root = tmp_path_factory.mktemp(f"{case.name}-distributed")
    repeat = "repeat" if case.name == CORE_CLAUSE_TASK else "once"
    proc = subprocess.run(
        [sys.executable, "-c", DISTRIBUTED, case.name, str(root), repeat],
        cwd=ROOT, env=QUIET, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "MirroredStrategy with 2 replica(s)" in proc.stdout
    return root


def _weights(run_dir: Path) -> list[np.ndarray]:
    import h5py

    arrays = []
    with h5py.File(run_dir / "model.weights.h5") as f:
        f["layers"].visititems(
            lambda name, item: arrays.append(np.array(item))
            if isinstance(item, h5py.Dataset) else None
        )  # fmt: skip
    return arrays


def _final_loss(run_dir: Path) -> float:
    import csv

    with open(run_dir / "history.csv") as f:
        return float(list(csv.DictReader(f))[-1]["loss"])


def _resumes(case, run: Path, flags: list[str], env: dict, replicas: str) -> None:
    """A second epoch of a one-epoch distributed run resumes from its backup,
    the optimizer's state restored under the strategy that trains on."""
    again = cli(case.name, "train", "--config", "tiny", "--run-dir", run,
                "--set", "train.epochs=2", "--set", "train.steps_per_epoch=3",
                *flags, env=env)  # fmt: skip
    assert replicas in again.stdout
    assert "Resuming after epoch 1" in again.stdout
    assert history_epochs(run) == [0, 1]
    assert run_state(run)["optimizer_iterations"] == 6


@pytest.mark.slow
def test_mirrored_and_repeated_runs_match_a_single_device(case, distributed):
    """Clause 13 (MirroredStrategy against one device) and, on
    `CORE_CLAUSE_TASK`, clause 14 (two runs with one seed and op
    determinism: equal weights). A distributed run's resume is proven under
    MultiWorkerMirroredStrategy (below), which adds the workers' agreement
    on the backup to what a mirrored resume checks."""
    single, mirrored = distributed / "single-0", distributed / "mirrored"
    if case.name == CORE_CLAUSE_TASK:
        again = distributed / "single-1"
        for a, b in zip(_weights(single), _weights(again), strict=True):
            np.testing.assert_array_equal(a, b)  # deterministic: bit for bit
        assert _final_loss(single) == _final_loss(again)
    np.testing.assert_allclose(_final_loss(mirrored), _final_loss(single), rtol=1e-5)
    for a, b in zip(_weights(single), _weights(mirrored), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_multi_worker_matches_a_single_process(case, distributed, tmp_path):
    """Two worker processes on 127.0.0.1, one command, against the single
    device run of `distributed`; only the chief writes; then (on
    `CORE_CLAUSE_TASK`) the two workers resume for a second epoch. Run on
    `MULTI_WORKER_TASKS`: the launcher and the strategy are the core's, and
    every task's batches are already split over replicas by the mirrored
    clause."""
    if case.name not in MULTI_WORKER_TASKS:
        pytest.skip(f"multi-worker runs on {sorted(MULTI_WORKER_TASKS)}")
    settings = ["--set", "train.epochs=1", "--set", "train.steps_per_epoch=3"]
    multi, single = tmp_path / "multi", distributed / "single-0"
    proc = cli(case.name, "train", "--config", "tiny", "--run-dir", multi,
               "--workers", "2", *settings)  # fmt: skip
    assert "Started 2 workers" in proc.stdout
    assert "MultiWorkerMirroredStrategy with 2 replica(s)" in proc.stdout
    assert run_state(multi)["status"] == "finished"
    worker_log = (multi / "logs" / "worker-1.log").read_text()
    assert "Trained in" in worker_log
    # Only the chief wrote: one backup, no files from the other worker.
    assert [p.name for p in (multi / "backup").iterdir()] == ["epoch-000001"]
    np.testing.assert_allclose(_final_loss(multi), _final_loss(single), rtol=1e-4)
    for a, b in zip(_weights(single), _weights(multi), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)
    if case.name == CORE_CLAUSE_TASK:
        replicas = "MultiWorkerMirroredStrategy with 2 replica(s)"
        _resumes(case, multi, ["--workers", "2"], {}, replicas)
