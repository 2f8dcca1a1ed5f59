"""Position information for attention: sinusoidal, learned and rotary.

Attention is blind to order; these layers give it positions. Each sequence
layer takes the position of its first time step (``start_index``) or
explicit ``positions``, so that a decoder fed one token at a time from a
cache gets the same encodings as one call over the whole sequence.
`SinusoidalPositionEncoding2D` gives the cells of a 2-D feature grid (a CNN's
output) their row and column.
"""

import keras
from keras import ops

from attention_layers.base import (
    check_float,
    check_positive_int,
    concrete_value,
    input_error,
    static_shape,
)


def _check_inputs(layer, inputs, ranks):
    shape = static_shape(inputs.shape)
    if len(shape) not in ranks:
        names = {
            3: "a rank-3 tensor [batch, length, dim]",
            4: "a rank-4 tensor [batch, length, heads, head_dim]",
        }
        expected = " or ".join(names[r] for r in ranks)
        raise input_error(layer, "inputs", expected, f"shape {shape}")
    check_float(layer, "inputs", inputs)
    return shape


def _positions(layer, inputs, start_index, positions):
    """Float32 positions ``[1, T]`` or ``[B, T]`` of the time steps of ``inputs``.

    ``positions`` (``[T]`` or ``[B, T]``) wins over ``start_index``; without
    it the positions are ``start_index + arange(T)``.
    """
    length = ops.shape(inputs)[1]
    if positions is None:
        if isinstance(start_index, bool) or (
            isinstance(start_index, int) and start_index < 0
        ):
            raise input_error(
                layer,
                "start_index",
                "a non-negative int or scalar tensor",
                repr(start_index),
            )
        if not isinstance(start_index, int):
            start_index = ops.convert_to_tensor(start_index)
            if len(start_index.shape) != 0:
                raise input_error(
                    layer,
                    "start_index",
                    "a non-negative int or scalar tensor",
                    f"shape {tuple(start_index.shape)}",
                )
            start_index = ops.cast(start_index, "float32")
        steps = ops.arange(length, dtype="float32") + start_index
        return ops.expand_dims(steps, 0)
    if not hasattr(positions, "shape"):
        positions = ops.convert_to_tensor(positions)
    shape = static_shape(positions.shape)
    batch, t = static_shape(inputs.shape)[:2]

    def fits(given, wanted):
        return given is None or wanted is None or given == wanted

    if len(shape) == 1:
        ok = fits(shape[0], t)
    else:
        ok = len(shape) == 2 and fits(shape[0], batch) and fits(shape[1], t)
    if not ok:
        raise input_error(
            layer,
            "positions",
            f"shape [length] or [batch, length], with batch={batch}, length={t}",
            f"shape {shape}",
        )
    positions = ops.cast(positions, "float32")
    if len(shape) == 1:
        positions = ops.expand_dims(positions, 0)
    return positions


def _sinusoid(positions, dim, max_wavelength):
    """``[..., dim]`` float32: sine and cosine of ``positions`` interleaved."""
    features = ops.arange(dim, dtype="float32")
    pair = ops.floor(features / 2.0) * 2.0  # 2i for features 2i and 2i+1
    inverse_freq = ops.power(float(max_wavelength), -pair / float(dim))
    angles = ops.expand_dims(positions, -1) * inverse_freq
    even = ops.equal(ops.mod(ops.arange(dim), 2), 0)
    return ops.where(even, ops.sin(angles), ops.cos(angles))


def _check_wavelength(layer, max_wavelength):
    try:
        ok = not isinstance(max_wavelength, bool) and float(max_wavelength) > 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise input_error(layer, "max_wavelength", "a number > 1", repr(max_wavelength))
    return max_wavelength


@keras.saving.register_keras_serializable(package="attention_layers")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """The fixed sinusoidal position encoding of Vaswani et al. (2017).

    ``PE(pos, 2i) = sin(pos / w^(2i/d))`` and ``PE(pos, 2i+1) =
    cos(pos / w^(2i/d))`` with ``w = max_wavelength`` and ``d`` the feature
    dimension of ``inputs``: sine and cosine interleaved, as in the paper. The
    layer has no weights and returns the encoding only; add it to the inputs
    yourself (``x + layer(x)``), which keeps the Keras mask of ``x``.

    Args:
        max_wavelength: the base ``w`` of the wavelengths, which run from
            ``2 pi`` to about ``2 pi w`` (10000 in the paper).
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        inputs: ``[B, T, d]``; only its shape and dtype are used.
        start_index: position of the first time step (int or scalar tensor),
            e.g. the cache index when decoding one token at a time.
        positions: explicit positions ``[T]`` or ``[B, T]`` (ints or floats),
            which override ``start_index``.

    Returns:
        The encoding ``[B, T, d]`` in the compute dtype (computed in float32).

    Example:

    >>> import numpy as np
    >>> x = np.zeros((2, 5, 4), "float32")
    >>> pe = np.asarray(SinusoidalPositionEncoding()(x))
    >>> pe.shape, pe[0, 0].tolist()
    ((2, 5, 4), [0.0, 1.0, 0.0, 1.0])
    >>> step = SinusoidalPositionEncoding()(x[:, :1], start_index=3)
    >>> np.allclose(np.asarray(step)[:, 0], pe[:, 3])
    True

    References:
        Vaswani et al. Attention Is All You Need. NeurIPS 2017.
        https://arxiv.org/abs/1706.03762
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = _check_wavelength(self, max_wavelength)
        self.supports_masking = True

    def call(self, inputs, start_index=0, positions=None):
        dim = _check_inputs(self, inputs, (3,))[-1]
        if dim is None:
            raise input_error(
                self, "inputs", "a known last dimension", f"shape {inputs.shape}"
            )
        positions = _positions(self, inputs, start_index, positions)  # [1|B, T]
        encoding = _sinusoid(positions, dim, self.max_wavelength)  # [1|B, T, d]
        shape = ops.shape(inputs)
        encoding = ops.broadcast_to(encoding, (shape[0], shape[1], dim))
        return ops.cast(encoding, self.compute_dtype)

    def compute_output_shape(self, inputs_shape, **kwargs):
        return tuple(inputs_shape)

    def get_config(self):
        return {**super().get_config(), "max_wavelength": self.max_wavelength}


@keras.saving.register_keras_serializable(package="attention_layers")
class SinusoidalPositionEncoding2D(keras.layers.Layer):
    """Sinusoidal positions of the cells of a 2-D grid: row and column.

    For a feature grid ``[B, H, W, d]`` (a CNN's output, before it is
    flattened into ``H * W`` memories for an attention), the first ``d / 2``
    features encode the row ``r`` and the last ``d / 2`` the column ``c``,
    each with the 1-D encoding of `SinusoidalPositionEncoding` at dimension
    ``d / 2``: ``PE(r, c) = [PE_{d/2}(r); PE_{d/2}(c)]``, as in the Image
    Transformer (Parmar et al. 2018). An attention over the flattened grid
    then knows where each memory lies, which convolutions with padding
    only hint at. The layer has no weights and returns the encoding only;
    add it to the grid yourself (``x + layer(x)``).

    Args:
        max_wavelength: the base ``w`` of the wavelengths (10000 in the
            Transformer; a grid of a few dozen rows needs far less).
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        inputs: ``[B, H, W, d]`` with ``d`` even; only its shape and dtype
            are used.

    Returns:
        The encoding ``[B, H, W, d]`` in the compute dtype (computed in
        float32).

    Example:

    >>> import numpy as np
    >>> grid = np.zeros((2, 3, 5, 8), "float32")
    >>> pe = np.asarray(SinusoidalPositionEncoding2D()(grid))
    >>> pe.shape
    (2, 3, 5, 8)
    >>> rows = np.asarray(SinusoidalPositionEncoding()(np.zeros((1, 3, 4))))
    >>> bool(np.allclose(pe[0, :, 2, :4], rows[0]))  # the row half, any column
    True

    References:
        Parmar, Vaswani, Uszkoreit, Kaiser, Shazeer, Ku, Tran. Image
        Transformer. ICML 2018, section 3.2. https://arxiv.org/abs/1802.05751
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = _check_wavelength(self, max_wavelength)

    def call(self, inputs):
        shape = static_shape(inputs.shape)
        if len(shape) != 4 or shape[-1] is None or shape[-1] % 2:
            raise input_error(
                self,
                "inputs",
                "a rank-4 tensor [batch, height, width, dim] with a known, even dim",
                f"shape {shape}",
            )
        check_float(self, "inputs", inputs)
        half = shape[-1] // 2
        batch, height, width = (ops.shape(inputs)[i] for i in range(3))
        rows = _sinusoid(ops.arange(height, dtype="float32"), half, self.max_wavelength)
        cols = _sinusoid(ops.arange(width, dtype="float32"), half, self.max_wavelength)
        grid = ops.concatenate(
            [
                ops.broadcast_to(rows[:, None, :], (height, width, half)),
                ops.broadcast_to(cols[None, :, :], (height, width, half)),
            ],
            axis=-1,
        )
        encoding = ops.broadcast_to(grid, (batch, height, width, 2 * half))
        return ops.cast(encoding, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        return {**super().get_config(), "max_wavelength": self.max_wavelength}


@keras.saving.register_keras_serializable(package="attention_layers")
class PositionEmbedding(keras.layers.Layer):
    """A learned position embedding: one trained vector per position.

    The table ``[sequence_length, d]`` is indexed by the position of every
    time step. Like `SinusoidalPositionEncoding`, the layer returns the
    embedding only; add it to the inputs (``x + layer(x)``).

    Args:
        sequence_length: the number of positions the table holds; positions
            must lie in ``[0, sequence_length)``. A call whose positions are
            statically known to exceed it raises a ``ValueError``; positions
            only known at run time are not checked (out-of-range lookups fail
            or clamp, depending on the backend and device).
        initializer: initializer of the table.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        inputs: ``[B, T, d]``; only its shape and dtype are used.
        start_index: position of the first time step (int or scalar tensor).
        positions: explicit integer positions ``[T]`` or ``[B, T]``, which
            override ``start_index``.

    Returns:
        The embedding ``[B, T, d]`` in the compute dtype.

    Example:

    >>> import numpy as np
    >>> x = np.zeros((2, 3, 4), "float32")
    >>> layer = PositionEmbedding(sequence_length=8)
    >>> tuple(layer(x).shape), tuple(layer.embeddings.shape)
    ((2, 3, 4), (8, 4))

    References:
        Gehring et al. Convolutional Sequence to Sequence Learning. ICML 2017.
        https://arxiv.org/abs/1705.03122
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = check_positive_int(
            self, "sequence_length", sequence_length
        )
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        dim = inputs_shape[-1]
        if dim is None:
            raise input_error(
                self, "inputs", "a known last dimension", f"shape {inputs_shape}"
            )
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, dim),
            initializer=self.initializer,
        )

    def _check_static_range(self, inputs, start_index, positions):
        length = static_shape(inputs.shape)[1]
        last = None
        if positions is None:
            start = concrete_value(start_index)
            if start is not None and start.ndim == 0 and length is not None:
                last, argument = int(start) + length - 1, "start_index"
        else:
            positions = concrete_value(positions)
            if positions is not None and positions.size:
                last, argument = int(positions.max()), "positions"
        if last is not None and last >= self.sequence_length:
            raise input_error(
                self,
                argument,
                f"positions below sequence_length={self.sequence_length}",
                f"a last position of {last}",
            )

    def call(self, inputs, start_index=0, positions=None):
        _check_inputs(self, inputs, (3,))
        self._check_static_range(inputs, start_index, positions)
        positions = ops.cast(_positions(self, inputs, start_index, positions), "int32")
        table = ops.cast(self.embeddings, self.compute_dtype)
        embedding = ops.take(table, positions, axis=0)  # [1|B, T, d]
        shape = ops.shape(inputs)
        return ops.broadcast_to(embedding, (shape[0], shape[1], inputs.shape[-1]))

    def compute_output_shape(self, inputs_shape, **kwargs):
        # Explicit, so that no backend infers it by running `call` on made-up
        # lengths (PyTorch's stand-in length would fail the range check).
        return tuple(inputs_shape)

    def get_config(self):
        return {
            **super().get_config(),
            "sequence_length": self.sequence_length,
            "initializer": keras.initializers.serialize(self.initializer),
        }


@keras.saving.register_keras_serializable(package="attention_layers")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoPE) of Su et al. (2021, RoFormer).

    Each pair of features ``(x_a, x_b)`` at position ``m`` is rotated by the
    angle ``m * theta_i``, ``theta_i = w^(-2i/d)`` (``w = max_wavelength``,
    ``d`` the last dimension):

    ``(x_a, x_b) -> (x_a cos(m theta_i) - x_b sin(m theta_i),
    x_b cos(m theta_i) + x_a sin(m theta_i))``,

    so the dot product of a rotated query at ``m`` and a rotated key at ``n``
    depends on ``m - n`` only. Apply it to queries and keys (not values)
    before the dot product. Positions are divided by ``scaling_factor``
    (linear position interpolation, to stretch a trained context).

    Args:
        max_wavelength: the base ``w`` of the frequencies (10000 in the paper).
        scaling_factor: positions are divided by it (>= 1 stretches them).
        interleaved: pair features ``(2i, 2i+1)`` as in the paper (True), or
            ``(i, i + d/2)``, the "rotate half" layout of GPT-NeoX and LLaMA
            checkpoints (False).
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        inputs: ``[B, T, D]`` or ``[B, T, H, Dh]`` (per head); the last
            dimension must be even.
        start_index: position of the first time step (int or scalar tensor).
        positions: explicit positions ``[T]`` or ``[B, T]``, which override
            ``start_index``.

    Returns:
        The rotated inputs, same shape, in the compute dtype (rotated in
        float32). The Keras mask of ``inputs`` passes through.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(2, 6, 2, 8).astype("float32")  # [B, T, H, Dh]
    >>> rope = RotaryEmbedding()
    >>> full = np.asarray(rope(q))
    >>> step = np.asarray(rope(q[:, 4:5], start_index=4))
    >>> full.shape, bool(np.allclose(step, full[:, 4:5], atol=1e-5))
    ((2, 6, 2, 8), True)

    References:
        Su et al. RoFormer: Enhanced Transformer with Rotary Position
        Embedding. 2021. https://arxiv.org/abs/2104.09864
    """

    def __init__(
        self, max_wavelength=10000, scaling_factor=1.0, interleaved=True, **kwargs
    ):
        super().__init__(**kwargs)
        if not float(max_wavelength) > 1:
            raise input_error(
                self, "max_wavelength", "a number > 1", repr(max_wavelength)
            )
        if not float(scaling_factor) > 0:
            raise input_error(
                self, "scaling_factor", "a positive number", repr(scaling_factor)
            )
        self.max_wavelength = max_wavelength
        self.scaling_factor = scaling_factor
        self.interleaved = bool(interleaved)
        self.supports_masking = True

    def call(self, inputs, start_index=0, positions=None):
        shape = _check_inputs(self, inputs, (3, 4))
        dim = shape[-1]
        if dim is None or dim % 2:
            raise input_error(
                self, "inputs", "an even, known last dimension", f"shape {shape}"
            )
        half = dim // 2
        positions = _positions(self, inputs, start_index, positions)  # [1|B, T]
        positions = positions / float(self.scaling_factor)
        inverse_freq = ops.power(
            float(self.max_wavelength),
            -ops.arange(half, dtype="float32") * 2.0 / float(dim),
        )
        angles = ops.expand_dims(positions, -1) * inverse_freq  # [1|B, T, d/2]
        if len(shape) == 4:
            angles = ops.expand_dims(angles, 2)  # [1|B, T, 1, d/2]
        cos, sin = ops.cos(angles), ops.sin(angles)
        x = ops.cast(inputs, "float32")
        if self.interleaved:
            pairs = ops.reshape(x, tuple(ops.shape(x)[:-1]) + (half, 2))
            a, b = pairs[..., 0], pairs[..., 1]
            rotated = ops.stack([a * cos - b * sin, b * cos + a * sin], axis=-1)
            rotated = ops.reshape(rotated, ops.shape(x))
        else:
            a, b = x[..., :half], x[..., half:]
            rotated = ops.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
        return ops.cast(rotated, self.compute_dtype)

    def compute_output_shape(self, inputs_shape, **kwargs):
        return tuple(inputs_shape)

    def get_config(self):
        return {
            **super().get_config(),
            "max_wavelength": self.max_wavelength,
            "scaling_factor": self.scaling_factor,
            "interleaved": self.interleaved,
        }
