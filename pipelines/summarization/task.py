"""The summarization task: what it supplies to the pipeline core.

(document, summary) pairs (`pipelines.summarization.data`), one word
vocabulary learned from the training split (`WordTokenizer`, in the graph),
the pointer-generator network in three variants (baseline, pointer, pointer +
coverage with a final coverage phase; `PointerSeq2Seq`), ROUGE with the
repetition, novelty and copy rates (`pipelines.summarization.evaluate`), and a
`Summarizer` export that takes raw strings and returns summaries, scores,
attention and ``p_gen``.
"""

from __future__ import annotations

from pipelines.core.errors import PipelineError
from pipelines.core.task import Task, forward, saved_or_learned
from pipelines.summarization import config as summarization_config
from pipelines.summarization.client import SummarizationClient
from pipelines.summarization.contract import SummarizationContract

TOKENIZER = "tokenizer.json"


class SummarizationTask(Task):
    client = SummarizationClient()
    contract = SummarizationContract()
    name = "summarization"
    description = "summarization: pointer-generator with coverage, strings in"
    default_preset = "blurbs"
    run_files = (TOKENIZER, "summaries.tsv", "attention.png")
    learned_files = (TOKENIZER,)
    evaluate_files = ("summaries.tsv", "plots/attention_0.png")

    def presets(self):
        return summarization_config.PRESETS

    # -- data ---------------------------------------------------------------
    load_data = forward("pipelines.summarization.data", "load_data")

    def preprocessors(self, run, data, config, create):
        from pipelines.core.text import WordTokenizer, load_tokenizer

        def learn(data):
            texts = [text for pair in data.train for text in pair]
            return WordTokenizer.learn(texts, config.tokenizer.vocab_size)

        return saved_or_learned(
            self.name, run, data, create, (TOKENIZER,), load_tokenizer, learn,
            lambda tokenizer, path: tokenizer.save(path),
        )  # fmt: skip

    def summary(self, data, preprocessors, config) -> str:
        from pipelines.data import pair_summary
        from pipelines.summarization.debian import absent_share

        vocabulary = (
            f"vocabulary (words, both sides): {preprocessors.vocab_size}; "
            f"{absent_share(data.train):.1%} of training summary words are not "
            "in their document"
        )
        return pair_summary(
            data, (preprocessors, preprocessors), config.tokenizer,
            ("documents", "summaries"), vocabulary,
        )  # fmt: skip

    make_dataset = forward("pipelines.summarization.data", "make_dataset")

    # -- model --------------------------------------------------------------
    def build_model(self, config, preprocessors):
        m = config.model
        pointer = m.variant != "baseline"
        if m.architecture == "transformer":
            from pipelines.summarization.transformer import TransformerPointer

            return TransformerPointer(
                preprocessors.vocab_size,
                m.embedding_dim,
                m.num_layers,
                m.num_heads,
                m.intermediate_dim,
                config.tokenizer.max_target_tokens + 1,
                pointer=pointer,
                dropout=m.dropout,
            )
        from pipelines.summarization.model import PointerSeq2Seq

        return PointerSeq2Seq(
            preprocessors.vocab_size,
            m.embedding_dim,
            m.units,
            m.attention_units,
            pointer=pointer,
            coverage=m.variant == "coverage",
            dropout=m.dropout,
        )

    def compile_arguments(self, config) -> dict:
        from pipelines.core.metrics import sequence_arguments

        return sequence_arguments()

    def phases(self, config) -> tuple[int, ...]:
        """The coverage variant's last ``coverage.epochs`` epochs are a phase."""
        epochs, final = config.train.epochs, config.coverage.epochs
        if config.model.variant != "coverage" or not 0 < final < epochs:
            return ()
        return (epochs - final,)

    def start_phase(self, model, config, phase) -> None:
        if config.model.variant != "coverage":
            return
        on = phase > 0 or config.coverage.epochs >= config.train.epochs
        weight = config.coverage.weight if on and config.coverage.epochs else 0.0
        model.set_coverage_weight(weight)
        print(f"Coverage loss weight {weight:g}")

    # -- evaluation ---------------------------------------------------------

    def evaluate(self, run, model, preprocessors, config, examples, args) -> dict:
        from pipelines.summarization.evaluate import evaluate

        split = args.split
        if getattr(args, "corpus", None):
            from pipelines.summarization.data import read_corpus

            try:
                pairs, _ = read_corpus(args.corpus, config)
            except (OSError, ValueError) as error:
                raise PipelineError(f"evaluate --corpus: {error}") from None
            examples = [p for p in pairs if p[0].split() and p[1].split()]
            examples = examples[: args.limit] if args.limit else examples
            split = args.corpus
            if not examples:
                raise PipelineError(f"evaluate: {args.corpus} has no pairs.")
        summarizer = self.serving_module(model, preprocessors, config)
        return evaluate(
            run.root, summarizer, config, examples, split,
            getattr(args, "beam_width", None), getattr(args, "min_length", None),
            getattr(args, "heatmaps", 3),
        )  # fmt: skip

    def plot_attention(self, module, config, examples, folder):
        from pipelines.summarization.evaluate import plot_samples

        return plot_samples(module, [document for document, _ in examples], folder)

    # -- serving ------------------------------------------------------------
    serving_module = forward("pipelines.summarization.serving", "Summarizer")

    samples = forward("pipelines.summarization.serving", "samples_for")


TASK = SummarizationTask()
