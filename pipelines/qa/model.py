"""The question-answering model: an end-to-end memory network over the story.

`MemoryQA` wraps `attention_layers.MemoryNetwork` (Sukhbaatar et al. 2015)
in two Keras models that share its weights: ``trainer`` (story and question
in, answer logits out; with ``model.supervision_weight > 0`` it also takes
the supporting facts and adds `attention_layers.MemorySupervisionLoss`) and
``scorer`` (the logits and every hop's attention, for evaluation and
serving).
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
