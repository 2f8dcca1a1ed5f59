"""Faults from outside the program: a full disk, damaged files, hostile input.

Each test makes the fault for real where it can (a tmpfs of 400 kB, a FIFO,
``/dev/zero``, a corrupted export, a "billion laughs" YAML file) and checks
the one line the user gets: what was expected, what was received, what to do.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipelines.cli import describe
from pipelines.core.errors import MAX_MESSAGE, ConfigError, PipelineError

ROOT = Path(__file__).resolve().parents[2]
# The longest one line: the cap and its "... (N characters cut)".
LONGEST = MAX_MESSAGE + 40


def _main(capfd, *args) -> tuple[int, str]:
    from pipelines.cli import main

    capfd.readouterr()
    code = main([str(a) for a in args])
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) <= 1, err
    return code, lines[0] if lines else ""


@pytest.fixture
def tmpfs(tmp_path):
    """A 400 kB file system (root only; skipped where mount is refused)."""
    folder = tmp_path / "tmpfs"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(folder)]
    try:
        done = subprocess.run(mount, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        done = None
    if done is None or done.returncode:
        pytest.skip("mounting a tmpfs is not permitted here")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


# -- one line that keeps the cause -----------------------------------------------


# h5py writes the weights of every checkpoint; it wraps ENOSPC in its own
# OSError or RuntimeError ("file write failed ... errno = 28"). A separate
# process: HDF5 can crash a process whose writes failed.
_FULL_DISK = textwrap.dedent(
    """
    import errno, json, os, resource, shutil, sys
    import h5py, numpy as np
    from pipelines.cli import describe
    folder = sys.argv[1]
    lines = {}
    try:
        with h5py.File(os.path.join(folder, "w.weights.h5"), "w") as f:
            f["x"] = np.zeros(200_000)
    except Exception as error:
        lines["h5py"] = describe(error)
    try:
        with open(os.path.join(folder, "big"), "wb") as f:
            f.write(b"x" * 1_000_000)
    except Exception as error:
        lines["open"] = describe(error)
    os.makedirs(os.path.join(folder, "ro"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20))
    try:
        [open(os.devnull) for _ in range(30)]
    except Exception as error:
        lines["files"] = describe(error)
    print(json.dumps(lines))
    """
)


def test_a_full_disk_is_one_line_naming_the_file_and_what_to_do(tmpfs):
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmpfs)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = json.loads(proc.stdout.splitlines()[-1])
    for key in ("h5py", "open"):  # a plain write does not say which file
        line = lines[key]
        assert line.startswith("no space left on the device"), line
        assert "free some space" in line, line
        assert "unexpected" not in line and len(line) < LONGEST, line
    assert f": {tmpfs / 'w.weights.h5'}; free" in lines["h5py"]
    assert lines["files"].startswith("too many open files"), lines["files"]
    assert "ulimit -n" in lines["files"]


def test_os_errors_are_found_anywhere_in_the_chain_and_the_text():
    import tensorflow as tf

    # h5py's flush on close, as Keras raised it when saving weights.
    flush = RuntimeError(
        "Disable slist on flush dest failure failed (file write failed: time = "
        "Mon Dec  7 04:26:32 2026\n, filename = '/runs/a/checkpoints/last.weights"
        ".h5', file descriptor = 3, errno = 28, error message = 'No space left on "
        "device', buf = 0x5, total write size = 2048, bytes this sub-write = 2048)"
    )
    line = describe(flush)
    assert line == (
        "no space left on the device: /runs/a/checkpoints/last.weights.h5; free "
        "some space there (or write to another disk) and rerun."
    )
    tf_error = tf.errors.ResourceExhaustedError(
        None, None, "Failed to write /runs/b/ckpt.data; No space left on device"
    )
    assert describe(tf_error).startswith("no space left on the device: /runs/b/ckpt")
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", "/mnt/ro/run")
        except OSError as inner:
            raise KeyError("while saving") from inner
    except KeyError as error:
        line = describe(error)
    assert line.startswith("read-only file system: /mnt/ro/run; choose a writable")
    context = ValueError("cleanup failed")
    context.__context__ = OSError(errno.EMFILE, "Too many open files")
    assert describe(context).startswith("too many open files; raise the limit")
    denied = describe(PermissionError(errno.EACCES, "Permission denied", "/srv/m"))
    assert denied.startswith("permission denied: /srv/m; fix the permissions")
    # Our own errors keep their words; other errors theirs.
    assert describe(PipelineError("data: x.tsv: cannot be read (Permission denied)"))
    assert describe(ValueError("bad value")) == "bad value"


def test_every_error_line_is_capped():
    import tensorflow as tf

    for error in (
        ValueError("v" * 100_000),
        PipelineError("p" * 100_000),
        KeyError("k" * 100_000),
        tf.errors.InvalidArgumentError(None, None, "t" * 100_000),
    ):
        line = describe(error)
        assert len(line) < LONGEST + 120 and "characters cut)" in line, line[-200:]
    config = ConfigError("c" * 100_000)
    assert len(str(config)) < LONGEST and str(config).endswith("characters cut)")


def test_an_in_graph_assertion_keeps_its_own_text():
    """The message of a failed ``tf.debugging.Assert`` in a served graph, not
    its last line (the node that raised it)."""
    import tensorflow as tf

    message = (
        "Graph execution error:\n\nDetected at node Assert_3/Assert defined at "
        "(most recent call last):\n<stack traces unavailable>\nassertion failed: "
        "[serving input `beam_width` must be a number in [1, 3]; received 9]\n\t "
        "[[{{node Assert_3/Assert}}]] [Op:__inference_signature_wrapper_85]"
    )
    line = describe(tf.errors.InvalidArgumentError(None, None, message))
    assert line == (
        "TensorFlow InvalidArgumentError: serving input `beam_width` must be a "
        "number in [1, 3]; received 9"
    )

    @tf.function
    def checked(x):
        tf.debugging.Assert(x < 3, ["x must be below 3; received", x])
        return x

    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        checked(tf.constant(9))
    line = describe(raised.value)
    assert "x must be below 3; received" in line and "{{node" not in line, line


# -- a damaged export --------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory) -> Path:
    """A SavedModel with a variable: ``variables.data-*`` holds its values."""
    import tensorflow as tf

    class Scale(tf.Module):
        def __init__(self):
            self.scale = tf.Variable(tf.range(5000, dtype=tf.float32))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="source")])
        def serve(self, source):
            return {"n": tf.size(source) + tf.cast(self.scale[0], tf.int32)}

    module = Scale()
    path = tmp_path_factory.mktemp("faults") / "model" / "1"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def _damaged(tiny_export: Path, tmp_path: Path, how: str) -> Path:
    import shutil

    path = tmp_path / how / "1"
    shutil.copytree(tiny_export, path)
    if how == "data":  # truncated: "IndexError: Read less bytes than requested"
        (data,) = (path / "variables").glob("variables.data-*")
        os.truncate(data, data.stat().st_size // 2)
    elif how == "index":
        os.truncate(path / "variables" / "variables.index", 10)
    else:  # a truncated graph
        graph = path / "saved_model.pb"
        os.truncate(graph, graph.stat().st_size // 2)
    return path


def test_a_damaged_export_is_named_with_its_file_and_what_to_do(
    tiny_export, tmp_path, capfd
):
    for how, file in (
        ("data", "variables/variables.data-00000-of-00001"),
        ("index", "variables/variables.index"),
        ("graph", "saved_model.pb"),
    ):
        path = _damaged(tiny_export, tmp_path, how)
        code, line = _main(capfd, "translation", "predict", "--export", path, "hola")
        assert code == 2, how
        assert line.startswith(f"error: the export at {path} is damaged: {file}"), line
        assert "export the run again" in line and "unexpected" not in line, line
    from pipelines.core.export_check import damage

    assert damage(tiny_export) is None


# -- files and the command line ----------------------------------------------------


_READERS = textwrap.dedent(
    """
    import json, resource, sys
    from pipelines.captioning.data import read_folder
    from pipelines.cli import describe
    from pipelines.data.user_files import read_jsonl, read_parallel, read_tsv
    from pipelines.qa.babi_text import read_babi_text

    fifo, folder = sys.argv[1:]
    # Were a file read without a bound: 1 GB, then MemoryError.
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (2**30, hard))
    out = {}
    for name, path in (("zero", "/dev/zero"), ("fifo", fifo)):
        for reader in (read_tsv, read_jsonl, read_babi_text,
                       lambda p: read_parallel(p, p)):
            try:
                reader(path)
                out[f"{name}-{len(out)}"] = "read"
            except Exception as error:
                out[f"{name}-{len(out)}"] = describe(error)
    try:
        read_folder(folder)
        out["folder"] = "read"
    except Exception as error:
        out["folder"] = describe(error)
    print(json.dumps(out))
    """
)


def test_data_sources_must_be_regular_files(tmp_path):
    """``/dev/zero`` (which never ends) and a FIFO (which waits for a
    writer) are refused before reading, by every reader of user files."""
    fifo = tmp_path / "pairs.tsv"
    os.mkfifo(fifo)
    folder = tmp_path / "images"
    folder.mkdir()
    os.mkfifo(folder / "a.png")
    (folder / "captions.jsonl").write_text('{"image": "a.png", "caption": "x"}\n')
    proc = subprocess.run(
        [sys.executable, "-c", _READERS, str(fifo), str(folder)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    for key, line in out.items():
        kind = "a character device" if key.startswith("zero") else "a FIFO"
        assert f"received {kind}" in line and "expected a" in line, (key, line)
        assert len(line) < LONGEST, line
    assert "expected an image file" in out["folder"]


def _not_waiting_on(fifo: Path, call):
    """``call()``'s result; fails if it waits for a writer of ``fifo``."""
    import threading

    result = []
    worker = threading.Thread(target=lambda: result.append(call()))
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():  # it waits for a writer: give it one, then fail
        with open(fifo, "w"):
            pass
        worker.join()
        pytest.fail(f"waited on the FIFO {fifo}")
    return result[0]


def test_predict_file_must_be_a_regular_file(tmp_path, capfd):
    fifo = tmp_path / "inputs.txt"
    os.mkfifo(fifo)
    args = ["translation", "predict", "--export", tmp_path, "--file", fifo]
    code, line = _not_waiting_on(fifo, lambda: _main(capfd, *args))
    assert code == 2 and line.startswith(f"error: {fifo}: expected a UTF-8"), line
    assert "received a FIFO" in line, line


def test_a_file_over_the_bound_is_refused(tmp_path, monkeypatch):
    from pipelines.data.user_files import read_tsv

    variable = "ATTENTION_PIPELINES_MAX_FILE_BYTES"
    path = tmp_path / "pairs.tsv"
    path.write_text("a\tb\n" * 4)  # 16 bytes
    monkeypatch.setenv(variable, "16")
    assert read_tsv(path) == [("a", "b")] * 4
    monkeypatch.setenv(variable, "15")
    with pytest.raises(PipelineError) as refused:
        read_tsv(path)
    message = str(refused.value)
    assert "expected a TSV file of at most 15 bytes, received 16 bytes" in message
    assert variable in message
    from pipelines.core import files

    # A file that holds more than its size says (as one that grows while it
    # is read) is still read only to the bound: /proc's files say 0 bytes.
    with pytest.raises(PipelineError, match="grew while read"):
        files.read_file("/proc/self/maps", "a TSV file", limit=100)
    monkeypatch.setenv(variable, "lots")
    with pytest.raises(PipelineError, match="must be a positive number of bytes"):
        read_tsv(path)


def test_the_c_loaders_files_are_regular_files_too(tiny_export, tmp_path, capfd):
    from pipelines import cloader

    fifo = tmp_path / "image.png"
    os.mkfifo(fifo)
    capfd.readouterr()
    code = _not_waiting_on(
        fifo, lambda: cloader.main([str(tiny_export), f"source=@{fifo}"])
    )
    (line,) = capfd.readouterr().err.splitlines()
    assert code == 2 and line == (
        f"python -m pipelines.cloader: error: source=@{fifo}: {fifo}: expected a "
        "file for source, received a FIFO (named pipe); give a regular file (copy a "
        "stream into one first)."
    )


# Each level nine aliases of the one before: expanded, 9**7 strings, whose
# repr in a "must be an integer" message was 33 MB.
BILLION_LAUGHS = "\n".join(
    ["train:", "  epochs:", '    - &a ["lol","lol","lol","lol","lol","lol","lol"]']
    + [
        f"    - &{b} [{','.join(['*' + a] * 9)}]"
        for a, b in zip("abcdef", "bcdefg", strict=True)
    ]
)


def test_yaml_aliases_are_refused_in_files_and_overrides(tmp_path):
    from pipelines import registry
    from pipelines.core.config import apply_overrides, load

    task = registry.get("translation")
    path = tmp_path / "laughs.yaml"
    path.write_text(BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 400
    with pytest.raises(ConfigError) as refused:
        load(str(path), task.presets(), task.default_preset)
    message = str(refused.value)
    assert message.startswith(f"config: {path}: line 3, column 7: YAML anchors")
    assert len(message) < LONGEST
    config = load("tiny", task.presets(), task.default_preset)
    with pytest.raises(ConfigError, match="--set train.epochs: line 1.*aliases"):
        apply_overrides(config, ["train.epochs=[&a [1, 2], *a, *a]"])
    # Plain values still parse; text that is not YAML stays text.
    config = apply_overrides(config, ["train.epochs=3", "data.source=[tsv:a"])
    assert config.train.epochs == 3 and config.data.source == "[tsv:a"
    with pytest.raises(ConfigError) as refused:
        apply_overrides(config, ["train.epochs=" + "x" * 100_000])
    assert len(str(refused.value)) < LONGEST


@pytest.mark.parametrize(
    "name, why",
    [
        ("../../escape", "a path"),
        ("{tmp}/absolute", "a path"),  # would ignore --base
        ("a/b", "a path"),
        (".", "a name of an existing folder"),
        ("..", "a name of an existing folder"),
        ("", "an empty name"),
        (".partial-x", "a hidden name"),
    ],
)
def test_an_export_name_is_one_folder_in_base(tmp_path, name, why):
    import tensorflow as tf

    from pipelines.core.export import publish

    name = name.format(tmp=tmp_path)
    base = tmp_path / "deep" / "base"
    base.mkdir(parents=True)
    with pytest.raises(PipelineError) as refused:
        publish(tf.Module(), {}, base, name, audit=False)
    message = str(refused.value)
    assert f"received {name!r}, {why}" in message and "--name" in message, message
    assert list(tmp_path.rglob("saved_model.pb")) == []
    assert list(base.iterdir()) == []


def test_predict_checks_the_name_too(tmp_path, capfd):
    code, line = _main(capfd, "translation", "predict", "--base", tmp_path,
                       "--name", "../x", "hola")  # fmt: skip
    assert code == 2 and "the model name (--name) must be one folder" in line, line


def test_a_damaged_op_cache_is_rebuilt(tmp_path, monkeypatch):
    import tensorflow as tf

    from pipelines.core import export

    # The listing process (test_core.py runs the real one), counted.
    known = {"Cast", "Const", "Identity", "NoOp", "StatefulPartitionedCall"}
    listed = sorted(known | {f"Op{i}" for i in range(300)})
    calls = []

    def listing(*args, **kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, "\n".join(listed) + "\n", "")

    monkeypatch.setattr(export.subprocess, "run", listing)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "attention-pipelines" / f"core-ops-tf-{tf.__version__}.txt"
    cache.parent.mkdir(parents=True)
    cache.write_text("Abort\nAbs\nAccumulateNV2\n")  # a truncated old-style list
    ops = export.core_ops()
    assert ops == set(listed) and len(calls) == 1
    lines = cache.read_text().splitlines()
    assert lines[0] == f"# core ops of TensorFlow {tf.__version__}: {len(ops)}"
    full = cache.read_text()
    assert export.core_ops() == ops and len(calls) == 1  # a whole cache is used
    cache.write_text(full[: len(full) // 2])  # cut mid-write, header kept
    assert export.core_ops() == ops and len(calls) == 2
    assert cache.read_text() == full
    assert not [p for p in cache.parent.iterdir() if p.name.endswith(".partial")]


@pytest.mark.tf_only
@pytest.mark.slow  # trains twice: make test-slow
def test_a_full_disk_in_training_is_one_line_and_the_rerun_resumes(tmpfs, capsys):
    """A real ``train`` on a disk that fills: one line naming the disk's
    refusal and what to do (it was "RuntimeError: Disable slist on flush
    dest failure failed ... (unexpected; report it)"), no temporary left
    behind (each rerun failed alike), and once there is room the same
    command finishes the run."""
    from pipelines import registry
    from pipelines.core import config as config_lib
    from pipelines.core.trainer import train

    task = registry.get("translation")
    config = config_lib.apply_overrides(
        config_lib.load("tiny", task.presets()),
        ["train.epochs=2", "train.strategy=default", "train.attention_images=0"],
    )
    run = tmpfs / "run"
    with pytest.raises(Exception) as failed:
        train(task, config, run)
    line = describe(failed.value)
    assert line.startswith("no space left on the device"), line
    assert "free some space" in line and "unexpected" not in line, line
    assert not [p.name for p in run.rglob(".*partial*")]
    remount = ["mount", "-o", "remount,size=8m", str(tmpfs)]
    assert subprocess.run(remount, capture_output=True, timeout=30).returncode == 0
    capsys.readouterr()
    state = train(task, config, run)
    print(line, capsys.readouterr().out, sep="\n")
    assert state["status"] == "finished" and state["epochs"] >= 1
