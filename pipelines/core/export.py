"""Publish a SavedModel in TF Serving's layout: complete, audited, never overwritten.

``<base>/<name>/<version>/`` holds ``saved_model.pb``, ``variables/``,
``assets/`` and ``assets.extra/`` (``tf_serving_warmup_requests``, a TFRecord
of ``PredictionLog`` records TF Serving replays at load, and
``op_audit.json``). `publish` writes everything under a hidden name in the
model folder first (TF Serving only looks at integer names), audits the
graph's ops there, and only then gives the folder its number with one
``rename``: a failed audit or a crash leaves no numbered version, and an
existing version is never touched. Two exports at once to one model folder
take distinct versions; hidden folders that killed exports left are removed.

Example:

>>> import tempfile, tensorflow as tf
>>> class AddOne(tf.Module):
...     @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
...     def serve(self, x):
...         return {"y": x + 1.0}
>>> module, base = AddOne(), tempfile.mkdtemp()
>>> path = publish(module, {"serving_default": module.serve}, base, "m")
>>> path.name, sorted(p.name for p in path.parent.iterdir())
('1', ['1'])
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import tensorflow as tf

from pipelines.core.errors import PipelineError
from pipelines.core.export_check import check_model_name
from pipelines.core.run_dir import cache_dir, commit_point, pid_alive

WARMUP_FILE = "tf_serving_warmup_requests"
AUDIT_FILE = "op_audit.json"
TF_TEXT_OPS_FILE = Path(__file__).with_name("tf_text_2_20_ops.txt")
_PARTIAL = re.compile(r"^\.partial-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]+$")
# Hidden folders of the export code before this one: .3.partial-XXXXXXXX
_LEGACY_PARTIAL = re.compile(r"^\.\d+\.partial-\w+$")
LEGACY_AGE_S = 3600


def next_version(model_dir: Path) -> int:
    """One more than the largest integer version in ``model_dir`` (1 if none)."""
    # Files count too: a version folder cannot be renamed onto one.
    versions = [int(p.name) for p in model_dir.glob("*") if p.name.isdigit()]
    return max(versions, default=0) + 1


def write_warmup(path: Path, signature: str, feeds: list[dict]) -> None:
    """Write TF Serving warmup records: one ``PredictRequest`` per feed dict."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    if not 1 <= len(feeds) <= 1000:
        raise ValueError(f"warmup: 1 to 1000 requests allowed, received {len(feeds)}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for feed in feeds:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(signature_name=signature)
            )
            for key, value in feed.items():
                request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())


# -- the op audit -------------------------------------------------------------


def op_types(export_dir: str | Path) -> set[str]:
    """Every op type in a SavedModel: its graph and its function library."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((Path(export_dir) / "saved_model.pb").read_bytes())
    found = set()
    for meta in proto.meta_graphs:
        found.update(node.op for node in meta.graph_def.node)
        for fn in meta.graph_def.library.function:
            found.update(node.op for node in fn.node_def)
    # Calls to library functions appear as ops named after the function.
    functions = {
        fn.signature.name
        for meta in proto.meta_graphs
        for fn in meta.graph_def.library.function
    }
    return found - functions


_CORE_OPS = """
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session as c
ops = op_def_pb2.OpList()
ops.ParseFromString(c.TF_GetBuffer(c.TF_GetAllOpList()))
print("\\n".join(sorted(o.name for o in ops.op)))
"""


# Ops every SavedModel of ours uses: a cache without them is damaged.
_KNOWN_CORE_OPS = {"Cast", "Const", "Identity", "NoOp", "StatefulPartitionedCall"}


def _core_ops_header(count: int) -> str:
    return f"# core ops of TensorFlow {tf.__version__}: {count}"


def _cached_core_ops(cache: Path) -> set[str] | None:
    """The cached list, or None when it is missing or damaged (truncated,
    another TensorFlow's, not ours): a header line naming this TensorFlow
    and the count, then that many op names, the known core ops among them."""
    try:
        lines = cache.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    ops = {line.strip() for line in lines[1:] if line.strip()}
    if not lines or lines[0] != _core_ops_header(len(ops)):
        return None
    return ops if _KNOWN_CORE_OPS <= ops else None


def core_ops() -> set[str]:
    """Op types core TensorFlow registers, listed in a process without tf-text.

    The list is cached per TensorFlow version in the user's cache folder, so
    only the first export on a machine pays for the second process; a cache
    that fails its check (`_cached_core_ops`) is listed again and replaced
    (atomically: a temporary file renamed into place).
    """
    cache = cache_dir() / f"core-ops-tf-{tf.__version__}.txt"
    ops = _cached_core_ops(cache)
    if ops is not None:
        return ops
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", _CORE_OPS],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    ops = set(out.split())
    if not _KNOWN_CORE_OPS <= ops:
        raise PipelineError(
            "export: listing TensorFlow's core ops gave "
            f"{len(ops)} names, without {sorted(_KNOWN_CORE_OPS - ops)}; the "
            "TensorFlow installation looks broken (reinstall it)."
        )
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.partial")
    text = "\n".join([_core_ops_header(len(ops)), *sorted(ops)]) + "\n"
    try:
        tmp.write_text(text, encoding="utf-8")
        commit_point(f"write {cache.name}")
        tmp.replace(cache)
    except OSError:  # a cache that cannot be written is listed again next time
        tmp.unlink(missing_ok=True)
    return ops


def tf_text_serving_ops() -> set[str]:
    """The TF Text ops TF Serving 2.20 links (``tf_text_2_20_ops.txt``)."""
    lines = TF_TEXT_OPS_FILE.read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def audit_ops(export_dir: str | Path) -> dict[str, list[str]]:
    """Sort the SavedModel's op types into core TF, TF Text 2.20, and unknown.

    An unknown op would fail in TF Serving 2.20 with "Op type not registered".
    """
    used = op_types(export_dir)
    core = core_ops()
    text = tf_text_serving_ops()
    return {
        "core": sorted(used & core),
        "tf_text": sorted((used - core) & text),
        "unknown": sorted(used - core - text),
    }


# -- publication ----------------------------------------------------------------


def clean_partials(model_dir: Path) -> list[str]:
    """Remove hidden folders that killed exports of this host left behind."""
    removed = []
    host = socket.gethostname()
    for path in model_dir.glob(".*"):
        match = _PARTIAL.match(path.name)
        stale = False
        if match and match["host"] == host:
            stale = not pid_alive(int(match["pid"]))
        elif _LEGACY_PARTIAL.match(path.name):
            stale = time.time() - path.stat().st_mtime > LEGACY_AGE_S
        if stale and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def claim_version(tmp: Path, model_dir: Path, version: int | None) -> Path:
    """Rename ``tmp`` to the given or the next free integer version, atomically.

    ``rename`` fails when the target is a non-empty folder, so of two exports
    that pick the same number one wins and the other takes the next.
    """
    for _ in range(1000):
        number = next_version(model_dir) if version is None else version
        final = model_dir / str(number)
        try:
            commit_point(f"publish {model_dir.name}/{number}")
            os.rename(tmp, final)
            return final
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if version is not None:
                raise FileExistsError(
                    f"export: {final} already exists; versions are never "
                    "overwritten. Give another --version or leave it out to take "
                    "the next one."
                ) from None
    raise PipelineError(f"export: no free version found in {model_dir}")


def publish(
    module: tf.Module,
    signatures: dict,
    base_dir: str | Path,
    name: str,
    version: int | None = None,
    warmup: tuple[str, list[dict]] | None = None,
    audit: bool = True,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Save ``module`` as ``<base_dir>/<name>/<version>`` and return that path.

    ``version`` defaults to the next free integer; an existing version raises
    ``FileExistsError``. ``warmup`` is ``(signature_name, [feed, ...])``;
    ``extra_files`` (file name -> text) are written to ``assets.extra/``.
    With ``audit``, an op outside core TensorFlow and TF Text 2.20 stops the
    export before any version appears (`PipelineError`). Each signature is
    also saved as a function of the module (``loaded.serving_default(...)``,
    ``loaded.with_options(x, beam_width=2)``) unless the module's class
    already has an attribute of that name.
    """
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or version < 1
    ):
        raise ValueError(
            f"export: version must be a positive int, received {version!r}."
        )
    model_dir = Path(base_dir) / check_model_name(name)
    model_dir.mkdir(parents=True, exist_ok=True)
    if version is not None and (model_dir / str(version)).exists():
        raise FileExistsError(
            f"export: {model_dir / str(version)} already exists; versions are never "
            "overwritten. Give another --version or leave it out to take the next one."
        )
    clean_partials(model_dir)
    tmp = (
        model_dir
        / f".partial-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )
    tmp.mkdir()
    try:
        for function_name, function in signatures.items():
            # The loaded object's own functions, which take the inputs'
            # Python defaults (the loaded signatures ask for every input).
            if not hasattr(type(module), function_name):
                setattr(module, function_name, function)
        tf.saved_model.save(module, str(tmp), signatures=signatures)
        extra = tmp / "assets.extra"
        extra.mkdir(exist_ok=True)
        if warmup is not None:
            signature, feeds = warmup
            write_warmup(extra / WARMUP_FILE, signature, feeds)
        for file_name, text in (extra_files or {}).items():
            (extra / file_name).write_text(text)
        if audit:
            report = audit_ops(tmp)
            (extra / AUDIT_FILE).write_text(json.dumps(report, indent=2) + "\n")
            if report["unknown"]:
                raise PipelineError(
                    "export: the graph uses ops TF Serving 2.20 may not have: "
                    f"{report['unknown']}; no version was published."
                )
        return claim_version(tmp, model_dir, version)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
