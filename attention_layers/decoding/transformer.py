"""Step functions for Transformer decoders, driven by the in-graph decoders."""

from keras import ops


def _check_blocks(fn_name, blocks):
    blocks = list(blocks)
    if not blocks or not all(getattr(b, "built", False) for b in blocks):
        raise ValueError(
            f"{fn_name}: `blocks` must be a non-empty list of built "
            f"TransformerDecoderBlock layers (call them once), received {blocks!r}."
        )
    return blocks


def transformer_initial_state(
    blocks, batch_size, max_length, memory=None, memory_mask=None
):
    """The initial decoding state of a stack of `TransformerDecoderBlock`.

    The state holds everything that differs between the sequences of a
    batch, so that ``tile_beams(state, beam_width)`` is all beam search
    needs: the step index, an empty self-attention cache per block, and with
    a memory its cross-attention keys and values (projected once, here) and
    its mask.

    Args:
        blocks: the decoder blocks, built (cross-attention ones with a memory
            of the same width as ``memory``).
        batch_size: the number of sequences ``B`` (int or scalar tensor).
        max_length: Python int, the length of the self-attention caches; at
            least the ``max_length`` of the decoding.
        memory: ``[B, S, D]`` encoder outputs, or None for decoder-only
            blocks.
        memory_mask: ``[B, S]``, True on real source positions; None means
            every position.

    Returns:
        A dict: ``"index"`` ``[B]`` int32 (the position of the next token),
        ``"self_attention_cache"`` (one ``[B, 2, max_length, H, key_dim]`` per
        block) and, with a memory, ``"cross_attention_cache"`` (one
        ``[B, 2, S, H, key_dim]`` per block) and ``"memory_mask"`` ``[B, S]``
        bool.

    Example: see `transformer_step_fn`.
    """
    blocks = _check_blocks("transformer_initial_state", blocks)
    state = {
        "index": ops.zeros((batch_size,), "int32"),
        "self_attention_cache": [
            b.self_attention.empty_cache(batch_size, max_length) for b in blocks
        ],
    }
    if memory is not None:
        memory = ops.convert_to_tensor(memory)
        state["cross_attention_cache"] = [
            b.cross_attention.compute_cache(memory) for b in blocks
        ]
        if memory_mask is None:
            memory_mask = ops.ones(ops.shape(memory)[:2], "bool")
        state["memory_mask"] = ops.cast(memory_mask, "bool")
    return state


def transformer_step_fn(embedding, blocks, projection, position_encoding=None):
    """Builds a step function from an embedding, decoder blocks and a projection.

    One step embeds the previous tokens at position ``state["index"]``, adds
    ``position_encoding(x, start_index=index)`` when given, runs every
    `TransformerDecoderBlock` through its caches (one query each, attending
    over the tokens so far and the memory) and projects the last block's
    output to logits. The alignment is the last block's cross-attention
    averaged over heads (None for decoder-only blocks). The state comes from
    `transformer_initial_state`; for beam search tile it with `tile_beams`.
    Blocks built with ``rotary`` rotate each step's query and key at the
    step index (the cache index), so they need no ``position_encoding``.

    Args:
        embedding: a layer from token ids ``[N, 1]`` to ``[N, 1, hidden_dim]``
            (e.g. ``keras.layers.Embedding``).
        blocks: the `TransformerDecoderBlock` layers, in order, built.
        projection: a layer from ``[N, hidden_dim]`` to logits ``[N, V]``
            (add a final ``LayerNormalization`` in front for pre-norm stacks).
        position_encoding: a layer called as ``position_encoding(x,
            start_index=i)`` whose result is added to the embeddings
            (`SinusoidalPositionEncoding`, `PositionEmbedding`), or None.

    Returns:
        ``step_fn(token_ids, state) -> (logits, new_state, alignment)``.

    Example:

    >>> import numpy as np, keras
    >>> from attention_layers import TransformerDecoderBlock
    >>> from attention_layers.decoding import (
    ...     greedy_search, transformer_initial_state, transformer_step_fn)
    >>> memory = np.random.rand(2, 5, 8).astype("float32")
    >>> block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    >>> embedding, projection = keras.layers.Embedding(7, 8), keras.layers.Dense(7)
    >>> _ = block(embedding(np.zeros((2, 1), "int32")), memory)  # build
    >>> step = transformer_step_fn(embedding, [block], projection)
    >>> state = transformer_initial_state([block], 2, 4, memory)
    >>> out = greedy_search(step, state, np.array([1, 1]), end_id=2, max_length=4)
    >>> tuple(out["tokens"].shape), tuple(out["alignments"].shape)
    ((2, 4), (2, 4, 5))
    """
    blocks = _check_blocks("transformer_step_fn", blocks)

    def step_fn(token_ids, state):
        index = state["index"][0]
        x = embedding(ops.expand_dims(token_ids, 1))
        if position_encoding is not None:
            x = x + ops.cast(position_encoding(x, start_index=index), x.dtype)
        cross = "cross_attention_cache" in state
        new_caches, alignment = [], None
        for i, block in enumerate(blocks):
            kwargs = {}
            if cross:
                kwargs = {
                    "cross_attention_cache": state["cross_attention_cache"][i],
                    "encoder_padding_mask": state["memory_mask"],
                }
            last = i == len(blocks) - 1
            out = block(
                x,
                self_attention_cache=state["self_attention_cache"][i],
                self_attention_cache_update_index=index,
                return_attention_scores=cross and last,
                **kwargs,
            )
            if cross and last:
                x, scores, cache, _ = out
                alignment = scores["alignment"][:, 0]
            else:
                x, cache, _ = out
            new_caches.append(cache)
        new_state = {
            **state,
            "index": state["index"] + 1,
            "self_attention_cache": new_caches,
        }
        return projection(x[:, 0]), new_state, alignment

    return step_fn
