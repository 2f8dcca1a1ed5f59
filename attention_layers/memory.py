"""Multi-hop memory attention: end-to-end memory networks (Sukhbaatar et al. 2015).

A story of ``M`` sentences of ``W`` word ids is written into memory twice,
as input vectors ``m_i`` (what the question is compared with) and output
vectors ``c_i`` (what is read out); the question ``u`` reads the memory ``K``
times ("hops"), each hop adding what it read to ``u``, and the last ``u``
predicts a one-word answer. Id 0 is padding everywhere.
"""

import keras
import numpy as np
from keras import ops

from attention_layers import masking
from attention_layers.base import (
    check_mask_shape,
    check_positive_int,
    concrete_value,
    fresh_initializer,
    input_error,
    score_dtype,
    static_shape,
)

WEIGHT_TYING = ("adjacent", "layerwise")


POSITION_ENCODINGS = ("paper", "reference")


def position_encoding(word_mask, embed_dim, dtype="float32", formula="paper"):
    """The position encoding ``l_kj`` of Sukhbaatar et al. (section 4.1).

    For the ``j``-th real word (1-based) of a sentence of ``J`` real words
    and the ``k``-th of ``d`` embedding dimensions (1-based):

    * ``formula="paper"``: ``l_kj = (1 - j/J) - (k/d) (1 - 2j/J)``, the
      paper's formula;
    * ``formula="reference"``:
      ``l_kj = 1 + 4 (k - (d+1)/2) (j - (J+1)/2) / (d J)``, the formula of
      the authors' released code (MemN2N-babi-matlab), whose results are
      the paper's table. It is about twice the paper's (centred on 1,
      not on 1/2). The code takes ``J`` as the data's longest sentence; here,
      as for the paper's formula, it is each sentence's own length.

    ``j`` counts the real words only and ``J`` is their number, so padding
    never shifts the encoding; padded words get 0.

    Args:
        word_mask: ``[..., W]`` bool (or 0/1), True on real words.
        embed_dim: ``d``.
        dtype: the dtype of the result.
        formula: ``"paper"`` or ``"reference"``.

    Returns:
        ``[..., W, d]`` weights, 0 on padded words.

    Example:

    >>> import numpy as np
    >>> l = position_encoding(np.array([True, True, False]), 2)
    >>> np.asarray(l).round(3).tolist()  # J = 2; j = 1, 2; k = 1, 2
    [[0.5, 0.5], [0.5, 1.0], [0.0, 0.0]]
    >>> l = position_encoding(np.array([True, True, False]), 2, formula="reference")
    >>> np.asarray(l).round(3).tolist()
    [[1.25, 0.75], [0.75, 1.25], [0.0, 0.0]]
    """
    if formula not in POSITION_ENCODINGS:
        raise ValueError(
            f"`formula` must be one of {POSITION_ENCODINGS}, received {formula!r}"
        )
    mask = ops.cast(masking.as_bool(word_mask), dtype)
    j = ops.cumsum(mask, axis=-1)
    length = ops.maximum(ops.sum(mask, axis=-1, keepdims=True), 1.0)
    k = ops.cast(ops.arange(1, embed_dim + 1), dtype)
    d = float(embed_dim)
    if formula == "paper":
        frac = ops.expand_dims(j / length, -1)  # j / J, [..., W, 1]
        weights = (1.0 - frac) - (k / d) * (1.0 - 2.0 * frac)
    else:
        centred = ops.expand_dims((j - (length + 1.0) / 2.0) / length, -1)
        weights = 1.0 + 4.0 * (k - (d + 1.0) / 2.0) * centred / d
    return weights * ops.expand_dims(mask, -1)


def temporal_weights(word_mask, embed_dim, dtype="float32"):
    """The weight of a memory's temporal encoding under the reference code's
    position encoding: ``[..., d]``, one row per sentence.

    The authors' code writes the time index as one more word at the end of
    each sentence, so the position encoding weighs it too: it is word
    ``j = J`` of ``J = n + 1`` words, for a sentence of ``n`` real words,
    and ``1 + 4 (k - (d+1)/2)(j - (J+1)/2) / (d J)`` becomes
    ``1 + 2 (k - (d+1)/2) n / (d (n + 1))``, from about ``1/(n+1)`` on the
    first dimension to about ``2 - 1/(n+1)`` on the last. (The code's ``J``
    is the data's longest sentence plus one; here, as for the words, it is
    the sentence's own.) The paper's formula has no such weight: its
    ``T_A(i)`` is added as it is.

    Args:
        word_mask: ``[..., W]`` bool (or 0/1), True on a sentence's real words.
        embed_dim: ``d``.
        dtype: the dtype of the result.

    Example:

    >>> import numpy as np
    >>> w = temporal_weights(np.array([[True, True, True], [True, False, False]]), 2)
    >>> np.asarray(w).round(3).tolist()  # n = 3, then n = 1; k = 1, 2
    [[0.625, 1.375], [0.75, 1.25]]
    """
    n = ops.sum(ops.cast(masking.as_bool(word_mask), dtype), axis=-1, keepdims=True)
    k = ops.cast(ops.arange(1, embed_dim + 1), dtype)
    d = float(embed_dim)
    return 1.0 + 2.0 * (k - (d + 1.0) / 2.0) * n / (d * (n + 1.0))


@keras.saving.register_keras_serializable(package="attention_layers")
class MemoryNetwork(keras.layers.Layer):
    """End-to-end memory network: multi-hop attention over a story's sentences.

    The story ``x`` ``[B, M, W]`` (``M`` sentences of ``W`` word ids) and
    the question ``q`` ``[B, W_q]`` are word ids, id 0 being padding. Each
    sentence ``i`` becomes a memory vector and an output vector per hop
    ``k = 1..K`` (section 2.1 and 4.1 of the paper):

    ``m_i = sum_j l_j * A^k x_ij + T_A^k(i)``,
    ``c_i = sum_j l_j * C^k x_ij + T_C^k(i)``,

    the question ``u^1 = sum_j l_j * B q_j``, and each hop reads the memory:

    ``p = softmax(u^k . m_i)``, ``o = sum_i p_i c_i``,
    ``u^{k+1} = u^k + o`` (``H u^k + o`` under layer-wise tying).

    The answer logits are ``W u^{K+1}``, ``[B, vocab_size]``; with
    ``readout_units=h > 0``, ``W (u + V relu(U u + b))`` for ``u = u^{K+1}``
    (not in the paper; see below).

    * ``l_j`` is the position encoding ``l_kj = (1 - j/J) - (k/d)(1 - 2j/J)``
      (`position_encoding`), with ``J`` the number of real words of that
      sentence; ``position_encoding="reference"`` takes the formula of the
      authors' code instead, about twice the paper's, and weighs the
      temporal encodings as that code does (`temporal_weights`: it writes
      the time index as one more word of the sentence); with SGD at the
      code's rate it trained our bAbI-style task 3 at 1k much better (see
      the QA pipeline's page). With ``position_encoding=False``
      it is 1 (a bag of words). Padded words count for nothing.
    * ``T_A(i)``, ``T_C(i)`` are learned temporal encodings, rows of
      ``[max_memories, embed_dim]`` matrices. The story is in chronological
      order (oldest sentence first) and row 0 belongs to the **most recent**
      real sentence, the one just before the question; row ``r`` to the
      sentence with ``r`` real sentences after it. This is the paper's
      reverse indexing (``x_1`` is the last sentence), and padded sentences,
      wherever they are, shift nothing.
    * A memory is padding when all its words are padding (or where
      ``story_mask`` is False); the softmax is over the real memories only,
      in float32 under any dtype policy. A story without any real memory
      gets zero attention and ``o = 0`` (no NaN).
    * ``weight_tying="adjacent"`` (section 2.2): ``A^{k+1} = C^k`` (and
      ``T_A^{k+1} = T_C^k``), ``B = A^1`` and ``W^T = C^K``: ``K + 1``
      embedding tables in all, the answer through the transpose of the last.
      ``"layerwise"``: ``A^1 = ... = A^K``, ``C^1 = ... = C^K`` (one
      ``T_A``, one ``T_C``), a separate question embedding ``B``, a linear
      map ``H`` between hops and a separate answer matrix ``W``.
    * ``linear_start=True`` (section 4.2, "linear start"): the layer starts
      with every hop's softmax removed, ``p_i = u . m_i`` on the real
      memories (0 on padding), which trains past the plateau where the
      attention is still uniform; `set_linear_start` ``(False)`` puts the
      softmax back (the paper does so when the validation loss stops
      falling). The switch is a non-trainable weight, ``linear``, saved with
      the others.
    * ``temporal_noise=r`` (section 4.1, "random noise"): in training, an
      empty memory is inserted after each real one with probability ``r``,
      which shifts the older sentences' temporal rows (clipped to the last
      row) and keeps ``T_A``, ``T_C`` from learning positions by heart.
      Nothing changes at inference.
    * ``readout_units=h`` (not in the paper) adds a ReLU layer of ``h`` units
      beside the linear readout, as a residual: ``U`` ``[d, h]`` with bias
      ``b``, ``V`` ``[h, d]`` starting at zero, so training starts from the
      paper's readout. A linear readout of ``u = u^1 + o^1 + ... + o^K``
      cannot compare what the question names with what the hops read (bAbI's
      yes/no questions: is the place read the place asked?); a hidden layer
      can.

    Args:
        vocab_size: ``V``, the number of word ids (id 0 is padding).
        embed_dim: ``d``, the size of the memory vectors.
        max_memories: the most sentences a story may have (rows of the
            temporal encodings).
        max_words: the most words a sentence or a question may have.
        hops: ``K``, the number of memory reads.
        position_encoding: weight words by ``l_j``: ``"paper"`` (or True),
            ``"reference"``, or False (a bag of words).
        temporal_encoding: add ``T_A(i)``, ``T_C(i)``.
        weight_tying: ``"adjacent"`` or ``"layerwise"``.
        embeddings_initializer: initializer of the embedding tables and the
            temporal encodings (the paper: a Gaussian with ``sigma = 0.1``).
        kernel_initializer: initializer of ``H`` and ``W`` (layer-wise only).
        linear_start: build the ``linear`` switch, on at first (see above).
        temporal_noise: the share ``r`` in ``[0, 1)`` of empty memories
            inserted in training (the paper: 0.1); needs the temporal
            encoding.
        seed: the seed of that noise.
        readout_units: ``h``, the hidden units of the residual readout; 0 (the
            default) keeps the paper's linear one.
        **kwargs: standard ``keras.layers.Layer`` arguments (``name``, ``dtype``).

    Call arguments:
        story: ``[B, M, W]`` int word ids, ``M <= max_memories``,
            ``W <= max_words``.
        question: ``[B, W_q]`` int word ids, ``W_q <= max_words``.
        story_mask: optional ``[B, M]``, True on real sentences; by default
            a sentence is real when one of its ids is not 0.
        return_attention: also return the attention of every hop.

    Returns:
        Answer logits ``[B, vocab_size]`` in the compute dtype, and with
        ``return_attention=True`` the tuple ``(logits, attention)``,
        ``attention`` ``[B, hops, M]`` (0 on padded sentences).

    Example:

    >>> import numpy as np
    >>> import attention_layers as al
    >>> story = np.array([[[1, 2, 3, 0], [4, 2, 5, 0], [0, 0, 0, 0]]])
    >>> question = np.array([[6, 1, 0, 0]])
    >>> layer = al.MemoryNetwork(vocab_size=8, embed_dim=4, max_memories=3,
    ...                          max_words=4, hops=2)
    >>> logits, attention = layer(story, question, return_attention=True)
    >>> tuple(logits.shape), tuple(attention.shape)
    ((1, 8), (1, 2, 3))
    >>> np.asarray(attention).sum(-1).round(4).tolist()  # per hop
    [[1.0, 1.0]]
    >>> float(np.asarray(attention)[0, :, 2].max())  # the padded sentence
    0.0
    >>> len(layer.trainable_weights)  # adjacent: 3 word tables, 3 temporal
    6

    References:
        Sukhbaatar, Szlam, Weston, Fergus. End-To-End Memory Networks.
        NeurIPS 2015, sections 2 and 4.1. https://arxiv.org/abs/1503.08895
    """

    def __init__(
        self,
        vocab_size,
        embed_dim,
        max_memories,
        max_words,
        hops=3,
        position_encoding=True,
        temporal_encoding=True,
        weight_tying="adjacent",
        embeddings_initializer=None,
        kernel_initializer="glorot_uniform",
        linear_start=False,
        temporal_noise=0.0,
        seed=None,
        readout_units=0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = check_positive_int(self, "vocab_size", vocab_size)
        self.embed_dim = check_positive_int(self, "embed_dim", embed_dim)
        self.max_memories = check_positive_int(self, "max_memories", max_memories)
        self.max_words = check_positive_int(self, "max_words", max_words)
        self.hops = check_positive_int(self, "hops", hops)
        if isinstance(readout_units, bool) or readout_units != 0:
            check_positive_int(
                self, "readout_units", readout_units, meaning="(or 0: linear)"
            )
        self.readout_units = int(readout_units)
        for name, value in (
            ("temporal_encoding", temporal_encoding),
            ("linear_start", linear_start),
        ):
            if not isinstance(value, (bool, np.bool_)):
                raise input_error(self, name, "True or False", repr(value))
        if isinstance(position_encoding, (bool, np.bool_)):
            position_encoding = "paper" if position_encoding else False
        elif position_encoding not in POSITION_ENCODINGS:
            raise input_error(
                self,
                "position_encoding",
                '"paper" (or True), "reference" or False',
                repr(position_encoding),
            )
        self.position_encoding = position_encoding
        self.temporal_encoding = bool(temporal_encoding)
        self.linear_start = bool(linear_start)
        if (
            isinstance(temporal_noise, bool)
            or not isinstance(temporal_noise, (int, float, np.floating))
            or not 0.0 <= temporal_noise < 1.0
        ):
            raise input_error(
                self, "temporal_noise", "a number in [0, 1)", repr(temporal_noise)
            )
        if temporal_noise and not self.temporal_encoding:
            raise input_error(
                self,
                "temporal_noise",
                "0 without the temporal encoding (it shifts its rows)",
                repr(temporal_noise),
            )
        self.temporal_noise = float(temporal_noise)
        self.seed = seed
        if self.temporal_noise:
            self.seed_generator = keras.random.SeedGenerator(seed)
        if weight_tying not in WEIGHT_TYING:
            raise input_error(
                self,
                "weight_tying",
                " or ".join(repr(t) for t in WEIGHT_TYING),
                repr(weight_tying),
            )
        self.weight_tying = weight_tying
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(stddev=0.1)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    # -- hop tables ---------------------------------------------------------
    def _table_index(self, hop, kind):
        """Index into ``self.embeddings`` (and ``self.temporal``) of ``A^{hop+1}``
        (``kind="input"``) or ``C^{hop+1}`` (``"output"``), hop 0-based."""
        if self.weight_tying == "adjacent":
            return hop if kind == "input" else hop + 1
        return 0 if kind == "input" else 1

    def input_embedding(self, hop):
        """The ``Embedding`` layer ``A`` of hop ``hop`` (0-based)."""
        return self.embeddings[self._table_index(hop, "input")]

    def output_embedding(self, hop):
        """The ``Embedding`` layer ``C`` of hop ``hop`` (0-based)."""
        return self.embeddings[self._table_index(hop, "output")]

    def set_linear_start(self, active):
        """Remove (``True``) or restore (``False``) every hop's softmax."""
        if not self.linear_start:
            raise ValueError(
                f"{type(self).__name__} '{self.name}': set_linear_start needs a "
                "layer built with linear_start=True; received a layer with "
                "linear_start=False"
            )
        self.linear.assign(1.0 if active else 0.0)

    # -- Keras plumbing ---------------------------------------------------------
    def build(self, story_shape, question_shape, story_mask_shape=None):
        self._check_shapes(story_shape, question_shape)
        if self.linear_start:
            self.linear = self.add_weight(
                shape=(), initializer="ones", trainable=False, name="linear"
            )
        adjacent = self.weight_tying == "adjacent"
        names = [str(i) for i in range(self.hops + 1)] if adjacent else ["a", "c"]
        self.embeddings = [self._embedding(name, i) for i, name in enumerate(names)]
        self.temporal = []
        if self.temporal_encoding:
            for i, name in enumerate(names):
                self.temporal.append(
                    self.add_weight(
                        shape=(self.max_memories, self.embed_dim),
                        initializer=fresh_initializer(
                            self.embeddings_initializer, len(names) + i
                        ),
                        name=f"temporal_{name}",
                    )
                )
        if self.readout_units:
            # Seed index 2 and up: hop_map and answer take 0 and 1.
            self.readout_hidden = self._dense(
                "readout_hidden", self.readout_units, 2, activation="relu"
            )
            self.readout_output = self._dense(
                "readout_output",
                self.embed_dim,
                input_dim=self.readout_units,
                use_bias=False,
                kernel_initializer="zeros",
            )
        if adjacent:
            self.question_embedding = self.embeddings[0]  # B = A^1
            return
        self.question_embedding = self._embedding("b", 2 * len(names))
        self.hop_map = self._dense("hop_map", self.embed_dim, 0, use_bias=False)
        self.answer = self._dense("answer", self.vocab_size, 1, use_bias=False)

    def _embedding(self, name, seed_index):
        """A built word table ``embedding_{name}``, its initializer's copy
        ``seed_index`` (`fresh_initializer`)."""
        table = keras.layers.Embedding(
            self.vocab_size,
            self.embed_dim,
            embeddings_initializer=fresh_initializer(
                self.embeddings_initializer, seed_index
            ),
            dtype=self.dtype_policy,
            name=f"embedding_{name}",
        )
        table.build((None,))
        return table

    def _dense(self, name, units, seed_index=None, input_dim=None, **kwargs):
        """A ``Dense`` layer built on ``[B, input_dim]`` (default ``embed_dim``);
        its kernel initializer is the copy ``seed_index`` of
        ``kernel_initializer`` (`fresh_initializer`) unless ``kwargs`` name one."""
        if seed_index is not None:
            kwargs["kernel_initializer"] = fresh_initializer(
                self.kernel_initializer, seed_index
            )
        layer = keras.layers.Dense(units, dtype=self.dtype_policy, name=name, **kwargs)
        layer.build((None, input_dim or self.embed_dim))
        return layer

    def _check_shapes(self, story_shape, question_shape):
        story, question = static_shape(story_shape), static_shape(question_shape)
        if len(story) != 3:
            raise input_error(
                self,
                "story",
                "a rank-3 tensor [batch, memories, words] of word ids",
                f"shape {story}",
            )
        if len(question) != 2:
            raise input_error(
                self,
                "question",
                "a rank-2 tensor [batch, words] of word ids",
                f"shape {question}",
            )
        limits = (
            ("story", story, 1, "max_memories", "memories"),
            ("story", story, 2, "max_words", "words"),
            ("question", question, 1, "max_words", "words"),
        )
        for argument, shape, axis, limit, what in limits:
            most = getattr(self, limit)
            if shape[axis] is not None and shape[axis] > most:
                raise input_error(
                    self,
                    argument,
                    f"at most {limit}={most} {what} (axis {axis})",
                    f"shape {shape}",
                )
        if None not in (story[0], question[0]) and story[0] != question[0]:
            raise input_error(
                self,
                "question",
                f"the batch size of story ({story[0]})",
                f"shape {question}",
            )

    def _check_ids(self, argument, ids):
        dtype = keras.backend.standardize_dtype(ids.dtype)
        if "int" not in dtype:
            raise input_error(
                self, argument, "an integer tensor of word ids", f"dtype {dtype}"
            )
        values = concrete_value(ids)
        if values is not None and values.size:
            low, high = int(values.min()), int(values.max())
            if low < 0 or high >= self.vocab_size:
                raise input_error(
                    self,
                    argument,
                    f"word ids in [0, vocab_size={self.vocab_size})",
                    f"ids in [{low}, {high}]",
                )

    def _encode(self, table, ids, word_mask):
        """``sum_j l_j * E x_j`` over the last axis of ``ids``: ``[..., d]``."""
        embedded = table(ids)  # [..., W, d], compute dtype
        if self.position_encoding:
            weights = position_encoding(
                word_mask, self.embed_dim, embedded.dtype, self.position_encoding
            )
        else:
            weights = ops.expand_dims(ops.cast(word_mask, embedded.dtype), -1)
        return ops.sum(embedded * weights, axis=-2)

    def _recency(self, memory_mask, training):
        """Row of the temporal encodings of each memory: the number of real
        memories after it (0 for the most recent), plus in training the empty
        memories `temporal_noise` inserts after it and after those."""
        real = ops.cast(memory_mask, "int32")
        if training and self.temporal_noise:
            draw = keras.random.uniform(
                ops.shape(real), seed=self.seed_generator, dtype="float32"
            )
            gaps = ops.cast(draw < self.temporal_noise, "int32") * real
            after = real + gaps
            recency = ops.sum(after, axis=1, keepdims=True) - ops.cumsum(after, 1)
            return ops.minimum(recency + gaps, self.max_memories - 1)
        return ops.sum(real, axis=1, keepdims=True) - ops.cumsum(real, axis=1)

    def call(
        self, story, question, story_mask=None, return_attention=False, training=None
    ):
        story = ops.convert_to_tensor(story)
        question = ops.convert_to_tensor(question)
        self._check_shapes(story.shape, question.shape)
        self._check_ids("story", story)
        self._check_ids("question", question)
        batch, memories = static_shape(story.shape)[:2]
        check_mask_shape(self, "story_mask", story_mask, (batch, memories))
        dtype = self.compute_dtype
        word_mask = ops.not_equal(story, 0)  # [B, M, W]
        if story_mask is None:
            memory_mask = ops.any(word_mask, axis=-1)
        else:
            memory_mask = masking.as_bool(story_mask)
        recency = self._recency(memory_mask, training)  # in [0, M - 1]

        encoded = {}  # table index -> memory vectors [B, M, d]

        def memory_vectors(index):
            if index not in encoded:
                vectors = self._encode(self.embeddings[index], story, word_mask)
                if self.temporal_encoding:
                    table = ops.cast(self.temporal[index], dtype)
                    rows = ops.take(table, recency, axis=0)
                    if self.position_encoding == "reference":
                        rows = rows * temporal_weights(word_mask, self.embed_dim, dtype)
                    vectors = vectors + rows
                encoded[index] = vectors
            return encoded[index]

        u = self._encode(self.question_embedding, question, ops.not_equal(question, 0))
        sdtype = score_dtype(dtype)
        attention = []
        for hop in range(self.hops):
            m = memory_vectors(self._table_index(hop, "input"))
            c = memory_vectors(self._table_index(hop, "output"))
            scores = ops.sum(
                ops.cast(m, sdtype) * ops.expand_dims(ops.cast(u, sdtype), 1), -1
            )
            p = masking.masked_softmax(scores, memory_mask)
            if self.linear_start:
                linear = ops.cast(self.linear, sdtype)
                raw = ops.where(memory_mask, scores, ops.zeros_like(scores))
                p = linear * raw + (1.0 - linear) * p
            p = ops.cast(p, dtype)
            o = ops.sum(ops.expand_dims(p, -1) * c, axis=1)
            u = (u if self.weight_tying == "adjacent" else self.hop_map(u)) + o
            attention.append(p)
        if self.readout_units:
            u = u + self.readout_output(self.readout_hidden(u))
        if self.weight_tying == "adjacent":
            table = ops.cast(self.embeddings[-1].embeddings, dtype)  # W^T = C^K
            logits = ops.matmul(u, ops.transpose(table))
        else:
            logits = self.answer(u)
        if return_attention:
            return logits, ops.stack(attention, axis=1)
        return logits

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
            "max_memories": self.max_memories,
            "max_words": self.max_words,
            "hops": self.hops,
            "position_encoding": self.position_encoding,
            "temporal_encoding": self.temporal_encoding,
            "weight_tying": self.weight_tying,
            "embeddings_initializer": keras.initializers.serialize(
                self.embeddings_initializer
            ),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "linear_start": self.linear_start,
            "temporal_noise": self.temporal_noise,
            "seed": self.seed,
            "readout_units": self.readout_units,
        }
