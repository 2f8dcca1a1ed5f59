"""What the decoders share: the step-function contract, beam tiling, loop helpers.

A decoder drives a *step function*

``step_fn(token_ids [N] int32, state) -> (logits [N, V], new_state, alignment)``

where ``state`` is any nest of tensors whose leading dimension is ``N`` (the
batch, or batch * beam_width in beam search) and ``alignment`` is ``[N, S]``
(the attention weights over the source used to produce the logits) or None.
The step must keep the structure, shapes and dtypes of ``state``.
"""

import contextlib

import keras
from keras import ops

from attention_layers.masking import NEG_INF


def tile_beams(x, beam_width):
    """Repeats every tensor of a nest ``beam_width`` times along axis 0.

    Row ``b`` of the batch becomes rows ``b * beam_width ... (b + 1) *
    beam_width - 1``: the layout `beam_search` expects for its
    ``initial_state`` and for anything the step function closes over (the
    encoder memory and its mask).

    Args:
        x: a tensor or any nest (list, tuple, dict) of tensors ``[B, ...]``.
        beam_width: a Python int.

    Returns:
        The same nest with tensors ``[B * beam_width, ...]``.

    Example:

    >>> import numpy as np
    >>> from attention_layers.decoding import tile_beams
    >>> tiled = tile_beams({"h": np.array([[1.0], [2.0]])}, 2)
    >>> np.asarray(tiled["h"])[:, 0].tolist()
    [1.0, 1.0, 2.0, 2.0]
    """
    if not isinstance(beam_width, int) or beam_width < 1:
        raise ValueError(
            f"tile_beams: `beam_width` must be a positive Python int, "
            f"received {beam_width!r}."
        )
    return keras.tree.map_structure(
        lambda t: ops.repeat(ops.convert_to_tensor(t), beam_width, axis=0), x
    )


def rnn_step_fn(embedding, cell, projection, memory, memory_mask=None):
    """Builds a step function from an embedding, an attention cell and a projection.

    One step embeds the previous tokens, runs the `AttentionRNNCell` against
    the memory and projects its output to vocabulary logits. The state is the
    cell's list of states (``AttentionDecoder.initial_states(batch)``; with
    ``memory=`` for an attention with coverage, whose coverage state then
    follows each hypothesis like the others).

    Args:
        embedding: a ``keras.layers.Embedding`` (token ids to ``[N, E]``).
        cell: an `AttentionRNNCell`, built.
        projection: a layer from the cell output to logits ``[N, V]``
            (a ``keras.layers.Dense(V)``).
        memory: ``[N, S, D]`` encoder states. For beam search, tile it first
            with `tile_beams`.
        memory_mask: ``[N, S]``, True on real source positions (tiled like
            the memory), or None.

    Returns:
        ``step_fn(token_ids, state) -> (logits, new_state, alignment)``.

    Example:

    >>> import numpy as np, keras
    >>> from attention_layers import BahdanauAttention
    >>> from attention_layers.recurrent import AttentionRNNCell
    >>> from attention_layers.decoding import greedy_search, rnn_step_fn
    >>> cell = AttentionRNNCell(keras.layers.GRUCell(4), BahdanauAttention(units=4))
    >>> memory = np.random.rand(2, 3, 4).astype("float32")
    >>> cell.build((2, 5), None, memory.shape)
    >>> step = rnn_step_fn(keras.layers.Embedding(6, 5), cell,
    ...                    keras.layers.Dense(6), memory)
    >>> out = greedy_search(step, cell.get_initial_state(2), np.array([1, 1]),
    ...                     end_id=2, max_length=3)
    >>> tuple(out["tokens"].shape), tuple(out["alignments"].shape)
    ((2, 3), (2, 3, 3))
    """

    def step_fn(token_ids, state):
        inputs = embedding(token_ids)
        output, new_state, weights = cell(
            inputs, list(state), memory, memory_mask=memory_mask
        )
        return projection(output), list(new_state), weights

    return step_fn


def check_state(fn_name, state, max_length, rows=None):
    """Refuse, where the shapes are static, a state the loop would misread.

    * ``rows`` (beam search): every tensor of the state must have this
      leading size, ``B * beam_width`` (a state tiled with `tile_beams`);
    * the self-attention caches of `transformer_initial_state` must hold
      ``max_length`` positions (one per step; a prompt already in the cache
      needs that many more, which only the caller knows).

    Unknown sizes pass: then keep to these rules yourself.
    """
    for leaf in keras.tree.flatten(state) if rows is not None else ():
        shape = getattr(leaf, "shape", None)
        if not shape:
            continue
        first = shape[0]
        if isinstance(first, int) and first != rows:
            raise ValueError(
                f"{fn_name}: every tensor of `initial_state` must have "
                f"{rows} rows (batch x beam_width: tile it with "
                f"tile_beams(state, beam_width)), received one of shape "
                f"{tuple(shape)}."
            )
    caches = state.get("self_attention_cache") if isinstance(state, dict) else None
    for cache in caches or ():
        size = getattr(cache, "shape", (None,) * 3)[2]
        if isinstance(size, int) and size < max_length:
            raise ValueError(
                f"{fn_name}: the state's self-attention caches hold {size} "
                f"positions, fewer than max_length={max_length} steps write; "
                f"make the state with transformer_initial_state(..., "
                f"max_length={max_length}) or more."
            )


def check_min_length(fn_name, min_length, max_length):
    """``min_length`` as given, or None when it is the Python number 0.

    A Python int must lie in ``[0, max_length]``; a tensor (a serving input)
    is used as it is, a value at or below 0 meaning no minimum.
    """
    if isinstance(min_length, bool):
        raise ValueError(
            f"{fn_name}: `min_length` must be an int or a scalar int tensor, "
            f"received {min_length!r}."
        )
    if isinstance(min_length, int):
        if not 0 <= min_length <= max_length:
            raise ValueError(
                f"{fn_name}: `min_length` must be in [0, max_length={max_length}], "
                f"received {min_length}."
            )
        return None if min_length == 0 else min_length
    return ops.cast(min_length, "int32")


def forbid_early_end(values, t, min_length, end_id):
    """``values [N, V]`` with the ``end_id`` column at ``NEG_INF`` while
    ``t < min_length``: a hypothesis has at least ``min_length`` tokens
    before its end token. Nothing changes with ``min_length`` None."""
    if min_length is None:
        return values
    vocab = ops.shape(values)[-1]
    early = ops.logical_and(t < min_length, ops.arange(vocab) == end_id)
    return ops.where(ops.expand_dims(early, 0), NEG_INF, values)


def as_ids(fn_name, start_ids):
    start_ids = ops.convert_to_tensor(start_ids)
    if len(start_ids.shape) != 1:
        raise ValueError(
            f"{fn_name}: `start_ids` must be a rank-1 tensor [batch], received "
            f"shape {tuple(start_ids.shape)}."
        )
    return ops.cast(start_ids, "int32")


def write_step(buffer, t, values):
    """``buffer[:, t] = values`` as one scatter of ``N`` rows.

    ``buffer`` is ``[N, L, ...]``, ``t`` a scalar int tensor, ``values``
    ``[N, ...]``. A scatter (``TensorScatterUpdate``, a stock op that TF
    Serving has) touches only the ``N`` rows, where a one-hot ``where``
    rewrites the whole buffer at every step.
    """
    n = ops.shape(buffer)[0]
    rows = ops.arange(n, dtype="int32")
    indices = ops.stack([rows, ops.broadcast_to(ops.cast(t, "int32"), (n,))], 1)
    return ops.scatter_update(buffer, indices, ops.cast(values, buffer.dtype))


def while_not_done(body, carry, max_length):
    """Runs ``body`` on the dict ``carry`` until ``t == max_length`` or all
    sequences are finished (``carry["finished"]`` all True)."""

    def cond(c):
        return ops.logical_and(
            c["t"] < max_length, ops.logical_not(ops.all(c["finished"]))
        )

    return ops.while_loop(cond, body, carry)


def without_gradients():
    """A context in which the decoders call the step function.

    Decoding is inference: on PyTorch the loop runs under ``torch.no_grad()``,
    so no autograd graph grows step by step and what the decoders return
    converts with ``np.asarray`` and ``keras.ops.convert_to_numpy``. The
    graph backends (TensorFlow, JAX) are left as they are.
    """
    if keras.backend.backend() != "torch":
        return contextlib.nullcontext()
    import torch

    return torch.no_grad()
