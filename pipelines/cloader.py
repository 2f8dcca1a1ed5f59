"""The serving smoke tool: TensorFlow's C++ SavedModel loader, no Python inside.

TF Serving loads an export with TensorFlow's C++ loader and the TF1 session
API, feeding the signature's tensors by name. No model server can be
installed here, so `savedmodel_run.c` does the same through the C API of the
TensorFlow wheel (``libtensorflow_cc``). This module compiles it (once per
source and TensorFlow version, in the user's cache), writes the requests,
runs it and reads the responses.

Example (needs gcc; any export of ``attention-pipelines TASK export``)::

    from pipelines.cloader import serve
    [response] = serve("serving/m/1", [{"text": np.array([b"some input"])}])
    response.outputs        # by signature key, or response.code / .message
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipelines.core.errors import PipelineError
from pipelines.core.run_dir import cache_dir

SOURCE = Path(__file__).with_name("savedmodel_run.c")
# TF_DataType codes (tensorflow/c/tf_datatype.h) of the dtypes signatures use.
DTYPES = {
    np.dtype("float32"): 1,
    np.dtype("float64"): 2,
    np.dtype("int32"): 3,
    np.dtype("uint8"): 4,
    np.dtype("int16"): 5,
    np.dtype("int8"): 6,
    np.dtype("int64"): 9,
    np.dtype("bool"): 10,
    np.dtype("uint16"): 17,
    np.dtype("float16"): 19,
    np.dtype("uint32"): 22,
    np.dtype("uint64"): 23,
}
STRING = 7
FROM_CODE = {code: dtype for dtype, code in DTYPES.items()}
STATUS = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    5: "NOT_FOUND",
    9: "FAILED_PRECONDITION",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
}


@dataclass
class Response:
    """One request's outcome: ``outputs`` by signature key, or an error."""

    code: int
    message: str
    outputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def status(self) -> str:
        return STATUS.get(self.code, str(self.code))


def _tensorflow_dir() -> Path:
    import tensorflow as tf

    return Path(tf.__file__).parent


def build(force: bool = False) -> Path:
    """The compiled program (compiled with gcc on first use, then cached)."""
    import tensorflow as tf

    tf_dir = _tensorflow_dir()
    # One binary per source, TensorFlow version and installation (it links
    # that installation's libraries by path).
    key = SOURCE.read_bytes() + tf.__version__.encode() + str(tf_dir).encode()
    digest = hashlib.sha256(key).hexdigest()
    binary = cache_dir() / f"savedmodel_run-{digest[:16]}"
    if binary.exists() and not force:
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"{binary.name}.{os.getpid()}.partial")
    command = [
        os.environ.get("CC", "gcc"), "-O2", str(SOURCE), f"-I{tf_dir / 'include'}",
        f"-L{tf_dir}", "-l:libtensorflow_cc.so.2", "-l:libtensorflow_framework.so.2",
        f"-Wl,-rpath,{tf_dir}", "-lpthread", "-o", str(partial),
    ]  # fmt: skip
    try:
        proc = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError as error:
        raise PipelineError(
            f"the C loader check needs a C compiler ({error.filename}); install gcc "
            "or set CC."
        ) from None
    if proc.returncode != 0:
        raise PipelineError(f"compiling {SOURCE.name} failed: {proc.stderr[-2000:]}")
    partial.replace(binary)
    return binary


def tf_text_libraries() -> list[Path]:
    """tensorflow-text's op libraries, which TF Serving links in (``ops_lib``)."""
    try:
        import tensorflow_text
    except ImportError:
        return []
    root = Path(tensorflow_text.__file__).parent / "python"
    return sorted(p for p in root.rglob("_*.so"))


def signature_tensors(export_dir: str | Path, signature: str = "serving_default"):
    """``(inputs, outputs)``: signature keys to graph tensor names."""
    from tensorflow.python.tools import saved_model_utils

    meta = saved_model_utils.get_meta_graph_def(str(export_dir), "serve")
    if signature not in meta.signature_def:
        raise PipelineError(
            f"{export_dir} has no signature {signature!r}; it has "
            f"{sorted(meta.signature_def)}."
        )
    sig = meta.signature_def[signature]
    return (
        {k: v.name for k, v in sig.inputs.items()},
        {k: v.name for k, v in sig.outputs.items()},
    )


def _pack_tensor(value) -> bytes:
    array = np.asarray(value)
    parts = []
    if array.dtype.kind in "OSU":
        parts.append(struct.pack("<II", STRING, array.ndim))
        parts.append(struct.pack(f"<{array.ndim}q", *array.shape))
        for item in array.reshape(-1):
            data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
            parts.append(struct.pack("<Q", len(data)) + data)
        return b"".join(parts)
    if array.dtype not in DTYPES:
        raise ValueError(f"cloader: unsupported dtype {array.dtype}")
    data = np.ascontiguousarray(array).tobytes()
    parts.append(struct.pack("<II", DTYPES[array.dtype], array.ndim))
    parts.append(struct.pack(f"<{array.ndim}q", *array.shape))
    parts.append(struct.pack("<Q", len(data)) + data)
    return b"".join(parts)


def _name(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<I", len(data)) + data


def write_requests(path: Path, requests: list[dict], inputs: dict, outputs: dict):
    """Write ``requests`` (signature key -> array) in the program's format."""
    keys = sorted(outputs)
    chunks = [b"ALRQ", struct.pack("<I", len(requests))]
    for feed in requests:
        unknown = set(feed) - set(inputs)
        if unknown:
            raise ValueError(f"cloader: no signature inputs {sorted(unknown)}")
        chunks.append(struct.pack("<I", len(feed)))
        for key, value in feed.items():
            chunks.append(_name(inputs[key]) + _pack_tensor(value))
        chunks.append(struct.pack("<I", len(keys)))
        chunks.extend(_name(outputs[key]) for key in keys)
    path.write_bytes(b"".join(chunks))
    return keys


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        chunk = self.data[self.at : self.at + n]
        if len(chunk) != n:
            raise PipelineError("cloader: truncated response file")
        self.at += n
        return chunk

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def tensor(self) -> np.ndarray:
        dtype, rank = self.u32(), self.u32()
        shape = tuple(self.u64() for _ in range(rank))
        if dtype == STRING:
            count = int(np.prod(shape, dtype=np.int64))
            items = [self.take(self.u64()) for _ in range(count)]
            return np.array(items, dtype=object).reshape(shape)
        data = self.take(self.u64())
        if dtype not in FROM_CODE:
            raise PipelineError(
                f"cloader: the model returned TF_DataType {dtype}, which this reader "
                f"does not decode (it decodes {sorted(FROM_CODE)} and strings)."
            )
        return np.frombuffer(data, FROM_CODE[dtype]).reshape(shape).copy()


def read_responses(path: Path, keys: list[str]) -> list[Response]:
    reader = _Reader(path.read_bytes())
    if reader.take(4) != b"ALRS":
        raise PipelineError("cloader: not a response file")
    responses = []
    for _ in range(reader.u32()):
        code = struct.unpack("<i", reader.take(4))[0]
        message = reader.take(reader.u32()).decode("utf-8", "replace")
        count = reader.u32()
        outputs = {keys[i]: reader.tensor() for i in range(count)}
        responses.append(Response(code, message, outputs))
    return responses


def _command(export_dir, requests_path, responses, libraries):
    command = [str(build()), str(export_dir), str(requests_path), str(responses)]
    for library in tf_text_libraries() if libraries is None else libraries:
        command += ["--library", str(library)]
    return command


def serve(
    export_dir: str | Path,
    requests: list[dict],
    signature: str = "serving_default",
    libraries: list[Path] | None = None,
    workdir: str | Path | None = None,
) -> list[Response]:
    """Run ``requests`` through the C loader in one process, in order.

    Each request maps signature input keys to arrays (strings as bytes or
    str); optional inputs may be left out. ``libraries`` are op libraries to
    load first (default: tensorflow-text's, as TF Serving links them).
    """
    import tempfile

    inputs, outputs = signature_tensors(export_dir, signature)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        requests_path, responses_path = Path(tmp) / "requests", Path(tmp) / "responses"
        keys = write_requests(requests_path, requests, inputs, outputs)
        proc = subprocess.run(
            _command(export_dir, requests_path, responses_path, libraries),
            capture_output=True,
            text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        if proc.returncode != 0:
            raise PipelineError(
                f"the C loader failed on {export_dir} (exit {proc.returncode}): "
                f"{proc.stderr.strip()[-2000:]}"
            )
        return read_responses(responses_path, keys)


def bench(
    export_dir: str | Path,
    request: dict,
    threads: int = 8,
    iterations: int = 2000,
    signature: str = "serving_default",
) -> dict[str, float]:
    """Latency of ``request`` from ``threads`` threads in the C loader."""
    import tempfile

    inputs, outputs = signature_tensors(export_dir, signature)
    with tempfile.TemporaryDirectory() as tmp:
        requests_path = Path(tmp) / "requests"
        write_requests(requests_path, [request], inputs, outputs)
        command = _command(export_dir, requests_path, "-", None)
        command += ["--bench", str(threads), str(iterations)]
        proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PipelineError(f"the C loader benchmark failed: {proc.stderr[-2000:]}")
    words = proc.stdout.split()
    return {words[i]: float(words[i + 1]) for i in range(0, len(words), 2)}


if __name__ == "__main__":  # python -m pipelines.cloader EXPORT INPUT=TEXT...
    export, *items = sys.argv[1:]
    feed = {}
    for item in items:
        key, _, text = item.partition("=")
        feed.setdefault(key, []).append(text)
    feed = {k: np.array(v, dtype=object) for k, v in feed.items()}
    for response in serve(export, [feed]):
        print(response.status, response.message, response.outputs)
