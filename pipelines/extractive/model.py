"""The extractive model: BiDAF and a span pointer.

`SpanQA` follows the layers of Seo et al. (2017), with word embeddings only
(no character CNN: out-of-vocabulary words share hashed ids,
`pipelines.extractive.tokenizer.SpanTokenizer`):

1. embeddings of the passage and question words (id 0 pads; the masks
   come from the ids), each with one more feature, ``match``: 1.0 where a
   passage word occurs in the question (Chen et al. 2017's exact-match
   feature), 1.0 for every question word;
2. one encoder shared by both: ``H`` ``[B, T, 2u]``, ``U`` ``[B, J, 2u]``;
3. `attention_layers.BidirectionalAttentionFlow`: ``G`` ``[B, T, 8u]``;
4. two modelling layers: ``M`` over ``G`` and ``M2`` over ``M``;
5. `attention_layers.SpanPointer` on ``[G; M]`` and ``[G; M2]``: start and
   end logits over the passage (``-1e9`` on padding).

The encoder and modelling layers are BiGRUs as in the paper (``model.encoder:
gru``, the default), or Transformer encoder blocks
(`attention_layers.TransformerEncoderBlock`, pre-norm, sinusoidal positions,
``model.encoder_blocks`` in the encoder and one per modelling layer).

``trainer`` maps ``{"context", "match", "question"}`` to
``{"start", "end"}`` logits; ``attention`` adds BiDAF's context-to-query
attention ``[B, T, J]`` for plots.
"""

from __future__ import annotations


class SpanQA:
    """Passage and question word ids -> start and end logits over the passage.

    Args:
        config: the run's `pipelines.extractive.config.ExtractiveConfig`.
        vocab_size: the tokenizer's ids, buckets included.
    """

    def __init__(self, config, vocab_size: int):
        import keras

        import attention_layers as al

        m = config.model
        context = keras.Input((None,), dtype="int32", name="context")
        match = keras.Input((None,), dtype="float32", name="match")
        question = keras.Input((None,), dtype="int32", name="question")
        embed = keras.layers.Embedding(vocab_size, m.embed_dim, name="embedding")

        # Masks from the ids, given to every layer: a Concatenate of the
        # embeddings with the unmasked flags would unmask the padding.
        def not_padding(name):
            return keras.layers.Lambda(
                lambda ids: keras.ops.not_equal(ids, 0), name=name
            )

        c_mask, q_mask = (
            not_padding("context_mask")(context),
            not_padding("question_mask")(question),
        )
        flags = keras.layers.Reshape((-1, 1), name="match_feature")(match)
        passage = keras.layers.Concatenate(name="passage_words")(
            [embed(context), flags]
        )
        ones = keras.layers.Lambda(
            lambda ids: keras.ops.ones_like(keras.ops.cast(ids, "float32"))[..., None],
            name="question_flag",
        )(question)
        asked = keras.layers.Concatenate(name="question_words")([embed(question), ones])

        if m.encoder == "gru":
            encoder, modelling, end_modelling = (
                _bigru(m, name) for name in ("encoder", "modelling", "end_modelling")
            )
        else:
            encoder = _transformer(m, m.encoder_blocks, "encoder", config.train.seed)
            modelling = _transformer(m, 1, "modelling", config.train.seed)
            end_modelling = _transformer(m, 1, "end_modelling", config.train.seed)
        h, u = encoder(passage, c_mask), encoder(asked, q_mask)
        g, (c2q, _) = al.BidirectionalAttentionFlow(
            dropout=m.dropout, seed=config.train.seed, name="bidaf"
        )(h, u, query_mask=c_mask, value_mask=q_mask, return_attention_scores=True)
        m1 = modelling(g, c_mask)
        m2 = end_modelling(m1, c_mask)
        start, end = al.SpanPointer(name="pointer")(
            keras.layers.Concatenate(name="start_features")([g, m1]),
            keras.layers.Concatenate(name="end_features")([g, m2]),
            mask=c_mask,
        )
        start = keras.layers.Identity(name="start")(start)
        end = keras.layers.Identity(name="end")(end)
        inputs = {"context": context, "match": match, "question": question}
        self.trainer = keras.Model(inputs, {"start": start, "end": end}, name="span_qa")
        self.attention = keras.Model(
            inputs, {"start": start, "end": end, "attention": c2q}, name="span_scorer"
        )


def _bigru(m, name):
    """A BiGRU over ``[B, T, F]`` with an explicit ``[B, T]`` mask."""
    import keras

    layer = keras.layers.Bidirectional(
        keras.layers.GRU(m.units, return_sequences=True, dropout=m.dropout),
        name=name,
    )
    return lambda x, mask: layer(x, mask=mask)


def _transformer(m, blocks: int, name: str, seed: int):
    """A projection to ``2 * units`` (a BiGRU's width), sinusoidal positions
    and ``blocks`` Transformer encoder blocks (pre-norm), with a mask."""
    import keras

    import attention_layers as al

    width = 2 * m.units
    project = keras.layers.Dense(width, name=f"{name}_projection")
    positions = al.SinusoidalPositionEncoding(name=f"{name}_positions")
    stack = [
        al.TransformerEncoderBlock(
            num_heads=m.heads,
            intermediate_dim=2 * width,
            dropout=m.dropout,
            norm_first=True,
            seed=seed,
            name=f"{name}_{k}",
        )  # fmt: skip
        for k in range(blocks)
    ]

    def apply(x, mask):
        x = project(x)
        x = x + positions(x)
        for block in stack:
            x = block(x, padding_mask=mask)
        return x

    return apply
