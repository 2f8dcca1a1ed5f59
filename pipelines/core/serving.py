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
the input; the model goes on serving.

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

from pathlib import Path

import numpy as np
import tensorflow as tf


class ServingModule(tf.Module):
    """Base of a task's exported module: the model's variables, tracked.

    Subclasses define `signatures` (name -> ``tf.function`` with an input
    signature; ``serving_default`` among them) and `warmup_requests`. One
    whose decoding honours ``export.jit_compile`` sets `compiles_decoding`.
    """

    compiles_decoding = False

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
