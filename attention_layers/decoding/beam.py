"""Beam search inside the graph, with GNMT's length and coverage penalties."""

import keras
from keras import ops

from attention_layers.base import check_positive_int
from attention_layers.decoding.common import (
    as_ids,
    check_min_length,
    check_state,
    forbid_early_end,
    while_not_done,
    without_gradients,
    write_step,
)
from attention_layers.masking import NEG_INF


def gnmt_length_penalty(lengths, alpha):
    """``lp(Y) = (5 + |Y|)^alpha / 6^alpha`` (Wu et al. 2016).

    Args:
        lengths: int tensor, ``|Y|`` (end token included).
        alpha: float or scalar tensor; 0 gives 1 (no normalisation).

    Returns:
        float32 tensor shaped like ``lengths``.

    Example:

    >>> import numpy as np
    >>> from attention_layers.decoding import gnmt_length_penalty
    >>> float(gnmt_length_penalty(np.array(1), 1.0))
    1.0
    """
    lengths = ops.cast(lengths, "float32")
    return ops.power((5.0 + lengths) / 6.0, ops.cast(alpha, "float32"))


def gnmt_coverage_penalty(coverage, beta):
    """``cp(X; Y) = beta * sum_i log(min(sum_j p_ij, 1))`` (Wu et al. 2016).

    Source positions that never received any attention (``sum_j p_ij == 0``,
    the padding of a masked source) are left out of the sum instead of
    giving ``log(0) = -inf``.

    Args:
        coverage: ``[..., S]``, the attention summed over the target steps.
        beta: float or scalar tensor.

    Returns:
        float32 tensor ``[...]``.

    Example:

    >>> import numpy as np
    >>> from attention_layers.decoding import gnmt_coverage_penalty
    >>> cp = gnmt_coverage_penalty(np.array([0.5, 2.0, 0.0]), 1.0)
    >>> round(float(cp), 4)  # log(0.5) + log(1) + (padding left out)
    -0.6931
    """
    coverage = ops.cast(coverage, "float32")
    clipped = ops.where(coverage > 0, ops.minimum(coverage, 1.0), 1.0)
    return ops.cast(beta, "float32") * ops.sum(ops.log(clipped), axis=-1)


def _unflatten(x, beam_width):
    """``[B * K, ...]`` to ``[B, K, ...]``."""
    shape = ops.shape(x)
    return ops.reshape(x, (-1, beam_width) + tuple(shape[1:]))


def _is_zero(value):
    return isinstance(value, (int, float)) and value == 0


def _as_penalty(value):
    """A penalty as float32, or None for the Python number 0 (left out of the
    graph)."""
    return None if _is_zero(value) else ops.cast(value, "float32")


def _trace_back(parents):
    """Row of every step on each final hypothesis' path, ``[N, L]`` int32.

    ``parents[n, t]`` is the flat row at step ``t - 1`` that row ``n`` of step
    ``t`` extended; the final rows are the hypotheses themselves.
    """
    length = parents.shape[1]
    final = ops.arange(ops.shape(parents)[0], dtype="int32")

    def body(i, carry):
        row, rows = carry
        t = length - 1 - i
        rows = write_step(rows, t, row)
        return ops.take(ops.take(parents, t, axis=1), row, axis=0), rows

    _, rows = ops.fori_loop(0, length, body, (final, ops.zeros_like(parents)))
    return rows


def _take_rows(buffer, rows):
    """``out[n, t] = buffer[rows[n, t], t]`` for a ``[N, L, ...]`` buffer."""
    length = buffer.shape[1]
    flat = ops.reshape(buffer, (-1,) + tuple(ops.shape(buffer)[2:]))
    index = rows * length + ops.arange(length, dtype="int32")
    taken = ops.take(flat, ops.reshape(index, (-1,)), axis=0)
    return ops.reshape(taken, ops.shape(buffer))


def _check_alignment(fn_name, alignment, coverage_penalty):
    """A coverage penalty given as a Python number needs alignments."""
    if alignment is None:
        if isinstance(coverage_penalty, (int, float)) and coverage_penalty != 0:
            raise ValueError(
                f"{fn_name}: `coverage_penalty` needs a step function that "
                "returns alignments; this one returns None."
            )


def _extensions(logits, t, finished, min_length, end_id):
    """``[N, V]`` float32 log-probabilities of every one-token extension.

    A finished hypothesis only extends with ``end_id``, at zero cost.
    """
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    log_probs = forbid_early_end(log_probs, t, min_length, end_id)
    vocab = ops.shape(log_probs)[-1]
    end_only = ops.where(ops.arange(vocab) == end_id, 0.0, NEG_INF)
    return ops.where(ops.expand_dims(finished, 1), end_only, log_probs)


def _best_first_paths(carry, beam_width):
    """The final hypotheses: paths followed back, ``[B, K, ...]`` outputs."""
    rows = _trace_back(carry["parents"])
    out = {key: carry[key] for key in ("scores", "log_probs", "lengths")}
    out["tokens"] = _take_rows(carry["tokens"], rows)
    if "alignments" in carry:
        out["alignments"] = _take_rows(carry["alignments"], rows)
    return {key: _unflatten(value, beam_width) for key, value in out.items()}


class _Beams:
    """The settings of one search and its step: extend, score, keep the best.

    The loop state is a dict of flat ``[N = B * K, ...]`` tensors (see
    `initial_carry`); `update` takes one step's ``logits``, ``state`` and
    ``alignment`` and returns the next one.
    """

    def __init__(
        self, k, batch, end_id, min_length, length_penalty, coverage_penalty, num_beams
    ):
        self.k = k
        self.batch = batch
        self.end_id = end_id
        self.min_length = min_length
        # Flat index of the first beam of each batch entry, [B, 1].
        self.offsets = ops.expand_dims(ops.arange(batch, dtype="int32") * k, 1)
        self.live = None
        if num_beams is not None:  # [1, K]: True for the ranks that survive
            self.live = ops.expand_dims(ops.arange(k, dtype="int32"), 0) < ops.cast(
                num_beams, "int32"
            )
        self.alpha = _as_penalty(length_penalty)
        self.beta = _as_penalty(coverage_penalty)

    def initial_carry(self, n, max_length, alignment):
        """The loop state before the first step (``alignment``: its shape)."""
        # Only the first beam of each entry is live at the start, so the first
        # step does not pick the same token k times.
        first_beam = ops.tile(ops.arange(self.k) == 0, (self.batch,))
        carry = {
            "finished": ops.zeros((n,), "bool"),
            "lengths": ops.zeros((n,), "int32"),
            "log_probs": ops.where(first_beam, 0.0, NEG_INF),
            "scores": ops.zeros((n,), "float32"),
            "tokens": ops.cast(ops.full((n, max_length), self.end_id), "int32"),
            # Steps the loop never reaches point every row at itself.
            "parents": ops.tile(
                ops.expand_dims(ops.arange(n, dtype="int32"), 1), (1, max_length)
            ),
        }
        if alignment is not None:
            source = ops.shape(alignment)[-1]
            carry["alignments"] = ops.zeros((n, max_length, source), "float32")
            if self.beta is not None:
                carry["coverage"] = ops.zeros((n, source), "float32")
        return carry

    def update(self, t, logits, state, alignment, carry):
        """One step: the ``k`` best extensions of each entry, state reordered."""
        finished = carry["finished"]
        alive = ops.logical_not(finished)
        log_probs = _extensions(logits, t, finished, self.min_length, self.end_id)
        vocab = ops.shape(log_probs)[-1]
        total = ops.expand_dims(carry["log_probs"], 1) + log_probs  # [N, V]
        lengths = carry["lengths"] + ops.cast(alive, "int32")
        if "alignments" in carry:
            alignment = ops.where(
                ops.expand_dims(alive, 1), ops.cast(alignment, "float32"), 0.0
            )
        score, coverage = self._score(total, lengths, alignment, carry)
        penalised = self.alpha is not None or coverage is not None
        best, total, index = self._top_k(score, total, vocab, penalised)
        parent = ops.reshape(index // vocab + self.offsets, (-1,))  # [N], flat
        ids = ops.reshape(index % vocab, (-1,))

        def gather(x):
            return ops.take(x, parent, axis=0)

        finished = ops.logical_or(gather(finished), ids == self.end_id)
        if self.live is not None:  # the ranks past num_beams end here
            dead = ops.logical_and(ops.logical_not(self.live), index >= 0)  # [B, K]
            finished = ops.logical_or(finished, ops.reshape(dead, (-1,)))
        new = {
            "t": t + 1,
            "ids": ids,
            "state": keras.tree.map_structure(gather, state),
            "finished": finished,
            "lengths": gather(lengths),
            "log_probs": ops.reshape(total, (-1,)),
            "scores": ops.reshape(best, (-1,)),
            "tokens": write_step(carry["tokens"], t, ids),
            "parents": write_step(carry["parents"], t, parent),
        }
        if coverage is not None:
            new["coverage"] = gather(coverage)
        if "alignments" in carry:
            new["alignments"] = write_step(carry["alignments"], t, gather(alignment))
        return new

    def _score(self, total, lengths, alignment, carry):
        """``[N, V]`` scores ``total / lp + cp``, and the coverage (or None)."""
        score = total
        if self.alpha is not None:
            penalty = gnmt_length_penalty(lengths, self.alpha)
            score = score / ops.expand_dims(penalty, 1)
        coverage = None
        if "coverage" in carry:
            coverage = carry["coverage"] + alignment
            cp = gnmt_coverage_penalty(coverage, self.beta)
            score = score + ops.expand_dims(cp, 1)
        return score, coverage

    def _top_k(self, score, total, vocab, penalised):
        """The ``k`` best candidates of each entry, ``[B, K]``: their score,
        log-probability and index into the entry's ``k * vocab`` candidates."""
        k = self.k
        best, index = ops.top_k(ops.reshape(score, (-1, k * vocab)), k)
        index = ops.cast(index, "int32")
        if penalised:
            total = ops.take_along_axis(ops.reshape(total, (-1, k * vocab)), index, 1)
        else:  # the score is the log-probability
            total = best
        if self.live is not None:  # candidates ranked past num_beams die here
            best = ops.where(self.live, best, NEG_INF)
            total = ops.where(self.live, total, NEG_INF)
        return best, total, index


def beam_search(
    step_fn,
    initial_state,
    start_ids,
    end_id,
    max_length,
    beam_width,
    length_penalty=0.0,
    coverage_penalty=0.0,
    num_beams=None,
    min_length=0,
):
    """Beam search with GNMT's length and coverage penalties, n-best output.

    At every step each of the ``beam_width`` hypotheses of a batch entry is
    extended by every token, and the ``beam_width`` best candidates are kept
    by the score ``s(Y, X) = log P(Y|X) / lp(Y) + cp(X; Y)`` (see
    `gnmt_length_penalty`, `gnmt_coverage_penalty`; ``|Y|`` counts the end
    token, the coverage sums the step alignments of the hypothesis). A
    finished hypothesis stays in the beam and only extends with ``end_id`` at
    zero cost (its score no longer changes), so it competes with the live
    ones; the loop stops when every hypothesis is finished, or after
    ``max_length`` steps. The state and the coverage are reordered with the
    beams at every step; the tokens and alignments are not: each step writes
    its row of every buffer once, with the beam it came from (a back-pointer),
    and the paths are followed back and gathered once after the loop.

    All the loop state has static shapes (``[B * beam_width, max_length]``
    buffers), so this compiles with XLA and can be served from a SavedModel
    signature; the penalties may be tensors given at serving time.

    Args:
        step_fn: ``step_fn(token_ids [N] int32, state) -> (logits [N, V],
            new_state, alignment [N, S] or None)`` with ``N = B *
            beam_width``; see `rnn_step_fn`. Anything it closes over (the
            encoder memory) must be tiled with `tile_beams`.
        initial_state: a nest of tensors with leading dimension
            ``B * beam_width``, tiled with `tile_beams`.
        start_ids: ``[B]`` int, the first input token of each batch entry
            (not tiled).
        end_id: the end-of-sequence id.
        max_length: Python int, the most tokens generated (end included).
        beam_width: Python int (static shapes).
        length_penalty: ``alpha``, float or scalar tensor (0: none).
        coverage_penalty: ``beta``, float or scalar tensor (0: none). Needs a
            step function that returns alignments; with a Python number
            other than 0 and no alignments this raises a ``ValueError``, a
            tensor is then ignored.
        num_beams: None, or an int scalar tensor ``1 <= num_beams <=
            beam_width`` chosen at run time (a serving input): only the
            ``num_beams`` best candidates survive each step, which is beam
            search of that width inside buffers of ``beam_width``. The
            hypotheses past ``num_beams`` come last with score ``-1e9``.
        min_length: the fewest tokens before the end token (int in ``[0,
            max_length]``, or a scalar int tensor chosen at run time): until
            then no hypothesis can end (summarization decodes with one, See
            et al. 2017). Scores stay the model's log-probabilities (the
            end token's mass is not spread over the others). 0: no minimum.

    Returns:
        A dict, hypotheses sorted best first: ``tokens [B, K, max_length]``
        int32 padded with ``end_id``; ``scores [B, K]`` float32, the
        penalised score; ``log_probs [B, K]`` float32, ``log P(Y|X)``;
        ``lengths [B, K]`` int32, end token included (``max_length`` when
        unfinished); ``alignments [B, K, max_length, S]`` float32, the
        alignment behind each output token, zeros after the end (only when
        the step returns alignments).

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from attention_layers.decoding import beam_search
    >>> table = np.log(np.array(  # token 0 is the end, 3 the start
    ...     [[1., 0., 0., 0.], [.3, .3, .4, 0.], [.9, .1, 0., 0.],
    ...      [0., .5, .4, .1]], "float32") + 1e-9)
    >>> def step_fn(ids, state):
    ...     return ops.take(table, ids, axis=0), state, None
    >>> out = beam_search(step_fn, (), np.array([3]), end_id=0, max_length=3,
    ...                   beam_width=2)
    >>> np.asarray(out["tokens"])[0].tolist()  # greedy: 1, 2, 0
    [[2, 0, 0], [1, 2, 0]]

    References:
        Wu et al. Google's Neural Machine Translation System: Bridging the
        Gap between Human and Machine Translation. arXiv:1609.08144, 2016.
    """
    fn_name = "beam_search"
    check_positive_int(fn_name, "max_length", max_length)
    check_positive_int(fn_name, "beam_width", beam_width)
    min_length = check_min_length(fn_name, min_length, max_length)
    start_ids = as_ids(fn_name, start_ids)
    static_batch = start_ids.shape[0]
    rows = static_batch * beam_width if isinstance(static_batch, int) else None
    check_state(fn_name, initial_state, max_length, rows)
    beams = _Beams(
        beam_width,
        ops.shape(start_ids)[0],
        ops.cast(end_id, "int32"),
        min_length,
        length_penalty,
        coverage_penalty,
        num_beams,
    )
    ids = ops.repeat(start_ids, beam_width, axis=0)
    with without_gradients():
        logits, state, alignment = step_fn(ids, initial_state)
        _check_alignment(fn_name, alignment, coverage_penalty)
        carry = beams.initial_carry(ops.shape(ids)[0], max_length, alignment)
        carry = beams.update(
            ops.convert_to_tensor(0, "int32"), logits, state, alignment, carry
        )

        def body(c):
            logits, state, alignment = step_fn(c["ids"], c["state"])
            return beams.update(c["t"], logits, state, alignment, c)

        carry = while_not_done(body, carry, max_length)
    return _best_first_paths(carry, beam_width)
