"""The question-answering model: an end-to-end memory network over the story.

`MemoryQA` wraps `attention_layers.MemoryNetwork` (Sukhbaatar et al. 2015)
in two Keras models that share its weights: ``trainer`` (story and question
in, answer logits out; with ``model.supervision_weight > 0`` it also takes
the supporting facts and adds `attention_layers.MemorySupervisionLoss`) and
``scorer`` (the logits and every hop's attention, for evaluation and
serving). `GenerativeQA` (``model.architecture="encoder_decoder"``) writes
the answer word by word instead.
"""

from __future__ import annotations


class MemoryQA:
    """Story ``[B, M, W]`` and question ``[B, W]`` word ids -> answer logits.

    Args:
        config: the run's `pipelines.qa.config.QAConfig`.
        vocab_size: word ids plus the answers' own ids
            (`pipelines.qa.data.Preprocessors.vocab_size`).
    """

    def __init__(self, config, vocab_size: int):
        import keras

        import attention_layers as al

        m, words = config.model, config.tokenizer.max_words
        story = keras.Input((None, None), dtype="int32", name="story")
        question = keras.Input((None,), dtype="int32", name="question")
        self.memory = al.MemoryNetwork(
            vocab_size,
            m.embed_dim,
            max_memories=m.max_memories,
            max_words=words,
            hops=m.hops,
            position_encoding=m.position_encoding,
            temporal_encoding=m.temporal_encoding,
            weight_tying=m.weight_tying,
            linear_start=m.linear_start_epochs > 0,
            temporal_noise=m.temporal_noise if m.temporal_encoding else 0.0,
            seed=config.train.seed,
            readout_units=m.readout_units,
            name="memory",
        )
        logits, attention = self.memory(story, question, return_attention=True)
        self.scorer = keras.Model([story, question], [logits, attention], name="scorer")
        if m.supervision_weight > 0:
            supporting = keras.Input((None,), dtype="bool", name="supporting")
            attention = al.MemorySupervisionLoss(
                m.supervision_weight, name="supervision"
            )(attention, supporting)
            self.trainer = keras.Model(
                {"story": story, "question": question, "supporting": supporting},
                {"answer": logits, "attention": attention},
                name="memory_qa",
            )
        else:
            self.trainer = keras.Model(
                {"story": story, "question": question}, logits, name="memory_qa"
            )
        self.supervised = m.supervision_weight > 0


class GenerativeQA:
    """The story's words then the question's ``[B, L]`` in, the answer's words
    out: the encoder-decoder of the seeds' framing ("the source is a
    question, the target an answer"), with a changing context vector at
    every step. It is the translation task's attention model
    (`pipelines.core.seq2seq.RNNSeq2Seq`: a BiGRU encoder, a GRU decoder
    with Bahdanau attention and input feeding), over word ids.

    Args:
        config: the run's `pipelines.qa.config.QAConfig`
            (``model.architecture="encoder_decoder"``).
        source_vocab: the story and question words' ids.
        target_vocab: the answer words' ids (`Preprocessors.answer_words`
            after the 4 reserved ids).
    """

    def __init__(self, config, source_vocab: int, target_vocab: int):
        from pipelines.core.seq2seq import RNNSeq2Seq, Seq2SeqConfig

        m = config.model
        self.seq2seq = RNNSeq2Seq(
            Seq2SeqConfig(
                attention="bahdanau",
                embedding_dim=m.embed_dim,
                units=m.units,
                attention_units=m.units,
                dropout=0.0,
            ),
            source_vocab,
            target_vocab,
        )
        self.trainer = self.seq2seq.trainer

    def encode(self, source_ids):
        return self.seq2seq.encode(source_ids)

    def initial_state(self, encoded):
        return self.seq2seq.initial_state(encoded)

    def step_fn(self, encoded):
        return self.seq2seq.step_fn(encoded)
