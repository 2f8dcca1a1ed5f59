"""The call contract shared by every score-based attention layer.

A score-based layer compares each query with every key, turns the scores into
weights with a masked softmax, and returns the weighted sum of the values. Only
the score function differs between Bahdanau, Luong and scaled dot-product
attention, so subclasses implement ``build_score`` and ``score``; everything
else (validation, masks, dtype handling, dropout, single-step queries) lives
here once.
"""

import numbers
import warnings
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from attention_layers import masking

_RANK3 = "a rank-3 tensor [batch, length, dim]"


def static_shape(shape):
    """``shape`` as a tuple of ints, with ``None`` for every unknown dimension.

    JAX traces with symbolic dimensions that cannot be compared; they count as
    unknown here, like TensorFlow's ``None``.
    """
    return tuple(d if isinstance(d, int) else None for d in shape)


def linear(x, w):
    """``x @ w`` over the last axis of ``x``, computed as one 2-D matmul.

    ``w`` is ``[D, U]`` (or ``[D]``, which drops the last axis). On TensorFlow
    the matmul of a rank-3 or higher tensor by a matrix is a ``tensordot``,
    whose transposes take their permutation as a tensor; inside a
    differentiated loop (a decoder's steps) XLA then cannot compile the
    gradient ("must be a compile-time constant"). A reshape to 2-D is the
    same arithmetic without that transpose.
    """
    x = ops.convert_to_tensor(x)
    vector = len(w.shape) == 1
    if vector:
        w = ops.expand_dims(w, 1)
    if len(x.shape) == 2:
        out = ops.matmul(x, w)
    else:
        lead = ops.shape(x)[:-1]
        flat = ops.reshape(x, (-1, ops.shape(x)[-1]))
        out = ops.reshape(ops.matmul(flat, w), (*lead, w.shape[-1]))
    return ops.squeeze(out, -1) if vector else out


def apply_dense(layer, x):
    """``layer(x)`` for a ``Dense`` layer, on any rank, as a 2-D matmul (`linear`)."""
    x = ops.convert_to_tensor(x)
    if len(x.shape) == 2:
        return layer(x)
    lead = ops.shape(x)[:-1]
    out = layer(ops.reshape(x, (-1, ops.shape(x)[-1])))
    return ops.reshape(out, (*lead, layer.units))


def concrete_value(x):
    """``x`` as a numpy array when its value is known now (eager), else None
    (a symbolic or traced tensor has no value before run time): for checks
    of values that can only be made eagerly."""
    try:
        return np.asarray(ops.convert_to_numpy(x))
    except Exception:  # symbolic or traced
        return None


def input_error(layer, argument, expected, received):
    """The ``ValueError`` every layer raises for bad input, in one format."""
    return ValueError(
        f"{layer.__class__.__name__} (name={layer.name!r}): argument "
        f"`{argument}` expected {expected}; received {received}."
    )


def check_positive_int(layer, argument, value, allow_none=False, meaning=""):
    """``value`` if it is an integer >= 1 (a bool is not), else a ``ValueError``.

    ``layer`` is the layer whose argument it is (the error is `input_error`),
    or the name of a function, a decoder, whose argument sets static shapes:
    then only a Python int passes and the error names the function. With
    ``allow_none``, None passes too (an optional size); ``meaning`` is said
    after "a positive integer" in a layer's error (e.g. "(the half-width D)").
    """
    if value is None and allow_none:
        return None
    function = isinstance(layer, str)
    integral = int if function else numbers.Integral
    if isinstance(value, bool) or not isinstance(value, integral) or value < 1:
        if function:
            raise ValueError(
                f"{layer}: `{argument}` must be a positive Python int (it sets "
                f"static shapes), received {value!r}."
            )
        expected = "a positive integer" + (" or None" if allow_none else "")
        expected += f" {meaning}" if meaning else ""
        raise input_error(layer, argument, expected, repr(value))
    return int(value)


def renamed_argument(layer, kwargs, old, new, value):
    """``kwargs.pop(old)`` with a ``DeprecationWarning`` if the caller used the
    former name ``old`` of the argument ``new`` (else ``value``); for use in
    ``__init__`` before ``super().__init__(**kwargs)``."""
    if old not in kwargs:
        return value
    warnings.warn(
        f"{type(layer).__name__}({old}=...) is deprecated: use `{new}`.",
        DeprecationWarning,
        stacklevel=3,
    )
    return kwargs.pop(old)


def fresh_initializer(initializer, index=0):
    """A copy of ``initializer`` for one more weight of a layer.

    Keras 3 initializers give the same values on every call (an unseeded one
    draws its seed once, when it is made), so one instance shared by two
    weights of one shape makes them equal, and ``W1 == W2`` learn the same
    thing. The copy, made from the initializer's config, draws a new seed; a
    seeded one gets ``seed + index``, so a seeded layer is reproducible and its
    weights still differ. Initializers without randomness are returned as is.

    >>> import keras
    >>> init = keras.initializers.get("glorot_uniform")
    >>> a = fresh_initializer(init)((3, 3))
    >>> b = fresh_initializer(init)((3, 3))
    >>> bool(keras.ops.all(a == b))
    False
    """
    initializer = keras.initializers.get(initializer)
    config = initializer.get_config()
    if "seed" not in config:  # not a random initializer
        return initializer
    seed = config["seed"]
    if isinstance(seed, int) and not isinstance(seed, bool):
        config["seed"] = seed + index
    return initializer.__class__.from_config(config)


_KERAS_OBJECTS = (
    keras.initializers.Initializer,
    keras.regularizers.Regularizer,
    keras.constraints.Constraint,
)


def config_entries(layer, names):
    """``{name: layer.<name>}`` for a ``get_config``, with initializers,
    regularizers and constraints serialized (plain functions too, which
    ``keras.regularizers.get`` and ``keras.constraints.get`` keep as given)."""
    entries = {}
    for name in names:
        value = getattr(layer, name)
        if isinstance(value, _KERAS_OBJECTS) or callable(value):
            value = keras.saving.serialize_keras_object(value)
        entries[name] = value
    return entries


def score_dtype(compute_dtype):
    """Dtype for products of unbounded activations: float32 under float16.

    ``q . k`` overflows float16 (max 65504) at a few hundred times unit
    scale, so score products are taken in float32 there; bfloat16 has the
    float32 range and keeps its own dtype.
    """
    return "float32" if compute_dtype == "float16" else compute_dtype


def check_float(layer, argument, x):
    """Raise ``input_error`` unless ``x`` has a floating-point dtype."""
    dtype = keras.backend.standardize_dtype(x.dtype)
    if "float" not in dtype:
        raise input_error(layer, argument, "a floating-point tensor", f"dtype {dtype}")


def check_mask_shape(layer, argument, mask, expected_shape):
    """Raise ``input_error`` unless ``mask`` matches ``expected_shape`` (None: any)."""
    if mask is None:
        return
    shape = static_shape(mask.shape)
    ok = len(shape) == len(expected_shape) and all(
        a is None or b is None or a == b
        for a, b in zip(shape, expected_shape, strict=True)
    )
    if not ok:
        raise input_error(
            layer, argument, f"shape {tuple(expected_shape)}", f"shape {shape}"
        )


def check_built_dim(layer, argument, x, built):
    """Raise ``input_error`` unless the last dimension of ``x`` is ``built``,
    the size the layer's weights were made for (unknown: no check)."""
    dim = static_shape(x.shape)[-1]
    if dim is not None and dim != built:
        raise input_error(
            layer,
            argument,
            f"last dimension {built} (as when the layer was built)",
            f"shape {static_shape(x.shape)}",
        )


class AttentionInputs(NamedTuple):
    """The validated, rank-3 inputs of one attention call."""

    query: object  # [B, Tq, Dq], padding zeroed
    value: object  # [B, Tv, Dv], padding zeroed
    key: object  # [B, Tv, Dk], padding zeroed
    mask: object  # bool [B, Tq, Tv] or None: every mask source merged
    value_mask: object  # [B, Tv] or None, as given
    single_step: bool  # the query was rank 2


@keras.saving.register_keras_serializable(package="attention_layers")
class ScoreAttention(keras.layers.Layer):
    """Base class of attention layers defined by a score function.

    Subclass it and implement ``build_score(query_shape, key_shape)`` (create
    weights) and ``score(query, key)`` (return ``[B, Tq, Tv]`` scores), and
    optionally ``check_score_shapes(query_shape, key_shape)``; these three are
    the subclass API (docs/contract.md has a complete example). The steps of
    ``call`` (``_prepare_inputs``, ``_attend``, ``_finish``) are internal. The call
    signature follows ``keras.layers.MultiHeadAttention``, so Keras fills
    ``query_mask`` and ``value_mask`` from an ``Embedding(mask_zero=True)``.

    Args:
        dropout: fraction of attention weights dropped during training.
        seed: seed of the dropout.
        **kwargs: standard ``keras.layers.Layer`` arguments (``name``, ``dtype``).

    Call arguments:
        query: ``[B, Tq, Dq]`` (all decoder steps) or ``[B, Dq]`` (one step).
        value: ``[B, Tv, Dv]``, the memory to attend over.
        key: ``[B, Tv, Dk]``, defaults to ``value``.
        query_mask: ``[B, Tq]`` (``[B]`` for a rank-2 query), True where the
            query position exists.
        value_mask: ``[B, Tv]``, True where the memory position may be attended.
        attention_mask: ``[B, Tq, Tv]`` (``[B, Tv]`` for a rank-2 query).
        return_attention_scores: also return the attention weights.
        training: whether dropout is active.
        use_causal_mask: query ``i`` attends only to positions ``j <= i``.

    Returns:
        ``context`` ``[B, Tq, Dv]`` (``[B, Dv]`` for a rank-2 query), and with
        ``return_attention_scores=True`` the tuple ``(context, weights)`` with
        ``weights`` ``[B, Tq, Tv]`` (``[B, Tv]``), which sum to 1 over unmasked
        positions and are 0 on a fully masked row.
    """

    def __init__(self, dropout=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.seed = seed
        self.supports_masking = True
        if not 0.0 <= float(dropout) < 1.0:
            raise self._error("dropout", "a float in [0, 1)", repr(dropout))

    # -- subclass hooks ---------------------------------------------------
    def build_score(self, query_shape, key_shape):
        """Create the score function's weights."""

    def score(self, query, key):
        """Return scores ``[B, Tq, Tv]`` for ``query`` ``[B, Tq, Dq]``, ``key``."""
        raise NotImplementedError

    def check_score_shapes(self, query_shape, key_shape):
        """Raise a ``ValueError`` if the score function cannot take these shapes."""

    def _check_equal_dims(self, query_shape, key_shape, why=""):
        """For dot-product scores: the key's last dimension must be the query's."""
        dq, dk = query_shape[-1], key_shape[-1]
        if None not in (dq, dk) and dq != dk:
            raise self._error(
                "key",
                f"last dimension equal to the query's ({dq}){why}",
                f"shape {tuple(key_shape)}",
            )

    # -- helpers for subclasses -------------------------------------------
    def _error(self, argument, expected, received):
        return input_error(self, argument, expected, received)

    def _score_dtype(self):
        return score_dtype(self.compute_dtype)

    # -- Keras plumbing -----------------------------------------------------
    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        query_shape = tuple(query_shape)
        if len(query_shape) == 2:
            query_shape = (query_shape[0], 1, query_shape[1])
        self.build_score(query_shape, tuple(key_shape))
        if self.dropout:
            self._dropout_layer = keras.layers.Dropout(
                self.dropout, seed=self.seed, dtype=self.dtype_policy
            )

    def _check_shapes(self, query_shape, value_shape, key_shape):
        query_shape, value_shape = static_shape(query_shape), static_shape(value_shape)
        key_shape = static_shape(key_shape)
        if len(query_shape) not in (2, 3):
            raise self._error(
                "query",
                "a rank-3 tensor [batch, query_length, dim] or a rank-2 tensor "
                "[batch, dim] (one decoder step)",
                f"shape {query_shape}",
            )
        if len(value_shape) != 3:
            raise self._error("value", _RANK3, f"shape {value_shape}")
        if len(key_shape) != 3:
            raise self._error("key", _RANK3, f"shape {key_shape}")
        batches = {s[0] for s in (query_shape, value_shape, key_shape)} - {None}
        if len(batches) > 1:
            raise self._error(
                "value",
                "the same batch size as query and key",
                f"batch sizes query={query_shape[0]}, value={value_shape[0]}, "
                f"key={key_shape[0]}",
            )
        if (
            None not in (key_shape[1], value_shape[1])
            and key_shape[1] != value_shape[1]
        ):
            raise self._error(
                "key",
                f"the same length as value ({value_shape[1]})",
                f"length {key_shape[1]} (shape {key_shape})",
            )
        q3 = (
            query_shape
            if len(query_shape) == 3
            else query_shape[:1] + (1,) + query_shape[1:]
        )
        self.check_score_shapes(q3, key_shape)

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
    ):
        inputs = self._prepare_inputs(
            query, value, key, query_mask, value_mask, attention_mask, use_causal_mask
        )
        context, weights = self._attend(inputs, training=training)
        return self._finish(inputs, context, weights, return_attention_scores)

    def _prepare_inputs(
        self,
        query,
        value,
        key,
        query_mask,
        value_mask,
        attention_mask=None,
        use_causal_mask=False,
    ):
        """Validate, lift a rank-2 query to one step, scrub padding, merge masks.

        Returns an ``AttentionInputs`` whose tensors are all rank 3 and whose
        ``mask`` is the merged boolean ``[B, Tq, Tv]`` mask (or ``None``).
        """
        if key is None:
            key = value
        self._check_shapes(query.shape, value.shape, key.shape)
        for name, x in (("query", query), ("value", value), ("key", key)):
            check_float(self, name, x)
        single_step = len(query.shape) == 2
        batch, tv = static_shape(value.shape)[:2]
        tq = None if single_step else static_shape(query.shape)[1]
        if single_step:
            if use_causal_mask:
                raise self._error(
                    "use_causal_mask",
                    "False for a rank-2 (single step) query, whose position is "
                    "unknown; pass a rank-3 query or an attention_mask",
                    "True",
                )
            check_mask_shape(self, "query_mask", query_mask, (batch,))
            check_mask_shape(self, "attention_mask", attention_mask, (batch, tv))
            query = ops.expand_dims(query, 1)
            if query_mask is not None:
                query_mask = ops.expand_dims(query_mask, 1)
            if attention_mask is not None:
                attention_mask = ops.expand_dims(attention_mask, 1)
        else:
            check_mask_shape(self, "query_mask", query_mask, (batch, tq))
            check_mask_shape(self, "attention_mask", attention_mask, (batch, tq, tv))
        check_mask_shape(self, "value_mask", value_mask, (batch, tv))

        # Scrub padding so that NaN/inf stored there cannot leak into outputs.
        query = masking.zero_masked(query, query_mask)
        key = masking.zero_masked(key, value_mask)
        value = masking.zero_masked(value, value_mask)
        mask = masking.merge_masks(
            query_mask,
            value_mask,
            attention_mask,
            use_causal_mask,
            query_length=ops.shape(query)[1],
            value_length=ops.shape(value)[1],
        )
        return AttentionInputs(query, value, key, mask, value_mask, single_step)

    def _attend(self, inputs, training=None, **score_arguments):
        """Return ``(context [B, Tq, Dv], weights [B, Tq, Tv])`` in the compute dtype.

        The default is the global soft attention of every score function
        (``score_arguments`` go to ``score``, e.g. a coverage); layers that
        attend differently (local windows, hard samples) override it.
        """
        weights = masking.masked_softmax(
            self.score(inputs.query, inputs.key, **score_arguments), inputs.mask
        )
        weights = ops.cast(weights, self.compute_dtype)
        return self._weighted_sum(weights, inputs.value, training), weights

    def _weighted_sum(self, weights, value, training=None):
        """``dropout(weights) @ value``."""
        if self.dropout:
            weights = self._dropout_layer(weights, training=training)
        return ops.matmul(weights, ops.cast(value, self.compute_dtype))

    def _finish(self, inputs, context, weights, return_attention_scores):
        """Drop the step axis of a rank-2 query and pick the outputs."""
        if inputs.single_step:
            context = ops.squeeze(context, 1)
            weights = ops.squeeze(weights, 1)
        if return_attention_scores:
            return context, weights
        return context

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout, "seed": self.seed}
