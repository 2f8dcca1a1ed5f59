"""`AttentionDecoder`: an `AttentionRNNCell` run over a target sequence."""

import inspect

import keras
from keras import ops

from attention_layers import masking
from attention_layers.attention_rnn_cell import (
    AttentionRNNCell,
    _default_policy,
    _state_sizes,
)
from attention_layers.base import (
    check_float,
    check_mask_shape,
    input_error,
    static_shape,
)


@keras.saving.register_keras_serializable(package="attention_layers")
class AttentionDecoder(keras.layers.Layer):
    """Runs an `AttentionRNNCell` over a target sequence (teacher forcing).

    The call signature is that of the other attention layers, with the target
    sequence as the query and the encoder states as the value, so Keras fills
    ``query_mask`` (target padding) and ``value_mask`` (source padding) from
    ``Embedding(mask_zero=True)`` layers by itself.

    Args:
        cell: an `AttentionRNNCell`.
        learn_initial_state: learn the initial cell state instead of zeros
            (used when no ``initial_state`` is passed).
        **kwargs: base layer arguments. A ``dtype`` policy given here is
            passed on to the cell, its RNN cell and its attention, unless
            they were given one of their own.

    Call arguments:
        query: ``[B, T, E]``, the embedded target inputs (shifted right).
        value: ``[B, S, D]``, the encoder states.
        query_mask: ``[B, T]``; a masked step keeps the previous state and
            outputs zeros.
        value_mask: ``[B, S]``, True on real source positions.
        initial_state: list of the cell's initial states (e.g. the encoder's
            final state); the input-feeding state and the coverage start at
            zero.
        return_attention_scores: also return the alignments ``[B, T, S]``.
        return_state: also return the final states (a list; with a coverage
            attention the last is the coverage ``[B, S]``, the attention
            summed over the unmasked steps).
        training: passed to the cell.
        return_log_prob: with a `HardAttention` cell and no input feeding,
            also return ``log_prob`` and ``entropy`` ``[B, T]`` (float32,
            zero on masked steps) for a `ReinforceLoss`. The recurrence does
            not read the attention then, so the attention runs once over all
            the steps and samples each one's position in training.

    Returns:
        ``outputs [B, T, output_size]``, then the alignments, the final
        states, and ``log_prob, entropy`` if asked for, in that order.

    Example:

    >>> import numpy as np, keras
    >>> from attention_layers import LuongAttention
    >>> decoder = AttentionDecoder(AttentionRNNCell(
    ...     keras.layers.GRUCell(8), LuongAttention("general"), output_units=8))
    >>> target = np.random.rand(2, 4, 5).astype("float32")
    >>> memory = np.random.rand(2, 6, 8).astype("float32")
    >>> outputs, alignments = decoder(target, memory, return_attention_scores=True)
    >>> tuple(outputs.shape), tuple(alignments.shape)
    ((2, 4, 8), (2, 4, 6))
    """

    def __init__(self, cell, learn_initial_state=False, **kwargs):
        super().__init__(**kwargs)
        if isinstance(cell, dict):
            cell = keras.saving.deserialize_keras_object(cell)
        if not isinstance(cell, AttentionRNNCell):
            raise input_error(self, "cell", "an AttentionRNNCell", repr(cell))
        if kwargs.get("dtype") is not None and not cell.built:
            # As AttentionRNNCell does for its cell and attention.
            if _default_policy(cell):
                cell.dtype_policy = self.dtype_policy
            cell._share_dtype_policy()
        self.cell = cell
        self.learn_initial_state = learn_initial_state
        self.supports_masking = True

    def _check(self, query_shape, value_shape):
        if len(query_shape) != 3:
            raise input_error(
                self,
                "query",
                "a rank-3 tensor [batch, target_length, dim]",
                f"shape {tuple(query_shape)}",
            )
        if len(value_shape) != 3:
            raise input_error(
                self,
                "value",
                "a rank-3 tensor [batch, source_length, dim]",
                f"shape {tuple(value_shape)}",
            )
        qb, vb = static_shape(query_shape)[0], static_shape(value_shape)[0]
        if None not in (qb, vb) and qb != vb:
            raise input_error(
                self, "value", f"batch size {qb} (the query's)", f"batch size {vb}"
            )

    def build(self, query_shape, value_shape):
        self._check(query_shape, value_shape)
        step_shape = (query_shape[0], query_shape[-1])
        if not self.cell.built:  # a restored cell arrives built
            self.cell.build(step_shape, None, tuple(value_shape))
        if self.learn_initial_state:
            self.initial_cell_states = [
                self.add_weight(
                    name=f"initial_state_{i}", shape=(size,), initializer="zeros"
                )
                for i, size in enumerate(_state_sizes(self.cell.cell))
            ]

    def initial_states(self, batch_size, initial_state=None, memory=None):
        """The cell's states at step 0, input-feeding state included.

        ``memory`` (the encoder states, or the source length) is needed when
        the attention has coverage: it sizes the coverage state, zeros
        ``[batch_size, S]``.
        """
        states = self.cell.get_initial_state(batch_size, memory=memory)
        n_cell = len(_state_sizes(self.cell.cell))
        if initial_state is not None:
            given = (
                list(initial_state)
                if isinstance(initial_state, (list, tuple))
                else [initial_state]
            )
            if len(given) != n_cell:
                raise input_error(
                    self,
                    "initial_state",
                    f"a list of {n_cell} cell state(s)",
                    f"{len(given)} tensor(s)",
                )
            states[:n_cell] = [ops.cast(s, self.compute_dtype) for s in given]
        elif self.learn_initial_state:
            states[:n_cell] = [
                ops.broadcast_to(
                    ops.cast(w, self.compute_dtype), (batch_size, w.shape[0])
                )
                for w in self.initial_cell_states
            ]
        return states

    def call(
        self,
        query,
        value,
        query_mask=None,
        value_mask=None,
        initial_state=None,
        return_attention_scores=False,
        return_state=False,
        training=None,
        return_log_prob=False,
    ):
        self._check_call(query, value, query_mask, value_mask, return_log_prob)
        batch = ops.shape(query)[0]
        states = self.initial_states(batch, initial_state, memory=value)
        steps, keep = self._time_major(query, query_mask)
        # Without input feeding the attention does not feed back into the
        # recurrence, so only the wrapped cell runs step by step and the
        # attention runs once over all the steps afterwards (same numbers,
        # and the keys are projected once instead of once per step). A
        # coverage attention depends on the previous steps' weights: it
        # always runs step by step.
        feeding = self.cell.input_feeding or self.cell.use_coverage

        def step(x, states):
            if feeding:
                return self.cell(
                    x, states, value, memory_mask=value_mask, training=training
                )
            out, new_states = self.cell.cell(x, list(states), training=training)
            if not isinstance(new_states, (list, tuple)):
                new_states = [new_states]
            return out, new_states, None

        width = self.cell.output_size if feeding else self.cell.units
        source = ops.shape(value)[1] if feeding else None
        final, outputs, alignments = self._run_steps(
            step, steps, keep, states, width, source, static_shape(query.shape)[1]
        )
        sampled = ()
        if not feeding:
            outputs, alignments, sampled = self._attend_all(
                outputs, keep, value, value_mask, training, return_log_prob
            )
        outputs = ops.transpose(outputs, (1, 0, 2))
        results = [outputs]
        if return_attention_scores:
            results.append(ops.transpose(alignments, (1, 0, 2)))
        if return_state:
            results.append(list(final))
        results.extend(sampled)
        return results[0] if len(results) == 1 else tuple(results)

    def _check_call(self, query, value, query_mask, value_mask, return_log_prob):
        """Refuse inputs whose ranks, dtypes or mask shapes do not fit."""
        self._check(query.shape, value.shape)
        self._check_log_prob(return_log_prob)
        check_float(self, "query", query)
        check_float(self, "value", value)
        batch, length = static_shape(query.shape)[:2]
        check_mask_shape(self, "query_mask", query_mask, (batch, length))
        check_mask_shape(self, "value_mask", value_mask, static_shape(value.shape)[:2])

    def _time_major(self, query, query_mask):
        """The step inputs ``[T, B, E]`` (zero where masked) and which steps
        are real, ``[T, B]`` bool."""
        query = masking.zero_masked(query, query_mask)
        steps = ops.transpose(query, (1, 0, 2))
        if query_mask is None:
            keep = ops.ones(ops.shape(steps)[:2], dtype="bool")
        else:
            keep = ops.transpose(masking.as_bool(query_mask), (1, 0))
        return steps, keep

    def _run_steps(self, step, steps, keep, states, width, source, max_length):
        """Runs ``step(x, states) -> (out, new_states, weights or None)`` over
        the time-major ``steps``; returns the final states and the time-major
        outputs ``[T, B, width]`` and alignments ``[T, B, source]`` (a
        placeholder when ``source`` is None: the step returns no weights).

        A masked step keeps the previous states and writes zeros.
        """
        # A while loop with a known trip count, writing each step into
        # fixed-size buffers with a one-hot `where`: XLA-compilable and
        # differentiable on every backend (Keras' TensorFlow scan sets no
        # maximum_iterations, which XLA needs for the gradient), and made of
        # stock ops that TF Serving runs.
        length, batch = ops.shape(steps)[0], ops.shape(steps)[1]
        outputs = ops.zeros((length, batch, width), self.compute_dtype)
        if source is not None:
            alignments = ops.zeros((length, batch, source), self.compute_dtype)
        else:
            alignments = ops.zeros((1,), self.compute_dtype)  # unused
        time = ops.arange(length, dtype="int32")

        def body(i, states, outputs, alignments):
            m = ops.expand_dims(ops.take(keep, i, axis=0), -1)
            out, new_states, weights = step(ops.take(steps, i, axis=0), states)
            new_states = [
                ops.where(m, n, o) for n, o in zip(new_states, states, strict=True)
            ]
            write = ops.logical_and(ops.reshape(ops.equal(time, i), (-1, 1, 1)), m)
            outputs = ops.where(
                write, ops.expand_dims(ops.cast(out, outputs.dtype), 0), outputs
            )
            if weights is not None:
                weights = ops.cast(weights, alignments.dtype)
                alignments = ops.where(write, ops.expand_dims(weights, 0), alignments)
            return i + 1, new_states, outputs, alignments

        init = (states, outputs, alignments)
        if keras.backend.backend() == "jax":
            # JAX differentiates a loop only with static bounds (it is then a
            # scan); under jit every length is static.
            return ops.fori_loop(0, length, lambda i, c: body(i, *c)[1:], init)
        # TensorFlow: a bounded while loop (XLA needs the bound for the
        # gradient; the bound is the static length when there is one).
        _, final, outputs, alignments = ops.while_loop(
            lambda i, *_: i < length,
            body,
            (ops.convert_to_tensor(0, "int32"), *init),
            maximum_iterations=max_length,
        )
        return final, outputs, alignments

    def _check_log_prob(self, return_log_prob):
        if not return_log_prob:
            return
        from attention_layers.hard import HardAttention

        if not isinstance(self.cell.attention, HardAttention):
            raise input_error(
                self,
                "return_log_prob",
                "a cell whose attention is a HardAttention",
                type(self.cell.attention).__name__,
            )
        if self.cell.input_feeding:
            raise input_error(
                self,
                "return_log_prob",
                "a cell with input_feeding=False (the log-probabilities are "
                "taken when the attention runs once over all the steps)",
                "input_feeding=True",
            )

    def _attend_all(self, states, keep, value, value_mask, training, log_prob=False):
        """Attention over every decoder state at once (no input feeding).

        ``states`` and ``keep`` are time major; returns time-major outputs
        and alignments, zero on masked steps like the step-by-step path, and
        ``(log_prob, entropy)`` batch major if asked for (else ``()``).
        """
        cell = self.cell
        z = ops.transpose(states, (1, 0, 2))  # [B, T, units]
        query_mask = ops.transpose(keep, (1, 0))
        extra = {"return_log_prob": True} if log_prob else {}
        context, weights, *sampled = cell.attention(
            z,
            value,
            query_mask=query_mask,
            value_mask=value_mask,
            return_attention_scores=True,
            training=training,
            **extra,
        )
        out = cell.attentional_output(z, context)
        m = ops.expand_dims(query_mask, -1)
        out = ops.where(m, out, 0.0)
        weights = ops.where(m, ops.cast(weights, self.compute_dtype), 0.0)
        sampled = tuple(ops.where(query_mask, s, 0.0) for s in sampled)
        return (
            ops.transpose(out, (1, 0, 2)),
            ops.transpose(weights, (1, 0, 2)),
            sampled,
        )

    def compute_output_spec(self, query, value, *args, **kwargs):
        # Symbolic shapes without tracing the loop (Keras' TensorFlow scan
        # cannot be traced with unknown dimensions), from the arguments of call.
        called = inspect.signature(self.call).bind(query, value, *args, **kwargs)
        called.apply_defaults()
        return_attention_scores = called.arguments["return_attention_scores"]
        return_state = called.arguments["return_state"]
        return_log_prob = called.arguments["return_log_prob"]
        self._check(query.shape, value.shape)
        self._check_log_prob(return_log_prob)
        spec = keras.KerasTensor
        batch, length = query.shape[:2]
        results = [spec((batch, length, self.cell.output_size), self.compute_dtype)]
        if return_attention_scores:
            results.append(spec((batch, length, value.shape[1]), self.compute_dtype))
        if return_state:
            states = [
                spec((batch, n), self.compute_dtype) for n in self.cell.state_size
            ]
            if self.cell.use_coverage:
                states[-1] = spec((batch, value.shape[1]), "float32")
            results.append(states)
        if return_log_prob:
            results += [spec((batch, length), "float32")] * 2
        return results[0] if len(results) == 1 else tuple(results)

    def get_config(self):
        return {
            **super().get_config(),
            "cell": keras.saving.serialize_keras_object(self.cell),
            "learn_initial_state": self.learn_initial_state,
        }
