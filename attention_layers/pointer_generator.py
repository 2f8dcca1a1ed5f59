"""The copy mechanism of the pointer-generator network (See et al. 2017).

A decoder step produces a distribution over a fixed vocabulary of ``V`` words
and an attention distribution over the ``S`` source positions. The
pointer-generator mixes them with a learned soft switch ``p_gen``:

``P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: w_i = w} a_i``

over the vocabulary *extended* by the source's own out-of-vocabulary words,
so a word that the vocabulary lacks can still be produced by copying it.

Extended ids are indexed by source position: the extended vocabulary of a
source of length ``S`` has ``V + S`` entries, and id ``V + j`` stands for
"the out-of-vocabulary word first seen at source position ``j``". Every
source token thus has an extended id: its vocabulary id if the vocabulary has
it, else ``V + (first position holding the same word)``, so the repeats of one
unknown word share one entry and their attention adds up. The helpers
`extended_source_ids`, `extended_target_ids` and `copy_step_inputs` build
these ids from vocabulary ids and per-word integer keys (any hash of the
word's text), with ``keras.ops`` only, inside a model or a decoder.
"""

import keras
import numpy as np
from keras import ops

from attention_layers.base import (
    check_built_dim,
    check_mask_shape,
    check_positive_int,
    concrete_value,
    input_error,
    linear,
    static_shape,
)
from attention_layers.masking import NEG_INF

# The least copy mass a word present in the source gets: its attention can
# underflow to 0 (a softmax over scores that differ by more than ~100), and
# log(0) would make the loss of copying it infinite. The floor adds at most
# S * 1e-30 to the total probability, below float32 resolution near 1.
COPY_FLOOR = 1e-30


def _as_mask(mask, like):
    """``mask`` as a bool tensor, or all True shaped like ``like`` if None."""
    if mask is None:
        return ops.ones(ops.shape(like), "bool")
    mask = ops.convert_to_tensor(mask)
    if keras.backend.standardize_dtype(mask.dtype) != "bool":
        mask = ops.not_equal(mask, 0)
    return mask


def _first_match(match):
    """Index of the first True along the last axis of ``match`` (0 if none),
    and whether there is one."""
    found = ops.any(match, axis=-1)
    first = ops.argmax(ops.cast(match, "int32"), axis=-1)
    return ops.cast(first, "int32"), found


def extended_source_ids(vocab_ids, token_keys, unk_id, vocab_size, mask=None):
    """Extended ids of the source tokens: vocabulary id, or ``V + first position``.

    A token whose vocabulary id is ``unk_id`` is out of vocabulary; it gets the
    id ``vocab_size + j``, with ``j`` the first (unmasked) position of the
    source holding the same word, i.e. the same key. In-vocabulary tokens keep
    their id. Masked positions keep ``vocab_ids`` as given (they never
    matter to `PointerGenerator`).

    Args:
        vocab_ids: ``[B, S]`` int, the source tokens' ids in the vocabulary.
        token_keys: ``[B, S]`` int, a key per token with equal keys for equal
            words (e.g. a hash of the word's text).
        unk_id: the vocabulary's unknown-word id.
        vocab_size: ``V``, a Python int.
        mask: optional ``[B, S]``, True on real source positions.

    Returns:
        ``[B, S]`` int32 extended ids in ``[0, V + S)``.

    Example:

    >>> import numpy as np
    >>> from attention_layers import extended_source_ids
    >>> # V = 10, unk = 1; words "the", "zorp", "cat", "zorp": "zorp" is OOV.
    >>> ids = extended_source_ids(np.array([[4, 1, 7, 1]]),
    ...                           np.array([[101, 555, 303, 555]]),
    ...                           unk_id=1, vocab_size=10)
    >>> np.asarray(ids).tolist()  # both "zorp"s: 10 + position 1
    [[4, 11, 7, 11]]
    """
    vocab_ids = ops.cast(vocab_ids, "int32")
    token_keys = ops.convert_to_tensor(token_keys)
    mask = _as_mask(mask, vocab_ids)
    same = ops.logical_and(
        ops.equal(ops.expand_dims(token_keys, 2), ops.expand_dims(token_keys, 1)),
        ops.expand_dims(mask, 1),
    )  # [B, S (token), S (earlier holder)]
    first, _ = _first_match(same)
    oov = ops.logical_and(ops.equal(vocab_ids, unk_id), mask)
    return ops.where(oov, int(vocab_size) + first, vocab_ids)


def extended_target_ids(
    target_vocab_ids,
    target_keys,
    source_keys,
    source_ext_ids,
    unk_id,
    vocab_size,
    source_mask=None,
):
    """Targets over the extended vocabulary: an OOV word found in the source is
    its copy id, any other OOV word stays ``unk_id``.

    Args:
        target_vocab_ids: ``[B, T]`` int, the target tokens' vocabulary ids.
        target_keys: ``[B, T]`` int, keys of the target words (the same keying
            as ``source_keys``).
        source_keys: ``[B, S]`` int, keys of the source words.
        source_ext_ids: ``[B, S]``, from `extended_source_ids`.
        unk_id: the vocabulary's unknown-word id.
        vocab_size: ``V``, a Python int.
        source_mask: optional ``[B, S]``, True on real source positions.

    Returns:
        ``[B, T]`` int32 ids in ``[0, V + S)``, the targets of a loss over the
        output of `PointerGenerator`.

    Example:

    >>> import numpy as np
    >>> from attention_layers import extended_target_ids
    >>> # Source "the zorp cat zorp" as in extended_source_ids: "zorp" is 11.
    >>> # Target "zorp blix the": "blix" is OOV and not in the source.
    >>> ids = extended_target_ids(np.array([[1, 1, 4]]),
    ...                           np.array([[555, 777, 101]]),
    ...                           np.array([[101, 555, 303, 555]]),
    ...                           np.array([[4, 11, 7, 11]]),
    ...                           unk_id=1, vocab_size=10)
    >>> np.asarray(ids).tolist()
    [[11, 1, 4]]
    """
    target_vocab_ids = ops.cast(target_vocab_ids, "int32")
    source_ext_ids = ops.cast(source_ext_ids, "int32")
    source_mask = _as_mask(source_mask, source_ext_ids)
    copyable = ops.logical_and(source_mask, source_ext_ids >= int(vocab_size))
    match = ops.logical_and(
        ops.equal(
            ops.expand_dims(ops.convert_to_tensor(target_keys), 2),
            ops.expand_dims(ops.convert_to_tensor(source_keys), 1),
        ),
        ops.expand_dims(copyable, 1),
    )  # [B, T, S]
    first, found = _first_match(match)
    copy_id = ops.take_along_axis(source_ext_ids, first, axis=1)
    oov = ops.equal(target_vocab_ids, unk_id)
    return ops.where(ops.logical_and(oov, found), copy_id, target_vocab_ids)


def copy_step_inputs(ids, vocab_size, unk_id):
    """The next decoder input for chosen extended ids: copies become ``unk_id``.

    The decoder's embedding only knows the ``V`` vocabulary ids; a word chosen
    by copying (id ``>= V``) is fed back as the unknown word.

    Args:
        ids: int tensor of extended ids.
        vocab_size: ``V``.
        unk_id: the vocabulary's unknown-word id.

    Returns:
        int32 ids in ``[0, V)``, shaped like ``ids``.

    Example:

    >>> import numpy as np
    >>> from attention_layers import copy_step_inputs
    >>> np.asarray(copy_step_inputs(np.array([4, 11, 2]), 10, unk_id=1)).tolist()
    [4, 1, 2]
    """
    ids = ops.cast(ids, "int32")
    return ops.where(ids >= int(vocab_size), ops.cast(unk_id, "int32"), ids)


def _renormalised(attention, mask):
    """float32 attention over the unmasked positions, renormalised, and
    whether each row has mass left ``[B, T]`` (rows without have no copy
    term)."""
    attention = ops.cast(attention, "float32")
    attention = ops.where(ops.expand_dims(mask, 1), attention, 0.0)
    total = ops.sum(attention, axis=-1)  # [B, T]
    can_copy = total > 0.0
    attention = attention / ops.expand_dims(ops.where(can_copy, total, 1.0), -1)
    return attention, can_copy


def _log_copy(attention, ids, mask, extended):
    """Log copy mass per extended id, ``[B, T, V + S]``: every token's
    attention added at its id, floored at ``COPY_FLOOR`` for ids present in
    the source, ``NEG_INF`` for the others; and which ids are present,
    ``[B, 1, V + S]``."""
    batch_size, steps = ops.shape(attention)[0], ops.shape(attention)[1]
    rows = ops.broadcast_to(
        ops.expand_dims(ops.arange(batch_size, dtype="int32"), 1),
        ops.shape(ids),
    )
    index = ops.stack([rows, ids], axis=-1)  # [B, S, 2]
    copy = ops.scatter(
        index,
        ops.transpose(attention, (0, 2, 1)),  # [B, S, T]
        (batch_size, extended, steps),
    )
    copy = ops.transpose(copy, (0, 2, 1))  # [B, T, V + S]
    present = ops.scatter(index, ops.cast(mask, "float32"), (batch_size, extended))
    present = ops.expand_dims(present > 0.0, 1)  # [B, 1, V + S]
    log_copy = ops.where(present, ops.log(ops.maximum(copy, COPY_FLOOR)), NEG_INF)
    return log_copy, present


@keras.saving.register_keras_serializable(package="attention_layers")
class PointerGenerator(keras.layers.Layer):
    """The pointer-generator's final distribution: generate or copy a word.

    ``p_gen = sigmoid(w_h^T h*_t + w_s^T s_t + w_x^T x_t + b)`` is one
    ``Dense(1)`` over ``gate_inputs = [h*_t; s_t; x_t]`` (the context vector,
    the decoder state and the decoder input, concatenated: a dense layer over a
    concatenation is the sum of one dense layer per part, plus one bias), and

    ``P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: w_i = w} a_i``

    over the ``V + S`` extended ids (see the module docstring and
    `extended_source_ids`): ``P_vocab = softmax(logits)`` is 0 past ``V``, and
    the attention ``a`` of every source token adds to its extended id, so an
    in-vocabulary source word adds its copy mass to its vocabulary entry and
    the repeats of an out-of-vocabulary word add up in one entry.

    The layer returns log-probabilities, computed in float32 under any dtype
    policy and in log space (``log_sigmoid(+-g)``, ``log_softmax(logits)``,
    ``logaddexp``), so they stay finite when ``p_gen`` saturates. They are
    normalised: use them as logits of
    ``SparseCategoricalCrossentropy(from_logits=True)`` or of the decoders in
    `attention_layers.decoding`. Further:

    * the attention is renormalised over the unmasked source positions (a
      no-op for an attention computed with the same mask), and masked
      positions are ignored: their attention and ids may be anything, NaN or
      out of range;
    * where no attention is left (an empty source, all masked, or an all-zero
      attention row) ``p_gen`` is taken as 1: the copy term vanishes and the
      result is ``log_softmax(logits)``, padded;
    * an extended id that no unmasked source token has gets exactly ``-1e9``
      (no mass: a decoder never picks it); a present word's copy mass is
      floored at ``1e-30`` (``COPY_FLOOR``), so a target whose attention
      underflowed to 0 still has a finite loss (at most
      ``-log(1 - p_gen) + 69``);
    * source ids must lie in ``[0, V + S)`` at unmasked positions: an id
      outside raises a ``ValueError`` when the values are known at call time
      (eager), and is clipped into the range inside a traced function.

    Args:
        vocab_size: ``V``, the size of the fixed vocabulary (the last
            dimension of ``logits``).
        gate_initializer: initializer of the gate's kernel.
        gate_bias_initializer: initializer of the gate's bias ``b``.
        **kwargs: standard ``keras.layers.Layer`` arguments (``name``, ``dtype``).

    Call arguments:
        logits: ``[B, T, V]`` vocabulary logits (``[B, V]`` for one step).
        attention: ``[B, T, S]`` attention weights over the source
            (``[B, S]``).
        source_ids: ``[B, S]`` int extended source ids (`extended_source_ids`).
        gate_inputs: ``[B, T, F]`` the gate's input ``[h*_t; s_t; x_t]``
            (``[B, F]``).
        source_mask: optional ``[B, S]``, True on real source positions.
        return_p_gen: also return ``p_gen``.

    Returns:
        float32 log-probabilities ``[B, T, V + S]`` (``[B, V + S]`` for one
        step), and with ``return_p_gen=True`` the tuple ``(log_probs,
        p_gen)``, ``p_gen`` float32 ``[B, T]`` (``[B]``).

    Example:

    >>> import numpy as np
    >>> import attention_layers as al
    >>> V, S = 5, 3
    >>> logits = np.zeros((1, 2, V), "float32")
    >>> attention = np.array([[[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]], "float32")
    >>> source_ids = np.array([[5, 5, 2]])  # one OOV word twice, then word 2
    >>> gate_inputs = np.zeros((1, 2, 4), "float32")
    >>> layer = al.PointerGenerator(V, gate_initializer="zeros")
    >>> log_probs, p_gen = layer(logits, attention, source_ids, gate_inputs,
    ...                          return_p_gen=True)
    >>> tuple(log_probs.shape), np.asarray(p_gen).tolist()
    ((1, 2, 8), [[0.5, 0.5]])
    >>> probs = np.exp(np.asarray(log_probs))
    >>> probs[0, 0].round(2).tolist()  # the OOV word gets (1 - p_gen) * 1
    [0.1, 0.1, 0.1, 0.1, 0.1, 0.5, 0.0, 0.0]
    >>> probs[0, 1].round(2).tolist()  # word 2: 0.5 * 0.2 + 0.5 * 1
    [0.1, 0.1, 0.6, 0.1, 0.1, 0.0, 0.0, 0.0]

    References:
        See, Liu and Manning. Get To The Point: Summarization with
        Pointer-Generator Networks. ACL 2017, section 2.2.
        https://arxiv.org/abs/1704.04368
    """

    def __init__(
        self,
        vocab_size,
        gate_initializer="glorot_uniform",
        gate_bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = check_positive_int(self, "vocab_size", vocab_size)
        self.supports_masking = True  # the target mask of `logits` passes on
        self.gate_initializer = keras.initializers.get(gate_initializer)
        self.gate_bias_initializer = keras.initializers.get(gate_bias_initializer)

    def build(
        self,
        logits_shape,
        attention_shape,
        source_ids_shape,
        gate_inputs_shape,
        source_mask_shape=None,
    ):
        self._check_shapes(
            logits_shape, attention_shape, source_ids_shape, gate_inputs_shape
        )
        features = static_shape(gate_inputs_shape)[-1]
        if features is None:
            raise input_error(
                self,
                "gate_inputs",
                "a known last dimension (the size of [h*; s; x])",
                f"shape {static_shape(gate_inputs_shape)}",
            )
        self.gate = keras.layers.Dense(
            1,
            kernel_initializer=self.gate_initializer,
            bias_initializer=self.gate_bias_initializer,
            dtype=self.dtype_policy,
            name="gate",
        )
        self.gate.build((None, features))

    def _check_shapes(self, logits, attention, source_ids, gate_inputs):
        logits, attention = static_shape(logits), static_shape(attention)
        source_ids, gate_inputs = static_shape(source_ids), static_shape(gate_inputs)
        if len(logits) not in (2, 3):
            raise input_error(
                self,
                "logits",
                "a rank-3 tensor [batch, target_length, vocab_size] or a rank-2 "
                "tensor [batch, vocab_size] (one decoder step)",
                f"shape {logits}",
            )
        rank = len(logits)
        step = " (the rank of logits)" if rank == 2 else ""
        steps = "[batch, " if rank == 2 else "[batch, target_length, "
        if len(attention) != rank:
            raise input_error(
                self,
                "attention",
                f"a rank-{rank} tensor {steps}source_length]{step}",
                f"shape {attention}",
            )
        if len(gate_inputs) != rank:
            raise input_error(
                self,
                "gate_inputs",
                f"a rank-{rank} tensor {steps}features]{step}",
                f"shape {gate_inputs}",
            )
        if len(source_ids) != 2:
            raise input_error(
                self,
                "source_ids",
                "a rank-2 tensor [batch, source_length]",
                f"shape {source_ids}",
            )
        v = logits[-1]
        if v is not None and v != self.vocab_size:
            raise input_error(
                self,
                "logits",
                f"last dimension vocab_size={self.vocab_size}",
                f"shape {logits}",
            )
        s_att, s_ids = attention[-1], source_ids[1]
        if None not in (s_att, s_ids) and s_att != s_ids:
            raise input_error(
                self,
                "source_ids",
                f"the source length of attention ({s_att})",
                f"shape {source_ids}",
            )
        batches = {x[0] for x in (logits, attention, source_ids, gate_inputs)}
        if len(batches - {None}) > 1:
            raise input_error(
                self,
                "attention",
                "the same batch size as logits, source_ids and gate_inputs",
                f"batch sizes logits={logits[0]}, attention={attention[0]}, "
                f"source_ids={source_ids[0]}, gate_inputs={gate_inputs[0]}",
            )
        if rank == 3:
            lengths = {x[1] for x in (logits, attention, gate_inputs)} - {None}
            if len(lengths) > 1:
                raise input_error(
                    self,
                    "attention",
                    "the target length of logits and gate_inputs",
                    f"lengths logits={logits[1]}, attention={attention[1]}, "
                    f"gate_inputs={gate_inputs[1]}",
                )

    def _check_dtypes(self, logits, attention, source_ids, gate_inputs):
        for name, x in (
            ("logits", logits),
            ("attention", attention),
            ("gate_inputs", gate_inputs),
        ):
            dtype = keras.backend.standardize_dtype(x.dtype)
            if "float" not in dtype:
                raise input_error(
                    self, name, "a floating-point tensor", f"dtype {dtype}"
                )
        dtype = keras.backend.standardize_dtype(source_ids.dtype)
        if "int" not in dtype:
            raise input_error(
                self,
                "source_ids",
                "an integer tensor of extended ids",
                f"dtype {dtype}",
            )

    def _check_ids(self, source_ids, mask, extended):
        """Refuse out-of-range ids at unmasked positions when their values are
        known now; inside a traced function they are clipped by the caller."""
        ids = concrete_value(source_ids)
        if ids is None:
            return
        keep = np.ones(ids.shape, bool) if mask is None else concrete_value(mask)
        if keep is None:
            return
        bad = np.logical_and(keep.astype(bool), (ids < 0) | (ids >= extended))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise input_error(
                self,
                "source_ids",
                f"extended ids in [0, vocab_size + source_length) = [0, "
                f"{extended}) at unmasked positions",
                f"{int(ids[where])} at position {where}",
            )

    def call(
        self,
        logits,
        attention,
        source_ids,
        gate_inputs,
        source_mask=None,
        return_p_gen=False,
    ):
        self._check_call(logits, attention, source_ids, gate_inputs, source_mask)
        single_step = len(logits.shape) == 2
        if single_step:
            logits = ops.expand_dims(logits, 1)
            attention = ops.expand_dims(attention, 1)
            gate_inputs = ops.expand_dims(gate_inputs, 1)
        mask = _as_mask(source_mask, source_ids)
        ids = self._source_ids(source_ids, source_mask, mask)
        attention, can_copy = _renormalised(attention, mask)
        gate = self._gate_logit(gate_inputs)
        log_copy, present = _log_copy(
            attention, ids, mask, self._extended_size(source_ids)
        )
        log_probs = self._mix(logits, log_copy, present, gate, can_copy)
        p_gen = ops.where(can_copy, ops.sigmoid(gate), 1.0)
        if single_step:
            log_probs, p_gen = ops.squeeze(log_probs, 1), ops.squeeze(p_gen, 1)
        if return_p_gen:
            return log_probs, p_gen
        return log_probs

    def _extended_size(self, source_ids):
        """``V + S``, the size of the extended vocabulary (an int when ``S``
        is static)."""
        return self.vocab_size + ops.shape(source_ids)[1]

    def _check_call(self, logits, attention, source_ids, gate_inputs, source_mask):
        """Refuse inputs whose ranks, shapes or dtypes do not fit."""
        self._check_shapes(
            logits.shape, attention.shape, source_ids.shape, gate_inputs.shape
        )
        self._check_dtypes(logits, attention, source_ids, gate_inputs)
        batch, length = static_shape(source_ids.shape)
        check_mask_shape(self, "source_mask", source_mask, (batch, length))
        check_built_dim(self, "gate_inputs", gate_inputs, self.gate.kernel.shape[0])

    def _source_ids(self, source_ids, source_mask, mask):
        """int32 extended ids in range: masked positions point at entry 0
        (with no weight), out-of-range ones raise when known, else clip."""
        extended = self._extended_size(source_ids)
        source_ids = ops.cast(source_ids, "int32")
        if isinstance(extended, int):
            self._check_ids(source_ids, source_mask, extended)
        return ops.clip(ops.where(mask, source_ids, 0), 0, extended - 1)

    def _gate_logit(self, gate_inputs):
        """``[B, T]`` float32 logit of ``p_gen``: a float16 product could
        overflow to inf."""
        x = ops.cast(gate_inputs, "float32")
        kernel = ops.cast(self.gate.kernel, "float32")
        gate = linear(x, kernel[:, 0])
        return gate + ops.cast(self.gate.bias, "float32")[0]

    def _mix(self, logits, log_copy, present, gate, can_copy):
        """``log(p_gen P_vocab + (1 - p_gen) P_copy)`` over the extended ids,
        ``NEG_INF`` on ids with no mass (past ``V`` and absent from the
        source)."""
        log_p_gen = ops.where(can_copy, ops.log_sigmoid(gate), 0.0)
        log_p_copy = ops.where(can_copy, ops.log_sigmoid(-gate), NEG_INF)
        log_vocab = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        shape = ops.shape(log_copy)
        source = shape[2] - self.vocab_size
        padding = ops.full((shape[0], shape[1], source), NEG_INF, "float32")
        log_vocab = ops.concatenate([log_vocab, padding], -1)
        log_probs = ops.logaddexp(
            ops.expand_dims(log_p_gen, -1) + log_vocab,
            ops.expand_dims(log_p_copy, -1) + log_copy,
        )
        in_vocab = ops.expand_dims(ops.arange(shape[2]) < self.vocab_size, 0)
        return ops.where(
            ops.logical_or(present, ops.expand_dims(in_vocab, 0)), log_probs, NEG_INF
        )

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "gate_initializer": keras.initializers.serialize(self.gate_initializer),
            "gate_bias_initializer": keras.initializers.serialize(
                self.gate_bias_initializer
            ),
        }
