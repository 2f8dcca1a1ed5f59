"""`AttentionRNNCell`: one decoder step, its context recomputed from the new state."""

import keras
from keras import ops

from attention_layers.base import check_positive_int, input_error


def _state_sizes(cell):
    size = cell.state_size
    return list(size) if isinstance(size, (list, tuple)) else [size]


def _default_policy(layer):
    """Whether ``layer`` was made without a ``dtype``: Keras then gives it the
    global policy object itself, while ``dtype="float32"`` makes a new one."""
    return layer.dtype_policy is keras.config.dtype_policy()


@keras.saving.register_keras_serializable(package="attention_layers")
class AttentionRNNCell(keras.layers.Layer):
    """One step of an encoder-decoder with attention, around any Keras RNN cell.

    At step ``i``, with ``y_{i-1}`` the step input (the embedded previous
    token) and ``h`` the encoder states (the memory):

    ``z_i = cell([y_{i-1}; o_{i-1}], z_{i-1})`` (``o_{i-1}`` only with input
    feeding), ``c_i, a_i = attention(z_i, h)``, ``o_i = tanh(W_o [z_i; c_i])``
    (or ``[z_i; c_i]`` when ``output_units`` is None).

    The context ``c_i`` is recomputed at every step from the new state, so each
    output has its own context: the point of Bahdanau et al. against the fixed
    context vector. The memory is a call argument, never state set up ahead.

    **Coverage** (See et al. 2017): when the attention was made with
    ``use_coverage=True`` (`BahdanauAttention`), the cell carries the
    coverage ``cov_i = sum_{i' < i} a_{i'}`` (the attention each source
    position received at the previous steps) as the last state entry,
    ``[B, S]`` float32, passes it to the attention and returns ``cov_i + a_i``
    in the new states. Its size is the source length, so ``state_size``
    reports ``None`` for it and ``get_initial_state`` needs the memory.

    **Context gate** (Xu et al. 2015, section 4.2.1): with
    ``context_gate=True`` the context is scaled by a learned scalar
    ``beta_i = sigmoid(w_beta . z_i + b_beta)`` before the output,
    ``o_i = tanh(W_o [z_i; beta_i c_i])``, so the decoder can lean less on
    the attended input at steps that need it less (in captioning, words
    such as "a" or "of"). Xu et al. compute the gate from the state their
    attention reads, ``h_{t-1}``, as their attention runs before the
    recurrence; this cell's attention reads ``z_i``, and so does its gate.
    The returned weights ``a_i`` are the attention's, not scaled.

    Args:
        cell: a Keras RNN cell (``keras.layers.GRUCell``, ``LSTMCell``...).
        attention: an attention layer of this library (any layer taking
            ``(query, value, value_mask=..., return_attention_scores=True)``).
        output_units: size of the attentional output ``o_i``; ``None`` outputs
            the concatenation ``[z_i; c_i]``.
        input_feeding: feed ``o_{i-1}`` to the cell with the next input
            (Luong et al. 2015), so the cell knows what it attended to.
        context_gate: scale the context by ``beta_i`` (above).
        **kwargs: base layer arguments. A ``dtype`` policy given here is
            passed on to ``cell`` and ``attention`` unless they were given one
            of their own.

    Call arguments:
        inputs: ``[B, E]``, the step input.
        states: list of state tensors (``get_initial_state`` gives zeros):
            the cell's, then the input-feeding output, then the coverage.
        memory: ``[B, S, D]``, the encoder states.
        memory_mask: ``[B, S]``, True on real source positions.
        training: passed to the cell and the attention.

    Returns:
        ``(output [B, output_size], new_states, weights [B, S])``.

    Example:

    >>> import numpy as np, keras
    >>> from attention_layers import BahdanauAttention
    >>> cell = AttentionRNNCell(keras.layers.GRUCell(8),
    ...                         BahdanauAttention(units=4), output_units=6)
    >>> memory = np.random.rand(2, 5, 3).astype("float32")
    >>> cell.build((2, 7), None, memory.shape)
    >>> states = cell.get_initial_state(batch_size=2)
    >>> out, states, weights = cell(np.ones((2, 7), "float32"), states, memory)
    >>> tuple(out.shape), tuple(weights.shape)
    ((2, 6), (2, 5))

    References:
        Bahdanau, Cho, Bengio. Neural Machine Translation by Jointly Learning to
        Align and Translate. ICLR 2015. Luong, Pham, Manning. Effective
        Approaches to Attention-based Neural Machine Translation. EMNLP 2015.
        Xu, Ba, Kiros, Cho, Courville, Salakhutdinov, Zemel, Bengio. Show,
        Attend and Tell: Neural Image Caption Generation with Visual
        Attention. ICML 2015. https://arxiv.org/abs/1502.03044
    """

    def __init__(
        self,
        cell,
        attention,
        output_units=None,
        input_feeding=True,
        context_gate=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(cell, dict):
            cell = keras.saving.deserialize_keras_object(cell)
        if isinstance(attention, dict):
            attention = keras.saving.deserialize_keras_object(attention)
        if not hasattr(cell, "state_size"):
            raise input_error(
                self, "cell", "a Keras RNN cell with a `state_size`", repr(cell)
            )
        if not isinstance(attention, keras.layers.Layer):
            raise input_error(
                self,
                "attention",
                "an attention layer instance, e.g. BahdanauAttention(units=64)",
                repr(attention),
            )
        output_units = check_positive_int(
            self, "output_units", output_units, allow_none=True
        )
        self.cell = cell
        self.attention = attention
        self.output_units = output_units
        self.input_feeding = input_feeding
        if not isinstance(context_gate, bool):
            raise input_error(self, "context_gate", "True or False", repr(context_gate))
        self.context_gate = context_gate
        self._value_dim = None
        if kwargs.get("dtype") is not None:
            self._share_dtype_policy()
        # A step input may carry the padding mask of an Embedding(mask_zero=True);
        # it has no time axis here, so the cell accepts it and returns none.
        self.supports_masking = True

    def _share_dtype_policy(self):
        """Give the wrapped cell and attention this cell's dtype policy.

        A layer made without ``dtype`` takes the global policy; so one passed
        to ``AttentionRNNCell(..., dtype=policy)`` gets ``policy`` too. A layer
        whose policy was set to something else on purpose keeps it, and so
        does a built one (its weights exist).
        """
        for layer in (self.cell, self.attention):
            if not layer.built and _default_policy(layer):
                layer.dtype_policy = self.dtype_policy

    @property
    def use_coverage(self):
        """Whether the attention has a coverage term (a coverage state)."""
        return bool(getattr(self.attention, "use_coverage", False))

    @property
    def units(self):
        return _state_sizes(self.cell)[0]

    def _output_size(self, value_dim):
        return self.output_units or self.units + value_dim

    @property
    def state_size(self):
        sizes = _state_sizes(self.cell)
        if self.input_feeding:
            if self._value_dim is None and self.output_units is None:
                raise ValueError(
                    f"{self.__class__.__name__} (name={self.name!r}): build the "
                    "cell before asking for its state size (it depends on the "
                    "memory size when output_units is None)."
                )
            sizes.append(self._output_size(self._value_dim or 0))
        if self.use_coverage:
            sizes.append(None)  # the source length
        return sizes

    @property
    def output_size(self):
        return self._output_size(self._value_dim or 0)

    def build(self, inputs_shape, states_shape=None, memory_shape=None):
        if memory_shape is None or len(memory_shape) != 3:
            raise input_error(
                self,
                "memory",
                "a rank-3 tensor [batch, source_length, dim]",
                f"shape {memory_shape}",
            )
        self._value_dim = memory_shape[-1]
        feed = self._output_size(self._value_dim) if self.input_feeding else 0
        batch = inputs_shape[0]
        # Sublayers restored from a .keras file arrive built.
        if not self.cell.built:
            self.cell.build((batch, inputs_shape[-1] + feed))
        if not self.attention.built:
            self.attention.build((batch, self.units), tuple(memory_shape))
        if self.output_units:
            self.output_dense = keras.layers.Dense(
                self.output_units,
                activation="tanh",
                use_bias=False,
                dtype=self.dtype_policy,
                name="W_o",
            )
            self.output_dense.build((batch, self.units + self._value_dim))
        if self.context_gate:
            self.gate_dense = keras.layers.Dense(
                1, activation="sigmoid", dtype=self.dtype_policy, name="f_beta"
            )
            self.gate_dense.build((batch, self.units))

    def compute_mask(self, inputs, previous_mask=None):
        return None

    def get_initial_state(self, batch_size, memory=None):
        """Zero states for ``batch_size`` rows.

        Args:
            batch_size: an int or a scalar tensor.
            memory: the encoder states ``[B, S, D]``, or the source length
                ``S`` (an int or a scalar tensor); needed only when the
                attention has coverage, whose state is ``[B, S]``.

        Returns:
            A list of states, the coverage (float32) last.
        """
        sizes = self.state_size
        if self.use_coverage:
            sizes = sizes[:-1]
        states = [
            ops.zeros((batch_size, size), dtype=self.compute_dtype) for size in sizes
        ]
        if self.use_coverage:
            states.append(
                ops.zeros((batch_size, self._source_length(memory)), "float32")
            )
        return states

    def _source_length(self, memory):
        if memory is None:
            raise input_error(
                self,
                "memory",
                "the encoder states [batch, source_length, dim] or the source "
                "length, to size the coverage state of an attention with "
                "use_coverage=True",
                "None",
            )
        shape = getattr(memory, "shape", ())
        if len(shape) == 3:
            return ops.shape(memory)[1]
        if len(shape) == 0:
            return memory
        raise input_error(
            self,
            "memory",
            "a rank-3 tensor [batch, source_length, dim] or a source length",
            f"shape {tuple(shape)}",
        )

    def call(self, inputs, states, memory, memory_mask=None, training=None):
        states = list(states)
        n_cell = len(_state_sizes(self.cell))
        if self.input_feeding:
            feed = ops.cast(states[n_cell], inputs.dtype)
            x = ops.concatenate([inputs, feed], axis=-1)
        else:
            # A mask attached to one step's input (an Embedding with
            # mask_zero) means nothing to the cell; Keras would warn that the
            # cell drops it. A copy carries no mask.
            x = ops.copy(inputs)
        cell_states = states[:n_cell]
        z, new_cell_states = self.cell(x, cell_states, training=training)
        new_cell_states = (
            list(new_cell_states)
            if isinstance(new_cell_states, (list, tuple))
            else [new_cell_states]
        )
        extra = {}
        if self.use_coverage:
            coverage = ops.cast(states[-1], "float32")
            extra["coverage"] = coverage
        context, weights = self.attention(
            z,
            memory,
            value_mask=memory_mask,
            return_attention_scores=True,
            training=training,
            **extra,
        )
        output = self.attentional_output(z, context)
        new_states = new_cell_states + ([output] if self.input_feeding else [])
        if self.use_coverage:
            new_states.append(coverage + ops.cast(weights, "float32"))
        return output, new_states, weights

    def attentional_output(self, z, context):
        """``o = tanh(W_o [z; beta c])`` (``beta`` 1 without the context
        gate; no ``W_o`` without ``output_units``), for a step ``[B, ...]``
        or all steps ``[B, T, ...]`` at once."""
        context = ops.cast(context, z.dtype)
        if self.context_gate:
            context = self.gate_dense(z) * context
        output = ops.concatenate([z, context], axis=-1)
        if self.output_units:
            output = self.output_dense(output)
        return output

    def get_config(self):
        return {
            **super().get_config(),
            "cell": keras.saving.serialize_keras_object(self.cell),
            "attention": keras.saving.serialize_keras_object(self.attention),
            "output_units": self.output_units,
            "input_feeding": self.input_feeding,
            "context_gate": self.context_gate,
        }
