"""What a user names as an export, checked: the model name, and the files.

`check_model_name` holds ``--name`` to one folder name inside ``--base``;
`damage` says which file of an export is damaged (``saved_model.pb`` that
does not parse, a ``variables/`` checkpoint that cannot be read back), and
`damaged_export_error` turns that into the error a client raises when
loading or calling the export failed. Both need TensorFlow only.

Example:

>>> check_model_name("my-model")
'my-model'
>>> check_model_name("../elsewhere")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pipelines.core.errors.PipelineError: export: the model name (--name) must be ...
"""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.core.errors import PipelineError, capped


def check_model_name(name: object, where: str = "export") -> str:
    """``name`` if it is one folder name, not hidden; else `PipelineError`.

    A model folder lives directly in ``--base``: no separators, not ``.`` or
    ``..``, not empty, and no leading ``.`` (hidden names are an export's
    partial folders, which TF Serving and `publish` skip).
    """
    text = name if isinstance(name, str) else None
    separators = {"/", os.sep, os.altsep or "/", "\0"}
    if text and not text.startswith(".") and not separators & set(text):
        return text
    if not text:
        why = "an empty name"
    elif text in (".", ".."):
        why = "a name of an existing folder"
    elif separators & set(text):
        why = "a path (a separator in it)"
    else:
        why = "a hidden name (exports use those for unfinished versions)"
    raise PipelineError(
        capped(
            f"{where}: the model name (--name) must be one folder name inside "
            f"--base (no '/', not starting with '.'), received {name!r}, {why}; "
            "give --name NAME."
        )
    )


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return capped(lines[0] if lines else type(error).__name__, 200)


def damage(export_dir: str | Path) -> str | None:
    """What is damaged in the SavedModel at ``export_dir`` (its file and
    why), or None when its graph parses and every variable reads back."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    export_dir = Path(export_dir)
    graph = export_dir / "saved_model.pb"
    if not graph.is_file():
        return f"{graph.name} is missing"
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(graph.read_bytes())
    except (DecodeError, ValueError, RuntimeError) as error:
        return f"{graph.name} does not parse ({_first_line(error)})"
    if not proto.meta_graphs:
        return f"{graph.name} holds no graph"
    variables = export_dir / "variables"
    index = variables / "variables.index"
    shards = sorted(p.name for p in variables.glob("variables.data-*"))
    if not index.is_file():
        return "variables/variables.index is missing" if shards else None
    try:
        reader = tf.train.load_checkpoint(str(variables / "variables"))
    except Exception as error:  # TensorFlow's DataLossError, OpError...
        return f"variables/variables.index cannot be read ({_first_line(error)})"
    try:
        for name in reader.get_variable_to_dtype_map():
            reader.get_tensor(name)
    except Exception as error:  # IndexError on a short file, DataLossError
        files = ", ".join(f"variables/{s}" for s in shards) or "variables/"
        return f"{files} cannot be read back ({_first_line(error)})"
    return None


def damaged_export_error(export_dir: str | Path, task: str) -> PipelineError | None:
    """The error to raise for a damaged export (what to do included), or None
    when its files are whole (the failure had another cause)."""
    try:
        found = damage(export_dir)
    except Exception:  # the check itself failed: keep the original error
        return None
    if found is None:
        return None
    return PipelineError(
        capped(
            f"the export at {export_dir} is damaged: {found}; export the run "
            f"again (attention-pipelines {task} export --run-dir RUN --base BASE) "
            "or restore the folder from a copy."
        )
    )
