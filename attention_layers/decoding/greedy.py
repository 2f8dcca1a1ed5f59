"""Greedy decoding inside the graph."""

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


def pick_loop(
    fn_name,
    step_fn,
    initial_state,
    start_ids,
    end_id,
    max_length,
    pick,
    pick_state,
    min_length=0,
):
    """The loop of greedy search and sampling.

    ``pick(logits [B, V] float32, pick_state) -> (ids [B], new_pick_state)``
    chooses the next tokens. The first step runs before the loop, so the
    carried state has exactly the structure the step function returns and the
    alignment buffer can take the alignment's shape. Before ``min_length``
    tokens the end token is taken out of both the logits ``pick`` sees and
    the log-probabilities the score adds (not renormalised: the score stays
    the model's log-probability of the tokens).
    """
    check_positive_int(fn_name, "max_length", max_length)
    min_length = check_min_length(fn_name, min_length, max_length)
    start_ids = as_ids(fn_name, start_ids)
    end_id = ops.cast(end_id, "int32")
    batch = ops.shape(start_ids)[0]
    check_state(fn_name, initial_state, max_length)

    def update(t, logits, state, alignment, carry):
        finished = carry["finished"]
        logits = ops.cast(logits, "float32")
        log_probs = forbid_early_end(
            ops.log_softmax(logits, axis=-1), t, min_length, end_id
        )
        logits = forbid_early_end(logits, t, min_length, end_id)
        ids, new_pick_state = pick(logits, carry["pick_state"])
        ids = ops.where(finished, end_id, ops.cast(ids, "int32"))
        token_lp = ops.take_along_axis(log_probs, ops.expand_dims(ids, 1), axis=1)
        alive = ops.logical_not(finished)
        new = {
            "t": t + 1,
            "ids": ids,
            "state": state,
            "finished": ops.logical_or(finished, ids == end_id),
            "lengths": carry["lengths"] + ops.cast(alive, "int32"),
            "scores": carry["scores"] + ops.where(alive, token_lp[:, 0], 0.0),
            "tokens": write_step(carry["tokens"], t, ids),
            "pick_state": new_pick_state,
        }
        if "alignments" in carry:
            alignment = ops.where(
                ops.expand_dims(alive, 1), ops.cast(alignment, "float32"), 0.0
            )
            new["alignments"] = write_step(carry["alignments"], t, alignment)
        return new

    with without_gradients():
        logits, state, alignment = step_fn(start_ids, initial_state)
        carry = {
            "finished": ops.zeros((batch,), "bool"),
            "lengths": ops.zeros((batch,), "int32"),
            "scores": ops.zeros((batch,), "float32"),
            "tokens": ops.cast(ops.full((batch, max_length), end_id), "int32"),
            "pick_state": pick_state,
        }
        if alignment is not None:
            source = ops.shape(alignment)[-1]
            carry["alignments"] = ops.zeros((batch, max_length, source), "float32")
        t0 = ops.convert_to_tensor(0, "int32")
        carry = update(t0, logits, state, alignment, carry)

        def body(c):
            logits, state, alignment = step_fn(c["ids"], c["state"])
            return update(c["t"], logits, state, alignment, c)

        carry = while_not_done(body, carry, max_length)
    out = {k: carry[k] for k in ("tokens", "lengths", "scores")}
    if "alignments" in carry:
        out["alignments"] = carry["alignments"]
    return out, carry["pick_state"]


def greedy_search(step_fn, initial_state, start_ids, end_id, max_length, min_length=0):
    """Greedy decoding: the most probable token at every step.

    The loop is a ``keras.ops.while_loop`` over static-shaped buffers
    ``[B, max_length]``, written with one-hot ``where`` updates; it stops as
    soon as every sequence has produced ``end_id``. It compiles with XLA
    (``tf.function(jit_compile=True)``, ``jax.jit``) and can sit in an
    exported SavedModel signature.

    Args:
        step_fn: ``step_fn(token_ids [B] int32, state) -> (logits [B, V],
            new_state, alignment [B, S] or None)``; see `rnn_step_fn`.
        initial_state: any nest of tensors with leading dimension B.
        start_ids: ``[B]`` int, the first input tokens (e.g. ``<s>``).
        end_id: the end-of-sequence id (int or scalar tensor).
        max_length: Python int, the most tokens generated (end included).
        min_length: the fewest tokens before the end token (int in ``[0,
            max_length]``, or a scalar int tensor, e.g. a serving input):
            until then the end token cannot be chosen. 0: no minimum.

    Returns:
        A dict: ``tokens [B, max_length]`` int32, the generated tokens (the
        start token excluded), padded with ``end_id`` after the end token;
        ``lengths [B]`` int32, the number of tokens up to and including the
        first ``end_id`` (``max_length`` when it never came); ``scores [B]``
        float32, the sum of the tokens' log-probabilities (end included);
        ``alignments [B, max_length, S]`` float32, the step alignments,
        zeros after the end (only when the step returns alignments).

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from attention_layers.decoding import greedy_search
    >>> table = np.log(np.array(  # next-token probabilities given the token
    ...     [[.1, .2, .7], [.8, .1, .1], [.5, .4, .1]], "float32"))
    >>> def step_fn(ids, state):
    ...     return ops.take(table, ids, axis=0), state, None
    >>> out = greedy_search(step_fn, (), np.array([2, 1]), end_id=0, max_length=3)
    >>> np.asarray(out["tokens"]).tolist(), np.asarray(out["lengths"]).tolist()
    ([[0, 0, 0], [0, 0, 0]], [1, 1])
    >>> np.round(np.asarray(out["scores"]), 3).tolist()
    [-0.693, -0.223]
    >>> out = greedy_search(step_fn, (), np.array([2, 1]), end_id=0, max_length=3,
    ...                     min_length=1)  # at least one token before the end
    >>> np.asarray(out["tokens"]).tolist(), np.asarray(out["lengths"]).tolist()
    ([[1, 0, 0], [1, 0, 0]], [2, 2])
    """

    def pick(logits, pick_state):
        return ops.cast(ops.argmax(logits, axis=-1), "int32"), pick_state

    out, _ = pick_loop(
        "greedy_search",
        step_fn,
        initial_state,
        start_ids,
        end_id,
        max_length,
        pick,
        ops.zeros((), "int32"),
        min_length,
    )
    return out
