"""The question-answering task: what it supplies to the pipeline core.

Stories, questions and answers (`pipelines.qa.data`: bAbI-style tasks from
`pipelines.qa.babi`, or the user's JSON Lines), one word vocabulary learned
from the training split and the answer list from the training and validation
splits, an end-to-end memory network
(`pipelines.qa.model.MemoryQA`), per-task accuracy with the supporting-fact
attention check (`pipelines.qa.evaluate`), and a `StoryAnswerer` export that
takes a story and a question as strings.
"""

from __future__ import annotations

from pipelines.core.run_dir import read_json, write_json
from pipelines.core.task import Task, forward, saved_or_learned, served_evaluation
from pipelines.qa import config as qa_config
from pipelines.qa.client import QAClient, split_input
from pipelines.qa.contract import QAContract

TOKENIZER, ANSWERS, ANSWERS_TSV = "tokenizer.json", "answers.json", "answers.tsv"


class QATask(Task):
    client = QAClient()
    contract = QAContract()
    name = "qa"
    description = "question answering: multi-hop memory network, story and question in"
    default_preset = "babi"
    run_files = (TOKENIZER, ANSWERS, ANSWERS_TSV, "attention.png")
    learned_files = (TOKENIZER, ANSWERS)
    evaluate_files = (ANSWERS_TSV, "plots/attention_0.png")

    def presets(self):
        return qa_config.PRESETS

    # -- data ---------------------------------------------------------------
    load_data = forward("pipelines.qa.data", "load_data")

    def preprocessors(self, run, data, config, create):
        from pipelines.core.text import WordTokenizer, load_tokenizer
        from pipelines.qa.data import Preprocessors

        def learn(data):
            texts = sorted({s for e in data.train for s in (*e.story, e.question)})
            # The valid answers too, so that validation can score them; the
            # test split's are never learned.
            return Preprocessors(
                WordTokenizer.learn(texts, config.tokenizer.vocab_size),
                sorted({e.answer for e in data.train + data.valid}),
            )

        def save(preprocessors, tokenizer_path, answers_path):
            preprocessors.tokenizer.save(tokenizer_path)
            write_json(answers_path, preprocessors.answers)

        return saved_or_learned(
            self.name, run, data, create, (TOKENIZER, ANSWERS),
            lambda tokenizer, answers: Preprocessors(
                load_tokenizer(tokenizer), read_json(answers)
            ),
            learn, save,
        )  # fmt: skip

    def summary(self, data, preprocessors, config) -> str:
        lines = [super().summary(data, preprocessors, config)]
        lines.append(
            f"vocabulary: {preprocessors.tokenizer.vocab_size} words; "
            f"{len(preprocessors.answers)} answers"
        )
        unseen = {e.answer for e in data.test} - set(preprocessors.answers)
        if unseen:
            lines.append(
                f"{len(unseen)} test answers are not among the training and validation "
                "answers (always wrong)"
            )
        return "\n".join(lines)

    make_dataset = forward("pipelines.qa.data", "make_dataset")

    # -- model --------------------------------------------------------------
    def build_model(self, config, preprocessors):
        from pipelines.qa.model import GenerativeQA, MemoryQA

        if config.model.architecture == "encoder_decoder":
            from pipelines.core.text import RESERVED

            return GenerativeQA(
                config,
                preprocessors.tokenizer.vocab_size,
                len(RESERVED) + len(preprocessors.answer_words),
            )
        return MemoryQA(config, preprocessors.vocab_size)

    def compile_arguments(self, config) -> dict:
        import keras

        if config.model.architecture == "encoder_decoder":
            from pipelines.core.metrics import teacher_forcing_arguments

            return teacher_forcing_arguments()
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if config.model.supervision_weight > 0:
            # The attention output carries the supervision loss only; Keras
            # 3.15's metrics then ask for an "attention" target (KeyError),
            # so a supervised run reports losses and no accuracy while it trains.
            return {"loss": {"answer": loss}}
        return {"loss": loss, "metrics": ["accuracy"]}

    def phases(self, config) -> tuple[int, ...]:
        """With ``model.linear_start_epochs``, the softmax phase begins after
        the linear start (which may stop early on the validation loss)."""
        first = config.model.linear_start_epochs
        return (first,) if 0 < first < config.train.epochs else ()

    def start_phase(self, model, config, phase) -> None:
        if config.model.linear_start_epochs:
            linear = phase == 0  # the whole run if it is not longer
            model.memory.set_linear_start(linear)
            print("Linear start: no softmax in the hops" if linear else "Softmax on")

    # -- evaluation ---------------------------------------------------------

    evaluate = served_evaluation("pipelines.qa.evaluate", heatmaps=3)

    plot_attention = forward("pipelines.qa.evaluate", "plot_attention")

    # -- serving ------------------------------------------------------------
    def serving_module(self, model, preprocessors, config):
        from pipelines.qa.serving import StoryAnswerer

        samples = [split_input(text) for text in self.samples(config)]
        return StoryAnswerer(model, preprocessors, config, samples)

    samples = forward("pipelines.qa.data", "samples_for")


TASK = QATask()
