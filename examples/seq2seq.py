"""A small encoder-decoder with attention, built from the library's layers."""

import keras

import attention_layers as al


def build_seq2seq(source_vocab, target_vocab, units, source_dim=32, target_dim=16):
    """BiGRU encoder, `AttentionDecoder` (GRU cell + Bahdanau), Dense logits.

    The encoder's final states start the decoder. Returns ``(model, encoder,
    target_embedding, decoder, projection)``: the teacher-forced training model
    ``[source, target] -> logits`` and the parts that ``rnn_step_fn`` and the
    decoding functions need.
    """
    source = keras.Input(shape=(None,), dtype="int32", name="source")
    target = keras.Input(shape=(None,), dtype="int32", name="target")
    source_embedding = keras.layers.Embedding(source_vocab, source_dim, mask_zero=True)
    target_embedding = keras.layers.Embedding(target_vocab, target_dim, mask_zero=True)
    memory, forward, backward = keras.layers.Bidirectional(
        keras.layers.GRU(units, return_sequences=True, return_state=True)
    )(source_embedding(source))
    encoder_state = keras.layers.Concatenate()([forward, backward])
    decoder = al.AttentionDecoder(
        al.AttentionRNNCell(
            keras.layers.GRUCell(2 * units),
            al.BahdanauAttention(units),
            output_units=2 * units,
        )
    )
    outputs = decoder(target_embedding(target), memory, initial_state=[encoder_state])
    projection = keras.layers.Dense(target_vocab)
    model = keras.Model([source, target], projection(outputs))
    encoder = keras.Model(source, [memory, encoder_state])
    return model, encoder, target_embedding, decoder, projection
