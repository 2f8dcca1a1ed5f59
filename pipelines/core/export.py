"""SavedModels in TF Serving's layout, written atomically, with a warmup file.

``<base>/<name>/<version>/`` holds ``saved_model.pb``, ``variables/``,
``assets/`` and ``assets.extra/tf_serving_warmup_requests`` (a TFRecord of
``PredictionLog`` records that TF Serving replays at load). The version is
written under a hidden temporary name in the same folder and renamed into
place only when complete: a crash leaves no half-written version, and an
existing version is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tensorflow as tf

WARMUP_FILE = "tf_serving_warmup_requests"
TF_TEXT_OPS_FILE = Path(__file__).with_name("tf_text_2_20_ops.txt")


def next_version(model_dir: Path) -> int:
    """One more than the largest integer version in ``model_dir`` (1 if none)."""
    versions = [
        int(p.name) for p in model_dir.glob("*") if p.is_dir() and p.name.isdigit()
    ]
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


def export_for_serving(
    module: tf.Module,
    signatures: dict,
    base_dir: str | Path,
    name: str,
    version: int | None = None,
    warmup: tuple[str, list[dict]] | None = None,
    extra_assets: dict[str, str] | None = None,
) -> Path:
    """Save ``module`` as ``<base_dir>/<name>/<version>`` and return that path.

    ``version`` defaults to the next free integer; an existing version raises
    ``FileExistsError``. ``warmup`` is ``(signature_name, [feed, ...])``.
    ``extra_assets`` maps file names to text written in ``assets.extra/``.
    """
    model_dir = Path(base_dir) / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if version is None:
        version = next_version(model_dir)
    if not isinstance(version, int) or version < 1:
        raise ValueError(
            f"export: version must be a positive int, received {version!r}."
        )
    final = model_dir / str(version)
    if final.exists():
        raise FileExistsError(
            f"export: {final} already exists; versions are never overwritten. "
            "Give another --version or leave it out to take the next one."
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}.partial-", dir=model_dir))
    try:
        tf.saved_model.save(module, str(tmp), signatures=signatures)
        if warmup is not None:
            signature, feeds = warmup
            write_warmup(tmp / "assets.extra" / WARMUP_FILE, signature, feeds)
        for filename, text in (extra_assets or {}).items():
            (tmp / "assets.extra").mkdir(exist_ok=True)
            (tmp / "assets.extra" / filename).write_text(text)
        os.rename(tmp, final)  # atomic on one filesystem; fails if final exists
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


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


def core_ops() -> set[str]:
    """Op types core TensorFlow registers, listed in a process without tf-text."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", _CORE_OPS],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    return set(out.split())


def tf_text_serving_ops() -> set[str]:
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
