"""Losses on attention weights: the coverage loss of See et al. (2017)."""

import keras
from keras import ops

from attention_layers import masking
from attention_layers.base import input_error


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
    alignments = ops.cast(ops.convert_to_tensor(alignments), "float32")
    if len(alignments.shape) != 3:
        raise ValueError(
            "coverage_loss: `alignments` must be a rank-3 tensor [batch, "
            "target_length, source_length], received shape "
            f"{tuple(alignments.shape)}."
        )
    if mask is not None:
        mask = masking.as_bool(ops.convert_to_tensor(mask))
        if len(mask.shape) != 2:
            raise ValueError(
                "coverage_loss: `mask` must be a rank-2 tensor [batch, "
                f"target_length], received shape {tuple(mask.shape)}."
            )
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


@keras.saving.register_keras_serializable(package="attention_layers")
class CoverageLoss(keras.layers.Layer):
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

    def __init__(self, weight=1.0, **kwargs):
        super().__init__(**kwargs)
        try:
            ok = not isinstance(weight, bool) and float(weight) >= 0.0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise input_error(self, "weight", "a float >= 0", repr(weight))
        self.weight = float(weight)
        self.supports_masking = True

    def call(self, alignments, mask=None):
        if len(alignments.shape) != 3:
            raise input_error(
                self,
                "alignments",
                "a rank-3 tensor [batch, target_length, source_length]",
                f"shape {tuple(alignments.shape)}",
            )
        if mask is not None and len(mask.shape) != 2:
            raise input_error(
                self,
                "mask",
                "a rank-2 tensor [batch, target_length]",
                f"shape {tuple(mask.shape)}",
            )
        self.add_loss(self.weight * ops.mean(coverage_loss(alignments, mask)))
        return alignments

    def compute_output_shape(self, alignments_shape, mask_shape=None):
        return alignments_shape

    def get_config(self):
        return {**super().get_config(), "weight": self.weight}
