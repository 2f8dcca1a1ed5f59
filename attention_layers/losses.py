"""Losses on attention weights: the coverage loss of See et al. (2017), the
attention supervision of memory networks (Sukhbaatar et al. 2015) and the
doubly stochastic regulariser of Xu et al. (2015)."""

import numbers

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import input_error


def _function_error(function, argument, expected, received):
    """The ``ValueError`` of a loss function, in the layers' format."""
    return ValueError(
        f"{function}: argument `{argument}` expected {expected}; received {received}."
    )


def _ranked(function, argument, x, axes):
    """``x`` if its rank is that of ``[batch, *axes]``, else the
    ``ValueError`` of ``function``."""
    if len(x.shape) != len(axes) + 1:
        raise _function_error(
            function,
            argument,
            f"a rank-{len(axes) + 1} tensor [batch, {', '.join(axes)}]",
            f"shape {tuple(x.shape)}",
        )
    return x


def _float32(function, argument, x, axes):
    """``x`` as a float32 tensor of rank ``len(axes) + 1`` (`_ranked`)."""
    return _ranked(
        function, argument, ops.cast(ops.convert_to_tensor(x), "float32"), axes
    )


def _bool_mask(function, argument, mask, axis):
    """``mask`` as a bool ``[batch, axis]`` tensor (`_ranked`)."""
    mask = masking.as_bool(ops.convert_to_tensor(mask))
    return _ranked(function, argument, mask, (axis,))


def coverage_loss(alignments, mask=None):
    """Per-example coverage loss ``mean_t sum_i min(a_i^t, c_i^t)``.

    ``a^t`` is the attention of decoder step ``t`` over the source and
    ``c^t = sum_{t' < t} a^{t'}`` the coverage, the attention that each source
    position received at the previous steps (computed here from the
    alignments, an exclusive cumulative sum over the target axis). The loss
    penalises attending again to what was already attended to, and is bounded
    by 1 per step. As in See et al. it is averaged over the decoder steps:
    summed over the unmasked steps and divided by their number (0 for an
    example with no unmasked step). Masked steps add nothing, neither to the
    loss nor to the coverage of later steps. Computed in float32.

    Args:
        alignments: ``[B, T, S]``, the attention weights of every decoder step
            (``AttentionDecoder(..., return_attention_scores=True)``).
        mask: optional ``[B, T]``, True on real (unpadded) decoder steps.

    Returns:
        ``[B]`` float32, one value per example.

    Example:

    >>> import numpy as np
    >>> a = np.array([[[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]], "float32")
    >>> # c = [0, 0], [1, 0], [1.5, 0.5]: min sums 0, 0.5, 0.5
    >>> round(float(coverage_loss(a)[0]), 4)  # (0 + 0.5 + 0.5) / 3
    0.3333
    >>> round(float(coverage_loss(a, np.array([[True, True, False]]))[0]), 4)
    0.25

    References:
        See, Liu, Manning. Get To The Point: Summarization with
        Pointer-Generator Networks. ACL 2017, equations 12 and 13.
        https://arxiv.org/abs/1704.04368
    """
    alignments = _float32(
        "coverage_loss", "alignments", alignments, ("target_length", "source_length")
    )
    if mask is not None:
        mask = _bool_mask("coverage_loss", "mask", mask, "target_length")
        alignments = masking.zero_masked(alignments, mask)
    # Exclusive cumulative sum over the steps: the inclusive one shifted by
    # one step (not cumsum - a, whose rounding leaves small non-zeros).
    inclusive = ops.cumsum(alignments, axis=1)
    coverage = ops.pad(inclusive[:, :-1], [[0, 0], [1, 0], [0, 0]])
    per_step = ops.sum(ops.minimum(alignments, coverage), axis=-1)  # [B, T]
    if mask is None:
        return ops.mean(per_step, axis=1)
    steps = ops.sum(ops.cast(mask, "float32"), axis=1)
    return ops.sum(per_step, axis=1) / ops.maximum(steps, 1.0)


class _AlignmentLoss(keras.layers.Layer):
    """What `CoverageLoss` and `DoublyStochasticLoss` share: an endpoint layer
    adding ``weight * mean_b _loss_fn(alignments, mask)_b`` with ``add_loss`` and
    returning the alignments unchanged."""

    _source_axis = "source_length"  # the last axis, named in the errors

    def __init__(self, weight=1.0, **kwargs):
        super().__init__(**kwargs)
        self.weight = _check_weight(self, weight)
        self.supports_masking = True

    def call(self, alignments, mask=None):
        if len(alignments.shape) != 3:
            raise input_error(
                self,
                "alignments",
                f"a rank-3 tensor [batch, target_length, {self._source_axis}]",
                f"shape {tuple(alignments.shape)}",
            )
        if mask is not None and len(mask.shape) != 2:
            raise input_error(
                self,
                "mask",
                "a rank-2 tensor [batch, target_length]",
                f"shape {tuple(mask.shape)}",
            )
        self.add_loss(self.weight * ops.mean(self._loss_fn(alignments, mask)))
        return alignments

    def compute_output_shape(self, alignments_shape, mask_shape=None):
        return alignments_shape

    def get_config(self):
        return {**super().get_config(), "weight": self.weight}


@keras.saving.register_keras_serializable(package="attention_layers")
class CoverageLoss(_AlignmentLoss):
    """Endpoint layer adding the coverage loss of See et al. (2017) to a model.

    It adds ``weight * mean_b coverage_loss(alignments, mask)_b`` to the
    model's losses with ``add_loss`` (see `coverage_loss`: per example, the
    average over the unmasked decoder steps of ``sum_i min(a_i^t, c_i^t)``),
    and returns the alignments unchanged. The math is float32 under mixed
    precision. Put it on the alignments of an `AttentionDecoder` whose
    attention has ``use_coverage=True``, so that the model can learn to
    avoid the attention the loss penalises. The layer belongs to a model
    only if its output does: make the returned alignments a model output
    (with no loss of its own in ``compile``).

    Args:
        weight: ``lambda >= 0``, the weight of the loss (See et al.: 1).
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        alignments: ``[B, T, S]``, the attention weights of every step.
        mask: optional ``[B, T]``, True on real decoder steps (the target
            padding). Keras fills it from a mask the alignments carry; those
            of `AttentionDecoder` carry none, so pass the target mask.

    Returns:
        ``alignments``, unchanged.

    Example:

    >>> import keras, numpy as np
    >>> import attention_layers as al
    >>> target = keras.Input((4, 5))
    >>> memory = keras.Input((6, 8))
    >>> cell = al.AttentionRNNCell(keras.layers.GRUCell(8),
    ...     al.BahdanauAttention(units=4, use_coverage=True), output_units=8)
    >>> outputs, alignments = al.AttentionDecoder(cell)(
    ...     target, memory, return_attention_scores=True)
    >>> alignments = al.CoverageLoss(weight=1.0)(alignments)
    >>> logits = keras.layers.Dense(3)(outputs)
    >>> model = keras.Model([target, memory],
    ...                     {"logits": logits, "alignments": alignments})
    >>> model.compile("adam", loss={"logits": keras.losses.
    ...     SparseCategoricalCrossentropy(from_logits=True)})
    >>> x = [np.random.rand(8, 4, 5).astype("float32"),
    ...      np.random.rand(8, 6, 8).astype("float32")]
    >>> y = {"logits": np.random.randint(0, 3, size=(8, 4))}
    >>> history = model.fit(x, y, epochs=1, verbose=0)  # cross-entropy + coverage
    >>> bool(np.isfinite(history.history["loss"]).all())
    True
    >>> _ = model(x)
    >>> len(model.losses), bool(model.losses[0] >= 0)  # the coverage term
    (1, True)

    References:
        See, Liu, Manning. Get To The Point: Summarization with
        Pointer-Generator Networks. ACL 2017, section 2.3.
        https://arxiv.org/abs/1704.04368
    """

    _loss_fn = staticmethod(coverage_loss)


# The least attention whose log is taken: log(0) would make the loss of an
# attention that underflowed to 0 on a supporting fact infinite. log(1e-30)
# is about -69; 1e-30 is a normal float32.
ATTENTION_FLOOR = 1e-30


def _hop_list(hops, error):
    """``hops`` (None, an int or a list of ints) as None or a list of ints;
    ``error(expected, received)`` makes the ``ValueError``."""
    if hops is None:
        return None
    items = [hops] if isinstance(hops, numbers.Integral) else hops
    try:
        items = list(items)
    except TypeError:
        items = []
    integers = all(
        isinstance(h, numbers.Integral) and not isinstance(h, bool) for h in items
    )
    if isinstance(hops, bool) or not items or not integers:
        raise error("None, a hop index or a non-empty list of hop indices", repr(hops))
    return [int(h) for h in items]


def _hop_indices(hops, num_hops, error):
    """`_hop_list` of ``hops``, each index in ``[0, num_hops)`` (negative ones
    count from the end); ``num_hops`` None: unknown, no negative index."""
    items = _hop_list(hops, error)
    if items is None:
        return None
    if num_hops is None:
        if any(h < 0 for h in items):
            raise error(
                "non-negative hop indices (the number of hops is not known)",
                repr(hops),
            )
        return items
    if not all(-num_hops <= h < num_hops for h in items):
        raise error(
            f"hop indices in [-{num_hops}, {num_hops}) ({num_hops} hops)", repr(hops)
        )
    return [h % num_hops for h in items]


def memory_supervision_loss(attention, supporting, hops=None):
    """Per-example cross-entropy between the hops' attention and the supporting facts.

    The target of a hop is the uniform distribution ``q`` over the
    supporting facts of the example, ``q_i = s_i / sum_i s_i``; the loss of
    one hop is ``-sum_i q_i log p_i`` for its attention ``p`` (at least 0,
    0 when all the attention lies on the supporting facts, evenly), and the
    loss of an example is the mean over the supervised hops. An example with
    no supporting fact gives 0. The attention is floored at ``1e-30``
    before the log (``ATTENTION_FLOOR``), so a supporting fact whose
    attention underflowed to 0 gives a finite loss (at most about 69), never
    ``inf`` or NaN. Computed in float32.

    Which hops to supervise: all of them by default (``hops=None``), as when
    every hop should look at the supporting facts (one supporting fact).
    ``hops=[0]`` supervises only the first hop and leaves the later ones
    free; with facts in the order they are needed, ``hops=0`` and ``hops=1``
    can take one loss each, with the first and the second fact as
    ``supporting``. Negative indices count from the last hop.

    Args:
        attention: ``[B, K, M]``, the attention of every hop over the
            memories (``MemoryNetwork(..., return_attention=True)``).
        supporting: ``[B, M]`` bool or 0/1, True on the supporting facts.
        hops: None (every hop), a hop index or a list of hop indices
            (0-based).

    Returns:
        ``[B]`` float32, one value per example.

    Example:

    >>> import numpy as np
    >>> attention = np.array([[[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]]], "float32")
    >>> supporting = np.array([[1, 0, 0]])
    >>> round(float(memory_supervision_loss(attention, supporting)[0]), 4)
    0.3466
    >>> # (-log 0.5 - log 1) / 2; the first hop only: -log 0.5
    >>> round(float(memory_supervision_loss(attention, supporting, [0])[0]), 4)
    0.6931

    References:
        Sukhbaatar, Szlam, Weston, Fergus. End-To-End Memory Networks.
        NeurIPS 2015, section 4.2 (the strongly supervised MemNN baseline
        uses the supporting facts). https://arxiv.org/abs/1503.08895
    """

    function = "memory_supervision_loss"

    def error(argument):
        return lambda expected, received: _function_error(
            function, argument, expected, received
        )

    attention = _float32(function, "attention", attention, ("hops", "memories"))
    supporting = _bool_mask(function, "supporting", supporting, "memories")
    m_att, m_sup = attention.shape[2], supporting.shape[1]
    if isinstance(m_att, int) and isinstance(m_sup, int) and m_att != m_sup:
        raise error("supporting")(
            f"as many memories as the attention ({m_att})",
            f"shape {tuple(supporting.shape)}",
        )
    num_hops = attention.shape[1] if isinstance(attention.shape[1], int) else None
    indices = _hop_indices(hops, num_hops, error("hops"))
    if indices is not None:
        attention = ops.take(attention, indices, axis=1)
    supporting = ops.cast(supporting, "float32")
    count = ops.sum(supporting, axis=-1)  # [B]
    target = supporting / ops.expand_dims(ops.maximum(count, 1.0), -1)
    log_p = ops.log(ops.maximum(attention, ATTENTION_FLOOR))
    per_hop = -ops.sum(ops.expand_dims(target, 1) * log_p, axis=-1)  # [B, K']
    return ops.where(count > 0, ops.mean(per_hop, axis=1), 0.0)


@keras.saving.register_keras_serializable(package="attention_layers")
class MemorySupervisionLoss(keras.layers.Layer):
    """Endpoint layer adding the attention supervision of a memory network.

    It adds ``weight * mean_b memory_supervision_loss(attention, supporting,
    hops)_b`` to the model's losses with ``add_loss`` (see
    `memory_supervision_loss`: per example, the mean over the supervised
    hops of the cross-entropy between the hop's attention and the uniform
    distribution over the supporting facts) and returns the attention
    unchanged. The math is float32 under mixed precision. The layer belongs
    to a model only if its output does: make the returned attention a model
    output (with no loss of its own in ``compile``).

    Args:
        weight: ``>= 0``, the weight of the loss.
        hops: the hops to supervise: None (all, the default), a hop index or
            a list of them (``[0]``: the first hop only).
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        attention: ``[B, K, M]``, the attention of every hop.
        supporting: ``[B, M]`` bool or 0/1, True on the supporting facts.

    Returns:
        ``attention``, unchanged.

    Example:

    >>> import keras, numpy as np
    >>> import attention_layers as al
    >>> story = keras.Input((3, 4), dtype="int32")
    >>> question = keras.Input((4,), dtype="int32")
    >>> supporting = keras.Input((3,), dtype="bool")
    >>> logits, attention = al.MemoryNetwork(8, 6, max_memories=3, max_words=4,
    ...     hops=2)(story, question, return_attention=True)
    >>> attention = al.MemorySupervisionLoss(hops=[0])(attention, supporting)
    >>> model = keras.Model([story, question, supporting],
    ...                     {"answer": logits, "attention": attention})
    >>> model.compile("adam", loss={"answer": keras.losses.
    ...     SparseCategoricalCrossentropy(from_logits=True)})
    >>> x = [np.random.randint(1, 8, (4, 3, 4)), np.random.randint(1, 8, (4, 4)),
    ...      np.eye(3, dtype=bool)[[0, 1, 2, 0]]]
    >>> history = model.fit(x, {"answer": np.array([1, 2, 3, 4])}, verbose=0)
    >>> bool(np.isfinite(history.history["loss"]).all())
    True

    References:
        Sukhbaatar, Szlam, Weston, Fergus. End-To-End Memory Networks.
        NeurIPS 2015. https://arxiv.org/abs/1503.08895
    """

    def __init__(self, weight=1.0, hops=None, **kwargs):
        super().__init__(**kwargs)
        self.weight = _check_weight(self, weight)
        # The range is checked against the attention's number of hops.
        self.hops = _hop_list(hops, self._hops_error)

    def _hops_error(self, expected, received):
        return input_error(self, "hops", expected, received)

    def call(self, attention, supporting):
        if len(attention.shape) != 3:
            raise input_error(
                self,
                "attention",
                "a rank-3 tensor [batch, hops, memories]",
                f"shape {tuple(attention.shape)}",
            )
        if len(supporting.shape) != 2:
            raise input_error(
                self,
                "supporting",
                "a rank-2 tensor [batch, memories]",
                f"shape {tuple(supporting.shape)}",
            )
        num_hops = attention.shape[1] if isinstance(attention.shape[1], int) else None
        hops = _hop_indices(self.hops, num_hops, self._hops_error)
        loss = memory_supervision_loss(attention, supporting, hops)
        self.add_loss(self.weight * ops.mean(loss))
        return attention

    def compute_output_shape(self, attention_shape, supporting_shape):
        return attention_shape

    def get_config(self):
        return {**super().get_config(), "weight": self.weight, "hops": self.hops}


def doubly_stochastic_loss(alignments, mask=None, memory_mask=None):
    """Per-example doubly stochastic penalty ``sum_i (1 - sum_t a_ti)^2``.

    ``a_t`` is the attention of decoder step ``t`` over the ``L`` encoder
    positions ``i`` (the cells of an image's feature grid). Each row already
    sums to 1 over ``i``; the penalty pushes each position's attention summed
    over the steps towards 1 as well, so that over a caption every part of
    the image is looked at. Masked decoder steps (``mask``, the target
    padding) add nothing to the sums; masked positions (``memory_mask``, a
    padded memory) are left out of the penalty. Computed in float32. Xu et
    al. add ``lambda`` times this to the caption's negative log-likelihood
    (`DoublyStochasticLoss`).

    Args:
        alignments: ``[B, T, L]``, the attention weights of every decoder step.
        mask: optional ``[B, T]``, True on real (unpadded) decoder steps.
        memory_mask: optional ``[B, L]``, True on real encoder positions.

    Returns:
        ``[B]`` float32, one value per example.

    Example:

    >>> import numpy as np
    >>> a = np.array([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]]], "float32")
    >>> # sums over the steps 0.5, 1.5, 0: 0.25 + 0.25 + 1
    >>> float(doubly_stochastic_loss(a)[0])
    1.5
    >>> float(doubly_stochastic_loss(a, mask=np.array([[True, False]]))[0])
    1.5
    >>> float(doubly_stochastic_loss(a, memory_mask=np.array([[1, 1, 0]]))[0])
    0.5

    References:
        Xu, Ba, Kiros, Cho, Courville, Salakhutdinov, Zemel, Bengio. Show,
        Attend and Tell: Neural Image Caption Generation with Visual
        Attention. ICML 2015, section 4.2.1, equation 14.
        https://arxiv.org/abs/1502.03044
    """

    function = "doubly_stochastic_loss"
    alignments = _float32(
        function, "alignments", alignments, ("target_length", "memory_length")
    )
    if mask is not None:
        mask = _bool_mask(function, "mask", mask, "target_length")
        alignments = masking.zero_masked(alignments, mask)
    per_position = ops.square(1.0 - ops.sum(alignments, axis=1))  # [B, L]
    if memory_mask is not None:
        memory_mask = _bool_mask(function, "memory_mask", memory_mask, "memory_length")
        per_position = ops.where(memory_mask, per_position, 0.0)
    return ops.sum(per_position, axis=-1)


@keras.saving.register_keras_serializable(package="attention_layers")
class DoublyStochasticLoss(_AlignmentLoss):
    """Endpoint layer adding the doubly stochastic regulariser of Xu et al. (2015).

    It adds ``weight * mean_b doubly_stochastic_loss(alignments, mask)_b``
    to the model's losses with ``add_loss`` (per example,
    ``sum_i (1 - sum_t a_ti)^2`` over the unmasked decoder steps ``t``) and
    returns the alignments unchanged. The math is float32 under mixed
    precision. The layer belongs to a model only if its output does: make
    the returned alignments a model output (with no loss of its own in
    ``compile``).

    Args:
        weight: ``lambda >= 0``, the weight of the penalty (Xu et al. tune
            it; 1 is a common choice).
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        alignments, mask: as in `CoverageLoss`, with ``alignments``
            ``[B, T, L]`` over the ``L`` encoder positions.

    Returns:
        ``alignments``, unchanged.

    Example:

    >>> import keras, numpy as np
    >>> import attention_layers as al
    >>> grid = keras.Input((6, 8))  # a 2x3 feature grid, flattened
    >>> target = keras.Input((4, 5))
    >>> cell = al.AttentionRNNCell(keras.layers.GRUCell(8),
    ...     al.BahdanauAttention(units=4), output_units=8, context_gate=True)
    >>> outputs, alignments = al.AttentionDecoder(cell)(
    ...     target, grid, return_attention_scores=True)
    >>> alignments = al.DoublyStochasticLoss(weight=1.0)(alignments)
    >>> model = keras.Model([target, grid], {"logits": keras.layers.Dense(3)(
    ...     outputs), "alignments": alignments})
    >>> model.compile("adam", loss={"logits": keras.losses.
    ...     SparseCategoricalCrossentropy(from_logits=True)})
    >>> x = [np.random.rand(8, 4, 5).astype("float32"),
    ...      np.random.rand(8, 6, 8).astype("float32")]
    >>> history = model.fit(x, {"logits": np.random.randint(0, 3, size=(8, 4))},
    ...                     epochs=1, verbose=0)  # cross-entropy + the penalty
    >>> bool(np.isfinite(history.history["loss"]).all())
    True

    References:
        Xu, Ba, Kiros, Cho, Courville, Salakhutdinov, Zemel, Bengio. Show,
        Attend and Tell: Neural Image Caption Generation with Visual
        Attention. ICML 2015, section 4.2.1. https://arxiv.org/abs/1502.03044
    """

    _loss_fn = staticmethod(doubly_stochastic_loss)
    _source_axis = "memory_length"


def _check_weight(layer, weight):
    """``weight`` as a float ``>= 0``, or a ``ValueError`` naming ``layer``."""
    try:
        ok = not isinstance(weight, bool) and float(weight) >= 0.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise input_error(layer, "weight", "a float >= 0", repr(weight))
    return float(weight)
