"""Random sampling inside the graph: temperature, top-k and nucleus (top-p)."""

import keras
from keras import ops

from attention_layers.base import check_positive_int
from attention_layers.decoding.greedy import pick_loop
from attention_layers.masking import NEG_INF


def filter_logits(logits, temperature=1.0, top_k=None, top_p=None):
    """Divides by the temperature, then keeps the top-k, then the nucleus.

    Args:
        logits: ``[N, V]``.
        temperature: positive float or scalar tensor.
        top_k: Python int or None: keep the ``top_k`` largest logits (ties
            with the k-th are kept).
        top_p: float in (0, 1] or None: keep the smallest set of most
            probable tokens whose probability (after temperature and top-k)
            reaches ``top_p``; the most probable token is always kept.

    Returns:
        ``[N, V]`` float32 logits, the removed ones set to -1e9.

    Example:

    >>> import numpy as np
    >>> from attention_layers.decoding.sampling import filter_logits
    >>> logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], "float32"))
    >>> kept = np.asarray(filter_logits(logits, top_p=0.7)) > -1e8
    >>> kept.tolist()
    [[True, True, False, False]]
    """
    logits = ops.cast(logits, "float32") / ops.cast(temperature, "float32")
    if top_k is not None:
        kth = ops.top_k(logits, top_k)[0][:, -1:]
        logits = ops.where(logits < kth, NEG_INF, logits)
    if top_p is not None:
        ordered = ops.flip(ops.sort(logits, axis=-1), axis=-1)
        probs = ops.softmax(ordered, axis=-1)
        before = ops.cumsum(probs, axis=-1) - probs  # mass of the better ones
        keep = before < ops.cast(top_p, "float32")
        keep = ops.logical_or(keep, ops.arange(ops.shape(ordered)[-1]) == 0)
        threshold = ops.min(ops.where(keep, ordered, -NEG_INF), axis=-1, keepdims=True)
        logits = ops.where(logits < threshold, NEG_INF, logits)
    return logits


def sample(
    step_fn,
    initial_state,
    start_ids,
    end_id,
    max_length,
    temperature=1.0,
    top_k=None,
    top_p=None,
    seed=None,
    min_length=0,
):
    """Ancestral sampling, with temperature, top-k and nucleus filtering.

    Each step draws the next token from ``softmax(filter(logits))`` with
    ``keras.random.categorical`` (see `filter_logits`). The seed generator's
    state rides in the loop (through a ``keras.StatelessScope``), so the
    loop is a pure ``keras.ops.while_loop`` that compiles with XLA; the
    generator is advanced once the loop is done.

    Args:
        step_fn: ``step_fn(token_ids [B] int32, state) -> (logits [B, V],
            new_state, alignment [B, S] or None)``; see `rnn_step_fn`.
        initial_state: any nest of tensors with leading dimension B.
        start_ids: ``[B]`` int, the first input tokens.
        end_id: the end-of-sequence id.
        max_length: Python int, the most tokens generated (end included).
        temperature: positive float or scalar tensor; below 1 sharpens,
            above 1 flattens.
        top_k: Python int or None, sample among the k best tokens only.
        top_p: float or None, sample within the nucleus of mass ``top_p``.
        seed: an int, None, or a ``keras.random.SeedGenerator``. Inside
            ``tf.function`` or ``jax.jit`` pass a ``SeedGenerator`` created
            outside (as for every Keras random op): an int or None creates a
            new generator (a variable) at each call.
        min_length: the fewest tokens before the end token (see
            `greedy_search`).

    Returns:
        The dict of `greedy_search` (``tokens``, ``lengths``, ``scores``,
        ``alignments``); ``scores`` are the model's log-probabilities of the
        drawn tokens (before temperature and filtering).

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from attention_layers.decoding import sample
    >>> table = np.log(np.array([[.1, .2, .7], [.8, .1, .1], [.5, .4, .1]],
    ...                         "float32"))
    >>> def step_fn(ids, state):
    ...     return ops.take(table, ids, axis=0), state, None
    >>> out = sample(step_fn, (), np.array([2, 1]), end_id=0, max_length=3,
    ...              top_k=1, seed=1)
    >>> np.asarray(out["tokens"]).tolist()
    [[0, 0, 0], [0, 0, 0]]

    References:
        Fan, Lewis, Dauphin. Hierarchical Neural Story Generation. ACL 2018
        (top-k). Holtzman, Buys, Du, Forbes, Choi. The Curious Case of Neural
        Text Degeneration. ICLR 2020 (nucleus sampling).
    """
    if top_k is not None:
        check_positive_int("sample", "top_k", top_k)
    if isinstance(top_p, (int, float)) and not 0.0 < top_p <= 1.0:
        raise ValueError(f"sample: `top_p` must be in (0, 1], received {top_p!r}.")
    if isinstance(temperature, (int, float)) and temperature <= 0:
        raise ValueError(
            f"sample: `temperature` must be positive, received {temperature!r}."
        )
    if isinstance(seed, keras.random.SeedGenerator):
        generator = seed
    else:
        generator = keras.random.SeedGenerator(seed)

    def pick(logits, seed_state):
        filtered = filter_logits(logits, temperature, top_k, top_p)
        with keras.StatelessScope(
            state_mapping=[(generator.state, seed_state)]
        ) as scope:
            ids = keras.random.categorical(filtered, 1, dtype="int32", seed=generator)
            new_seed_state = scope.get_current_value(generator.state)
        return ids[:, 0], new_seed_state

    out, seed_state = pick_loop(
        "sample",
        step_fn,
        initial_state,
        start_ids,
        end_id,
        max_length,
        pick,
        ops.convert_to_tensor(generator.state.value),
        min_length,
    )
    generator.state.assign(seed_state)
    return out
