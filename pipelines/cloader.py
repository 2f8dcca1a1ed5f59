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

From a shell (``python -m pipelines.cloader --help`` for the details)::

    python -m pipelines.cloader serving/m/1 "text=some input"
    python -m pipelines.cloader serving/m/1 image=@photo.png
    python -m pipelines.cloader --signature with_options serving/m/1 \\
        image=@photo.png beam_width=3 length_penalty=0.6

From a shell, TensorFlow's C++ start-up lines go to the user's cache
(`pipelines.core.quiet`), so a failed request is one line on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipelines.core.errors import PipelineError, capped
from pipelines.core.files import read_file
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


def _package_dir(name: str) -> Path | None:
    """Where package ``name`` is installed, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _tensorflow_dir() -> Path:
    tf_dir = _package_dir("tensorflow")
    if tf_dir is None:
        raise PipelineError("the C loader needs TensorFlow installed (pip).")
    return tf_dir


LIBRARIES = ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2")


def build(force: bool = False) -> Path:
    """The compiled program (compiled with gcc on first use, then cached)."""
    tf_dir = _tensorflow_dir()
    # One binary per source and TensorFlow installation: it links that
    # installation's libraries by path, and a new wheel changes their files.
    key = [SOURCE.read_bytes(), str(tf_dir).encode()]
    for name in LIBRARIES:
        try:
            stat = (tf_dir / name).stat()
        except FileNotFoundError:
            raise PipelineError(
                f"{tf_dir} has no {name}: the C loader needs the TensorFlow wheel "
                "for Linux."
            ) from None
        key.append(f"{name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    digest = hashlib.sha256(b"\0".join(key)).hexdigest()
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
    package = _package_dir("tensorflow_text")
    if package is None:
        return []
    return sorted(p for p in (package / "python").rglob("_*.so"))


# -- the SignatureDef, read from saved_model.pb without TensorFlow ---------------

DTYPE_NAMES = {code: dtype.name for dtype, code in DTYPES.items()} | {STRING: "string"}


@dataclass(frozen=True)
class TensorInfo:
    """One signature tensor: graph name ``op:index``, TF_DataType, shape.

    ``shape`` is None when the rank is unknown, and a dimension is -1 when
    unknown. ``name`` is empty for a sparse or composite tensor.
    """

    name: str
    dtype: int
    shape: tuple[int, ...] | None

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, f"TF_DataType {self.dtype}")


def signature_def(
    export_dir: str | Path, signature: str = "serving_default"
) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    """``(inputs, outputs)`` of a signature of the ``serve`` MetaGraphDef."""
    from tensorflow.python.tools import saved_model_utils

    export_dir = Path(export_dir)
    if not any((export_dir / f"saved_model.{e}").is_file() for e in ("pb", "pbtxt")):
        raise PipelineError(f"{export_dir} is not a SavedModel (no saved_model.pb).")
    meta = saved_model_utils.get_meta_graph_def(str(export_dir), "serve")
    if signature not in meta.signature_def:
        raise _no_signature(export_dir, signature, meta.signature_def)
    sig = meta.signature_def[signature]

    def info(v) -> TensorInfo:
        shape = v.tensor_shape
        dims = None if shape.unknown_rank else tuple(d.size for d in shape.dim)
        return TensorInfo(v.name, int(v.dtype), dims)

    return (
        {k: info(v) for k, v in sig.inputs.items()},
        {k: info(v) for k, v in sig.outputs.items()},
    )


def _no_signature(export_dir: Path, signature: str, names) -> PipelineError:
    named = sorted(name for name in names if not name.startswith("__"))
    return PipelineError(
        f"{export_dir} has no signature {signature!r}; it has {named}."
    )


def signature_tensors(export_dir: str | Path, signature: str = "serving_default"):
    """``(inputs, outputs)``: signature keys to graph tensor names."""
    inputs, outputs = signature_def(export_dir, signature)
    return (
        {k: v.name for k, v in inputs.items()},
        {k: v.name for k, v in outputs.items()},
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
                f"{_loader_error(proc.stderr)}"
            )
        return read_responses(responses_path, keys)


def _loader_error(stderr: str) -> str:
    """The program's own message, without TensorFlow's log lines before it."""
    at = stderr.find("savedmodel_run: ")
    text = stderr[at + len("savedmodel_run: ") :] if at >= 0 else stderr
    return text.strip()[-2000:]


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


# -- the command line --------------------------------------------------------------

PROG = "python -m pipelines.cloader"
USAGE_ERROR = 2  # argparse's exit status for a wrong command line
REQUEST_FAILED = 1

DESCRIPTION = """\
Serve one request through a SavedModel's signature in TensorFlow's C++ loader
(TF Serving's loader and session API, with tensorflow-text's ops; no Python in
the serving process), and print each output as `KEY: VALUE` on stdout."""

EPILOG = """\
inputs (KEY is an input key of the signature; an unknown key's error lists
the signature's keys and dtypes):
  KEY=TEXT      a string input; repeat KEY for a batch: `source=a source=b`
                feeds ["a", "b"] (shape [2]; a signature input declared with
                shape [] takes one value, fed as a scalar)
  KEY=@FILE     a string input: the file's bytes (an image: `image=@cat.png`);
                KEY=@- reads standard input
  KEY=@@TEXT    the text "@TEXT" (a value that starts with @)
  KEY=NUMBER    an int or float input (int32, float32, ...; bool: true or
                false): a scalar, or a vector when KEY is repeated
  Inputs left out take their SignatureDef defaults, if any.

exit status:
  0  the request succeeded (outputs on stdout)
  1  the request failed (its status and message on stderr as one line, as
     `INVALID_ARGUMENT: ...`), or the export could not be loaded
  2  a wrong command line: unknown option, signature or input key, a value
     that is not of the input's dtype, a file that cannot be read (or is
     not a regular file), an argument that is not UTF-8

example:
  python -m pipelines.cloader serving/dates/1 "source=9 mars 1987"
  python -m pipelines.cloader --signature with_options serving/captions/1 \\
      image=@photo.png beam_width=3 length_penalty=0.6"""


class UsageError(ValueError):
    """The command line does not fit the export (exit status 2)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "export_dir", metavar="EXPORT_DIR", help="a SavedModel (a version folder)"
    )
    parser.add_argument(
        "inputs",
        metavar="KEY=VALUE",
        nargs="*",
        default=[],
        type=_key_value,
        help="a signature input (see below)",
    )
    parser.add_argument(
        "--signature",
        metavar="NAME",
        default="serving_default",
        help="the signature to run (default: %(default)s)",
    )
    return parser


def _key_value(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _string_value(key: str, value: str) -> bytes:
    if value.startswith("@@"):
        return value[1:].encode()
    if value == "@-":
        return sys.stdin.buffer.read()
    if value.startswith("@"):
        path = value[1:]
        try:
            return read_file(path, f"a file for {key}")
        except PipelineError as error:
            raise UsageError(f"{key}={value}: {error}") from None
        except OSError as error:
            reason = error.strerror or type(error).__name__
            raise UsageError(f"{key}={value}: cannot read {path}: {reason}") from None
    return value.encode()


def _number_value(key: str, value: str, info: TensorInfo) -> bool | int | float:
    dtype = FROM_CODE[info.dtype]
    text = value.strip().lower()
    if dtype.kind == "b":
        if text in ("true", "false", "1", "0"):
            return text in ("true", "1")
        wanted = "true or false"
    elif dtype.kind in "iu":
        limits = np.iinfo(dtype)
        try:
            number = int(text)
        except ValueError:
            number = None
        if number is not None and limits.min <= number <= limits.max:
            return number
        wanted = f"an integer from {limits.min} to {limits.max}"
    else:
        try:
            return float(text)
        except ValueError:
            wanted = "a number"
    raise UsageError(f"{key}={value}: {key} is {info.dtype_name}; give {wanted}")


def parse_feed(
    items: list[tuple[str, str]], inputs: dict[str, TensorInfo], signature: str
) -> dict[str, np.ndarray]:
    """One request from the command line's ``(KEY, VALUE)`` pairs.

    A string input's values make a batch ``[N]`` (``@FILE`` is the file's
    bytes); a number input's one value a scalar, several a vector. An input
    declared with shape ``[]`` takes one value, fed as a scalar.
    """
    values: dict[str, list[str]] = {}
    for key, value in items:
        if key not in inputs:
            known = ", ".join(
                f"{k} ({v.dtype_name})" for k, v in sorted(inputs.items())
            )
            raise UsageError(
                f"{signature} has no input {key!r}; its inputs: {known or 'none'}"
            )
        values.setdefault(key, []).append(value)
    feed = {}
    for key, given in values.items():
        info = inputs[key]
        rank = None if info.shape is None else len(info.shape)
        if rank is not None and rank > 1:
            raise UsageError(
                f"{key} has shape {list(info.shape)}; the command line feeds "
                "scalars and vectors (use pipelines.cloader.serve)"
            )
        if rank == 0 and len(given) > 1:
            raise UsageError(f"{key} is a scalar; give it once, not {len(given)} times")
        if info.dtype == STRING:
            array = np.array([_string_value(key, v) for v in given], dtype=object)
            scalar = rank == 0
        elif info.dtype in FROM_CODE:
            numbers = [_number_value(key, v, info) for v in given]
            array = np.array(numbers, dtype=FROM_CODE[info.dtype])
            scalar = rank == 0 or (rank is None and len(given) == 1)
        else:
            raise UsageError(
                f"{key} is {info.dtype_name}, which the command line cannot feed"
            )
        feed[key] = array.reshape(()) if scalar else array
    return feed


def _text(item):
    if isinstance(item, bytes):
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError:
            return item
    return item


def format_output(value: np.ndarray, prefix: str = "") -> str:
    """One output as printed after ``prefix`` (continuation lines aligned);
    strings are decoded from UTF-8 where they are UTF-8."""
    if value.dtype == object:
        decoded = np.empty(value.shape, dtype=object)
        for index, item in np.ndenumerate(value):
            decoded[index] = _text(item)
        value = decoded
    text = np.array2string(
        value, separator=", ", max_line_width=sys.maxsize, prefix=prefix
    )
    return prefix + text


def _one_line(message: str) -> str:
    return capped(" ".join(message.split()))


def _check_utf8(args: argparse.Namespace) -> None:
    """A command line holds text: bytes that are not UTF-8 (Python keeps
    them as lone surrogates) are refused, naming the argument."""
    items = [args.export_dir, args.signature, *(f"{k}={v}" for k, v in args.inputs)]
    for item in items:
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as error:
            raw = os.fsencode(item)
            raise UsageError(
                f"the argument {raw!r} is not UTF-8 text (byte "
                f"{raw[error.start : error.start + 1]!r} at {error.start}); give "
                "text in UTF-8, or raw bytes as KEY=@FILE"
            ) from None


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.cloader``: the exit status (see ``--help``)."""
    parser = _parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        parser.print_help(sys.stderr)
        return USAGE_ERROR
    args = parser.parse_args(argv)
    try:
        _check_utf8(args)
        inputs, _ = signature_def(args.export_dir, args.signature)
        feed = parse_feed(args.inputs, inputs, args.signature)
    except (PipelineError, UsageError) as error:
        print(f"{PROG}: error: {_one_line(str(error))}", file=sys.stderr)
        return USAGE_ERROR
    try:
        [response] = serve(args.export_dir, [feed], signature=args.signature)
    except PipelineError as error:
        print(f"{PROG}: error: {_one_line(str(error))}", file=sys.stderr)
        return REQUEST_FAILED
    if not response.ok:
        # TensorFlow's message: the error on its first line, then the graph
        # node that raised it.
        lines = response.message.strip().splitlines() or [""]
        print(f"{PROG}: {response.status}: {capped(lines[0].strip())}", file=sys.stderr)
        return REQUEST_FAILED
    for key, value in sorted(response.outputs.items()):
        print(format_output(value, prefix=f"{key}: "))
    return 0


if __name__ == "__main__":
    from pipelines.core.quiet import native_stderr_to

    native_stderr_to(cache_dir() / "tensorflow-native.log")
    sys.exit(main())
