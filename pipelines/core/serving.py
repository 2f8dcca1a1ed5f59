"""The serving module base, in-graph input checks, and the client side of an export.

A task's `ServingModule` holds its model and preprocessors and defines the
SavedModel signatures. The base tracks the backend ``tf.Variable``s of the
Keras model: without them the SavedModel loads in TF2 but not in TF1's
session loader, which TF Serving and ``saved_model_cli run`` use ("Could not
find variable ...").

Serving inputs are checked inside the graph, because TF Serving's C++ API
feeds any shape to a placeholder: a signature input is declared with an
unknown shape, checked (`checked_strings`, `checked_scalar`) and only then
given its static shape. A bad request gets an ``InvalidArgument`` that names
the input; the model goes on serving. The export serves `limited_signatures`:
each checks the size of every input first (`RequestLimits`, from the
``export.max_*`` settings), so that no request is worked on beyond them.

Example:

>>> import tensorflow as tf
>>> int(checked_scalar("beam_width", tf.constant(3), tf.int32, 1, 4))
3
>>> try:
...     checked_scalar("beam_width", tf.constant(9), tf.int32, 1, 4)
... except tf.errors.InvalidArgumentError as error:
...     print(error.message.split("data: ")[-1])
b'serving input `beam_width` must be a number in [1, 4]; received 9'
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from pipelines.core.contract_cases import paired_feed


class ServingModule(tf.Module):
    """Base of a task's exported module: the model's variables, tracked.

    Subclasses define `signatures` (name -> ``tf.function`` with an input
    signature; ``serving_default`` among them) and `warmup_requests`. One
    whose decoding honours ``export.jit_compile`` sets `compiles_decoding`;
    one whose string inputs are image files names them in `image_inputs`
    (their bytes are limited by ``export.max_image_bytes``, not
    ``export.max_string_bytes``).
    """

    compiles_decoding = False
    image_inputs: tuple[str, ...] = ()

    def __init__(self, trainer, name: str):
        super().__init__(name=name)
        self.trainer = trainer
        # The backend tf.Variables themselves, for TF1's session loader.
        self.model_variables = [v.value for v in trainer.variables]

    def signatures(self) -> dict:
        raise NotImplementedError

    def warmup_requests(self) -> list[dict]:
        """Feeds of ``serving_default`` for TF Serving's warmup file."""
        return []


def _assert(condition, template: str, *values):
    """An ``Assert`` whose message is one sentence, ``{}`` filled with ``values``."""
    message = tf.strings.format(template, values) if values else template
    return tf.debugging.Assert(condition, [message])


def checked_strings(name: str, value) -> tf.Tensor:
    """``value`` as a ``[batch]`` string vector of valid UTF-8, else InvalidArgument."""
    value = tf.convert_to_tensor(value, tf.string)
    check = _assert(
        tf.equal(tf.rank(value), 1),
        f"serving input `{name}` must be a vector of strings [batch]; "
        "received rank {}",
        tf.rank(value),
    )
    with tf.control_dependencies([check]):
        value = tf.reshape(value, [-1])
    fixed = tf.strings.unicode_transcode(
        value, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )
    valid = tf.equal(fixed, value)
    first_bad = tf.argmin(tf.concat([tf.cast(valid, tf.int32), [0]], 0))
    check = _assert(
        tf.reduce_all(valid),
        f"serving input `{name}` must be valid UTF-8; row {{}} is not",
        first_bad,
    )
    with tf.control_dependencies([check]):
        return tf.identity(value)


def checked_same_batch(first: tuple[str, tf.Tensor], second: tuple[str, tf.Tensor]):
    """The two named ``[batch]`` inputs, after a check that their sizes agree."""
    (a_name, a), (b_name, b) = first, second
    check = _assert(
        tf.equal(tf.size(a), tf.size(b)),
        f"serving inputs `{a_name}` and `{b_name}` must have the same batch size; "
        "received {} and {}",
        tf.size(a),
        tf.size(b),
    )
    with tf.control_dependencies([check]):
        return tf.identity(a), tf.identity(b)


class StringPairModule(ServingModule):
    """A module whose ``serving_default`` is `answer` over two ``[B]`` string
    inputs named ``input_names``; ``samples`` are ``(first, second)`` pairs, its
    warmup request."""

    input_names: tuple[str, str]
    samples: list[tuple[str, str]]

    def answer(self, first, second) -> dict:
        raise NotImplementedError

    def checked_inputs(self, first, second) -> tuple[tf.Tensor, tf.Tensor]:
        """Both inputs checked: string vectors of valid UTF-8, one batch size."""
        a, b = self.input_names
        return checked_same_batch(
            (a, checked_strings(a, first)), (b, checked_strings(b, second))
        )

    def signatures(self) -> dict:
        specs = [tf.TensorSpec(None, tf.string, name=name) for name in self.input_names]
        return {"serving_default": tf.function(self.answer, input_signature=specs)}

    def traced_answer(self):
        """`answer` as one ``tf.function`` (traced once, reused for any batch)."""
        if not hasattr(self, "_traced"):
            self._traced = self.signatures()["serving_default"]
        return self._traced

    def warmup_requests(self) -> list[dict]:
        return [paired_feed(self.input_names, self.samples)]


def checked_scalar(
    name: str, value, dtype, minimum=None, maximum=None, finite: bool = True
) -> tf.Tensor:
    """``value`` as a scalar of ``dtype`` within ``[minimum, maximum]``.

    Floats must be finite (NaN and infinities are refused with ``finite``).
    """
    value = tf.convert_to_tensor(value, dtype)
    rank = tf.rank(value)
    checks = [
        _assert(
            tf.equal(rank, 0),
            f"serving input `{name}` must be a scalar; received rank {{}}",
            rank,
        )
    ]
    with tf.control_dependencies(checks):
        value = tf.reshape(value, [])
    conditions = []
    if finite and dtype.is_floating:
        conditions.append(tf.math.is_finite(value))
    if minimum is not None:
        conditions.append(value >= tf.cast(minimum, dtype))
    if maximum is not None:
        conditions.append(value <= tf.cast(maximum, dtype))
    if conditions:
        low = "-inf" if minimum is None else minimum
        high = "inf" if maximum is None else maximum
        kind = "a finite number" if finite and dtype.is_floating else "a number"
        checks.append(
            _assert(
                tf.reduce_all(tf.stack(conditions)),
                f"serving input `{name}` must be {kind} in [{low}, {high}]; "
                "received {}",
                value,
            )
        )
    with tf.control_dependencies(checks):
        return tf.identity(value)


def checked_ids(name: str, value, vocab_size: int) -> tf.Tensor:
    """``value`` as ``[batch, length]`` int32 ids in ``[0, vocab_size)``."""
    value = tf.convert_to_tensor(value, tf.int32)
    check = _assert(
        tf.equal(tf.rank(value), 2),
        f"serving input `{name}` must be a matrix [batch, length]; received rank {{}}",
        tf.rank(value),
    )
    with tf.control_dependencies([check]):
        value = tf.reshape(value, [tf.shape(value)[0], -1])
    inside = tf.reduce_all((value >= 0) & (value < vocab_size))
    check = _assert(
        inside, f"serving input `{name}` must hold ids in [0, {vocab_size})"
    )
    with tf.control_dependencies([check]):
        return tf.identity(value)


# -- request limits: checked before any work --------------------------------

LIMITS_FILE = "limits.json"  # in assets.extra/, written by the export
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class RequestLimits:
    """The most one request may hold: the ``max_*`` fields of ``ExportConfig``.

    `limited_signatures` checks rows and bytes of every input of every
    signature; a task that decodes image files checks ``max_image_pixels``
    with `checked_image_pixels`. Beyond a limit the request is an
    ``InvalidArgument`` naming the input, the limit and what was received,
    and the model goes on serving.
    """

    max_batch_rows: int
    max_string_bytes: int
    max_image_bytes: int
    max_image_pixels: int

    @classmethod
    def of(cls, export) -> RequestLimits:
        """The limits of an ``ExportConfig``."""
        return cls(**{f.name: getattr(export, f.name) for f in dataclasses.fields(cls)})

    def record(self, module: ServingModule, signatures: dict) -> dict:
        """What ``assets.extra/limits.json`` says: the limits that apply to
        the signatures' inputs, and which string inputs are text or images."""
        strings = {
            spec.name
            for fn in signatures.values()
            for spec in fn.input_signature
            if spec.dtype == tf.string
        }
        images = sorted(strings & set(module.image_inputs))
        text = sorted(strings - set(images))
        out = {"max_batch_rows": self.max_batch_rows, "text_inputs": text}
        if text:
            out["max_string_bytes"] = self.max_string_bytes
        out["image_inputs"] = images
        if images:
            out["max_image_bytes"] = self.max_image_bytes
            out["max_image_pixels"] = self.max_image_pixels
        return out


def checked_request_size(name: str, value, limits: RequestLimits, image=False):
    """``value`` after checks of its rows (``max_batch_rows``: strings count
    one row each, other inputs their first axis) and, for strings, the bytes
    of each (``max_image_bytes`` for image files, else ``max_string_bytes``)."""
    value = tf.convert_to_tensor(value)
    strings = value.dtype == tf.string
    rows = tf.size(value) if strings else tf.reduce_prod(tf.shape(value)[:1])
    most = limits.max_batch_rows
    checks = [
        _assert(
            rows <= most,
            f"serving input `{name}` has {{}} rows; a request may hold at most "
            f"{most} (export.max_batch_rows)",
            rows,
        )
    ]
    if strings:
        key = "max_image_bytes" if image else "max_string_bytes"
        most = getattr(limits, key)
        with tf.control_dependencies(checks):
            lengths = tf.concat([tf.reshape(tf.strings.length(value), [-1]), [0]], 0)
        checks.append(
            _assert(
                tf.reduce_max(lengths) <= most,
                f"serving input `{name}` row {{}} has {{}} bytes; at most {most} "
                f"are accepted (export.{key})",
                tf.argmax(lengths),
                tf.reduce_max(lengths),
            )
        )
    with tf.control_dependencies(checks):
        return tf.identity(value)


def _limited(fn, limits: RequestLimits, images: tuple[str, ...]):
    """``fn`` (a ``tf.function`` with an input signature) behind
    `checked_request_size` on each input; its Python defaults, which the
    SignatureDef records, are kept."""
    python = fn.python_function
    signature = inspect.signature(python)
    specs = fn.input_signature

    def limited(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        checked = {
            key: checked_request_size(spec.name, value, limits, spec.name in images)
            for (key, value), spec in zip(bound.arguments.items(), specs, strict=True)
        }
        return fn(**checked)

    limited.__signature__ = signature
    limited.__name__ = getattr(python, "__name__", "signature")
    return tf.function(limited, input_signature=specs, autograph=False)


def limited_signatures(module: ServingModule, limits: RequestLimits) -> dict:
    """``module.signatures()``, each checking `RequestLimits` first.

    The export serves these: evaluation and in-process use call the task's
    functions as they are, so the limits bind requests only.
    """
    images = tuple(module.image_inputs)
    return {
        name: _limited(fn, limits, images) for name, fn in module.signatures().items()
    }


def served_signatures(module: ServingModule, export) -> tuple[dict, dict[str, str]]:
    """What an export of ``module`` serves under ``export`` (its
    ``ExportConfig``): `limited_signatures`, and the files for
    ``assets.extra/`` that record the limits (`LIMITS_FILE`)."""
    limits = RequestLimits.of(export)
    signatures = limited_signatures(module, limits)
    record = json.dumps(limits.record(module, signatures), indent=2) + "\n"
    return signatures, {LIMITS_FILE: record}


def image_header_sizes(files) -> tf.Tensor:
    """``[B, 2]`` int64 height and width each file's header declares.

    ``files`` are ``[B]`` complete PNG or JPEG files (check the format
    first): a PNG's ``IHDR`` (bytes 16-23, big-endian width then height),
    a JPEG's frame header (``tf.io.extract_jpeg_shape``). Nothing is decoded.
    """
    weights = tf.constant([1 << 24, 1 << 16, 1 << 8, 1], tf.int64)

    def one(file):
        def png():
            ihdr = tf.io.decode_raw(
                tf.strings.substr(file, 16, 8), tf.uint8, fixed_length=8
            )
            ihdr = tf.cast(ihdr, tf.int64)
            width = tf.reduce_sum(ihdr[:4] * weights)
            return tf.stack([tf.reduce_sum(ihdr[4:] * weights), width])

        def jpeg():
            return tf.cast(tf.io.extract_jpeg_shape(file)[:2], tf.int64)

        is_png = tf.strings.substr(file, 0, len(PNG_SIGNATURE)) == PNG_SIGNATURE
        return tf.cond(is_png, png, jpeg)

    files = tf.reshape(tf.convert_to_tensor(files, tf.string), [-1])
    return tf.map_fn(one, files, fn_output_signature=tf.TensorSpec([2], tf.int64))


def checked_image_pixels(name: str, files, max_pixels: int) -> tf.Tensor:
    """``files`` (``[B]`` complete PNG or JPEG files) after a check that no
    header declares more than ``max_pixels`` pixels, before any is decoded
    (a 389 kB PNG can declare 20000 x 20000)."""
    files = tf.convert_to_tensor(files, tf.string)
    sizes = image_header_sizes(files)
    # Each side below 2**31, so the product fits an int64.
    pixels = tf.reduce_prod(tf.minimum(sizes, 1 << 31), axis=1)
    over = tf.concat([tf.cast(pixels > max_pixels, tf.int32), [1]], 0)
    first = tf.argmax(over, output_type=tf.int32)
    height_width = tf.concat([sizes, [[0, 0]]], 0)[first]
    check = _assert(
        tf.reduce_all(pixels <= max_pixels),
        f"serving input `{name}` row {{}} is an image of {{}} x {{}} pixels "
        f"(height x width), {{}} pixels; at most {max_pixels} are accepted "
        "(export.max_image_pixels)",
        first,
        height_width[0],
        height_width[1],
        tf.concat([pixels, [0]], 0)[first],
    )
    with tf.control_dependencies([check]):
        return tf.identity(files)


# -- the client side: TensorFlow (and tensorflow-text) only -----------------


def latest_version(model_dir: str | Path) -> Path:
    """The highest integer version folder of a TF Serving model folder."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"no such export folder: {model_dir}")
    versions = sorted(
        (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    if not versions:
        raise FileNotFoundError(f"no integer version folder in {model_dir}")
    return versions[-1]


def resolve_export(path: str | Path) -> Path:
    """A version folder, or a model folder's latest version."""
    path = Path(path)
    return path if (path / "saved_model.pb").exists() else latest_version(path)


def signature_defaults(export_dir: str | Path, signature="serving_default") -> dict:
    """The defaults a SignatureDef records for its optional inputs."""
    from tensorflow.python.tools import saved_model_utils

    meta = saved_model_utils.get_meta_graph_def(str(export_dir), "serve")
    sig = meta.signature_def[signature]
    return {k: tf.make_ndarray(v) for k, v in sig.defaults.items()}


OPTIONS_SIGNATURE = "with_options"


def call_export(
    export_dir: str | Path, feed: dict, signature: str = "serving_default"
) -> dict[str, np.ndarray]:
    """Load an export with TensorFlow alone and call one signature.

    Inputs left out of ``feed`` take the defaults the SignatureDef records
    (Python's loaded signatures ask for every input). An export made before
    ``with_options`` existed took the options in ``serving_default``, which
    then answers for it. Needs tensorflow-text imported first for subword
    models.
    """
    export_dir = resolve_export(export_dir)
    signatures = tf.saved_model.load(str(export_dir)).signatures
    if signature == OPTIONS_SIGNATURE and signature not in signatures:
        signature = "serving_default"
    fn = signatures[signature]
    feed = {**signature_defaults(export_dir, signature), **feed}
    tensors = {k: tf.constant(v) for k, v in feed.items()}
    return {k: v.numpy() for k, v in fn(**tensors).items()}
