"""Metrics: a registry of evaluation scores by name, and training metrics.

Evaluation metrics are registered by name (`register`) and computed together
(`score`); each returns a dict of values (and, for sacrebleu, the signature
that makes the number reproducible). Tasks list the names they report.

Registered: ``bleu`` and ``chrf`` (sacrebleu), ``exact_match``, ``rouge``,
``squad_exact_match`` and ``squad_f1``.
``rouge`` is ROUGE-1, -2 and -L F1 from Google's ``rouge-score`` (the
reimplementation of ROUGE-1.5.5 that the field reports with; the Perl
original cannot be installed here), with the Porter stemmer **on**, as See
et al. 2017 and most papers report it; the mean F1 over summaries, times
100. Its tokenizer lowercases and keeps ``[a-z0-9]`` only: **non-ASCII
letters are dropped** ("café" is scored as "caf"; a text in another script
scores 0).

``squad_exact_match`` and ``squad_f1`` are the SQuAD scores of extractive
question answering, written here after the official evaluation script
(Rajpurkar et al. 2016; HF ``evaluate`` fetches its copy from the Hub, which
cannot be reached offline): answers are normalised (`normalize_answer`:
lowercase, ASCII punctuation removed, the articles a/an/the removed,
whitespace collapsed); exact match compares the normalised strings, F1 the
bags of their whitespace tokens; each question scores the best over its gold
answers, and the set the mean, times 100. A reference is one gold answer (a
string) or a list of them.

For summaries, two rates over lowercased word and punctuation tokens,
pooled over the corpus (ours: no kept library computes them, they are a few
lines of counting): `repeated_trigram_rate`, the share of a summary's
trigrams that repeat an earlier one of the same summary (what coverage is
meant to remove), and `novel_ngram_rate`, the share of summary n-grams
absent from the source (how abstractive the summaries are).

Example:

>>> from pipelines.core.metrics import score
>>> scores = score(["bleu", "chrf", "exact_match"],
...                ["the cat sat on the mat"], ["the cat sat on the mat"])
>>> round(scores["bleu"]), round(scores["chrf"]), scores["exact_match"]
(100, 100, 1.0)
>>> scores = score(["rouge"], ["the cats sat on a mat"], ["the cat sat on the mat"])
>>> scores["rouge1"], scores["rouge2"], scores["rougeL"]
(83.33, 60.0, 83.33)
>>> scores = score(["squad_exact_match", "squad_f1"], ["the Cat sat.", "x b c"],
...                [["cat sat"], ["x", "b c d"]])
>>> scores["squad_exact_match"], scores["squad_f1"]
(50.0, 83.33)
>>> repeated_trigram_rate(["a b c a b c"])  # "a b c" comes back: 1 of 4
0.25
>>> novel_ngram_rate(["the cat ran"], ["the cat sat"], n=1)
0.3333
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

import keras

DEFAULT_BUCKETS = (10, 20, 30, 40, 60)
MetricFn = Callable[[Sequence, Sequence], dict]
_METRICS: dict[str, MetricFn] = {}


def register(name: str) -> Callable[[MetricFn], MetricFn]:
    """Decorator: ``fn(hypotheses, references) -> {name: value, ...}``."""

    def add(fn: MetricFn) -> MetricFn:
        _METRICS[name] = fn
        return fn

    return add


def names() -> list[str]:
    return sorted(_METRICS)


def score(metric_names: Sequence[str], hypotheses: Sequence, references: Sequence):
    """Every named metric on the same hypotheses and references, in one dict."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"metrics: {len(hypotheses)} hypotheses for {len(references)} references."
        )
    if not hypotheses:
        raise ValueError("metrics: nothing to score (no hypotheses).")
    out: dict = {}
    for name in metric_names:
        if name not in _METRICS:
            raise ValueError(f"metrics: unknown metric {name!r}; known: {names()}")
        out.update(_METRICS[name](hypotheses, references))
    out["sentences"] = len(references)
    return out


@register("bleu")
def bleu(hypotheses, references) -> dict:
    """sacrebleu corpus BLEU (13a tokenization), with its signature."""
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": round(result.score, 2),
        "bleu_signature": str(metric.get_signature()),
    }


@register("chrf")
def chrf(hypotheses, references) -> dict:
    """sacrebleu chrF, with its signature."""
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return {
        "chrf": round(result.score, 2),
        "chrf_signature": str(metric.get_signature()),
    }


@register("exact_match")
def exact_match(hypotheses, references) -> dict:
    """Share of hypotheses equal to their reference (outer whitespace ignored)."""
    hits = sum(
        str(h).strip() == str(r).strip()
        for h, r in zip(hypotheses, references, strict=True)
    )
    return {"exact_match": round(hits / len(references), 4)}


_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, no punctuation or articles, single spaces.

    As the official script does it: ASCII punctuation only (``string.punctuation``)
    is removed, before the articles, so "l'an" becomes "lan" and keeps its "an".
    """
    text = "".join(c for c in str(text).lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_f1(prediction: str, gold: str) -> float:
    """Token F1 of one prediction against one gold answer, in [0, 1].

    Tokens are the whitespace-separated words of `normalize_answer`; common
    tokens are counted with multiplicity. When either side normalises to no
    token, 1.0 if both do, else 0.0 (as SQuAD 2.0's script; 1.1's gave 0.0
    to two empty answers, which its data never had).
    """
    predicted, expected = (
        normalize_answer(prediction).split(),
        normalize_answer(gold).split(),
    )
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def _golds(reference: object, index: int) -> list[str]:
    """The gold answers of one reference: a string, or a non-empty list of them."""
    if isinstance(reference, str):
        return [reference]
    if isinstance(reference, list | tuple) and reference:
        if all(isinstance(gold, str) for gold in reference):
            return list(reference)
    raise ValueError(
        f"squad metrics: reference {index} must be a gold answer string or a "
        f"non-empty list of them, received {reference!r}"
    )


def _best_over_golds(hypotheses, references, fn) -> float:
    """The mean over questions of the best ``fn(prediction, gold)``, times 100."""
    if not references:
        raise ValueError("squad metrics: no questions to score (received none)")
    total = 0.0
    for index, (hypothesis, reference) in enumerate(
        zip(hypotheses, references, strict=True)
    ):
        total += max(fn(str(hypothesis), gold) for gold in _golds(reference, index))
    return round(100 * total / len(references), 2)


@register("squad_exact_match")
def squad_exact_match(hypotheses, references) -> dict:
    """SQuAD exact match, 0 to 100: normalised prediction equal to a gold answer."""

    def exact(prediction: str, gold: str) -> float:
        return float(normalize_answer(prediction) == normalize_answer(gold))

    return {"squad_exact_match": _best_over_golds(hypotheses, references, exact)}


@register("squad_f1")
def squad_f1(hypotheses, references) -> dict:
    """SQuAD F1, 0 to 100: token F1 against the best-matching gold answer."""
    return {"squad_f1": _best_over_golds(hypotheses, references, answer_f1)}


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
_TOKEN = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    """Lowercased word and punctuation tokens (Unicode-aware)."""
    return _TOKEN.findall(str(text).lower())


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


@register("rouge")
def rouge(hypotheses, references) -> dict:
    """ROUGE-1/2/L F1 (mean over summaries, x100), Porter stemming on."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        result = scorer.score(str(reference), str(hypothesis))  # (target, prediction)
        for name in ROUGE_TYPES:
            totals[name] += result[name].fmeasure
    out = {
        name: round(100 * total / len(references), 2) for name, total in totals.items()
    }
    out["rouge_settings"] = (
        "rouge-score F1, use_stemmer=True, mean over summaries x100; "
        "non-ASCII characters are dropped by its tokenizer"
    )
    return out


def repeated_trigram_rate(summaries: Sequence[str]) -> float:
    """Repeated trigrams / all trigrams, within each summary, pooled.

    A trigram counts as repeated at its second and later occurrences in the
    same summary. 0 when no summary has a trigram.
    """
    repeated = total = 0
    for summary in summaries:
        seen: set[tuple[str, ...]] = set()
        for gram in ngrams(words(summary), 3):
            total += 1
            repeated += gram in seen
            seen.add(gram)
    return round(repeated / total, 4) if total else 0.0


def novel_ngram_rate(
    summaries: Sequence[str], sources: Sequence[str], n: int = 2
) -> float:
    """Summary n-grams not found among the source's n-grams / all, pooled.

    0 when no summary has an n-gram.
    """
    if len(summaries) != len(sources):
        raise ValueError(
            f"novel_ngram_rate: {len(summaries)} summaries for {len(sources)} sources."
        )
    novel = total = 0
    for summary, source in zip(summaries, sources, strict=True):
        known = set(ngrams(words(source), n))
        grams = ngrams(words(summary), n)
        total += len(grams)
        novel += sum(gram not in known for gram in grams)
    return round(novel / total, 4) if total else 0.0


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
    """BLEU, chrF and exact match of the hypotheses."""
    return score(["bleu", "chrf", "exact_match"], hypotheses, references)


def bucket_label(words: int, buckets=DEFAULT_BUCKETS) -> str:
    low = 1
    for high in buckets:
        if words <= high:
            return f"{low}-{high}"
        low = high + 1
    return f">{buckets[-1]}"


def bleu_by_length(
    sources: list[str],
    hypotheses: list[str],
    references: list[str],
    buckets=DEFAULT_BUCKETS,
) -> list[dict]:
    """Corpus BLEU per source-length bucket (whitespace words), in bucket order."""
    from sacrebleu.metrics import BLEU

    groups: dict[str, tuple[list[str], list[str]]] = {}
    order = [bucket_label(b, buckets) for b in buckets] + [f">{buckets[-1]}"]
    for source, hyp, ref in zip(sources, hypotheses, references, strict=True):
        hyps, refs = groups.setdefault(
            bucket_label(len(source.split()), buckets), ([], [])
        )
        hyps.append(hyp)
        refs.append(ref)
    rows = []
    for label in order:
        if label in groups:
            hyps, refs = groups[label]
            value = BLEU().corpus_score(hyps, [refs]).score
            rows.append(
                {"bucket": label, "sentences": len(hyps), "bleu": round(value, 2)}
            )
    return rows


class SequenceNLL(keras.losses.Loss):
    """Per sequence, the mean negative log-likelihood of its tokens (See et al.:
    ``loss = 1/T sum_t -log P(w*_t)``); the batch loss is the mean over sequences.

    ``y_pred`` are logits, or log-probabilities (a pointer-generator's: their
    log-softmax is themselves). ``pad_id`` targets are not counted. A mean over
    sequences, not over the batch's tokens, is what makes a replica's share
    of a batch add up to the whole under a distribution strategy (each
    replica holds as many sequences, not as many tokens) when the sequences'
    lengths differ.

    Example:

    >>> import numpy as np
    >>> log_p = np.log(np.array([[[0.5, 0.5], [0.25, 0.75], [0.5, 0.5]]]))
    >>> y = np.array([[1, 1, 0]])  # two tokens, then padding (pad_id 0)
    >>> round(float(SequenceNLL()(y, log_p)), 4)  # (log 2 + log 4/3) / 2
    0.4904
    """

    def __init__(self, pad_id: int = 0, name="sequence_nll", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        ops = keras.ops
        y_true = ops.cast(y_true, "int32")
        tokens = keras.losses.sparse_categorical_crossentropy(
            ops.maximum(y_true, 0), y_pred, from_logits=True
        )
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), tokens.dtype)
        count = ops.maximum(ops.sum(mask, axis=-1), 1.0)
        return ops.sum(tokens * mask, axis=-1) / count

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


class TokenAccuracy(keras.metrics.Metric):
    """Share of non-padding target tokens predicted right (teacher forcing)."""

    def __init__(self, pad_id: int = 0, name="token_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.hits = self.add_variable((), initializer="zeros", name="hits")
        self.count = self.add_variable((), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        ops = keras.ops
        y_true = ops.cast(y_true, "int32")
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        predicted = ops.cast(ops.argmax(y_pred, -1), "int32")
        hits = ops.cast(ops.equal(predicted, y_true), "float32") * mask
        self.hits.assign_add(ops.sum(hits))
        self.count.assign_add(ops.sum(mask))

    def result(self):
        return self.hits / keras.ops.maximum(self.count, 1.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


def teacher_forcing_arguments() -> dict:
    """``compile`` arguments of a model that predicts the next token: the
    cross-entropy of its logits over the non-padding targets and
    `TokenAccuracy`."""
    from pipelines.core.text import PAD

    return {
        "loss": keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=PAD
        ),
        "metrics": [TokenAccuracy(pad_id=PAD)],
    }


def sequence_arguments() -> dict:
    """``compile`` arguments like `teacher_forcing_arguments`, with the loss
    `SequenceNLL` (each sequence's token mean, then the mean over sequences):
    the same under a distribution strategy as on one device when the target
    lengths vary."""
    from pipelines.core.text import PAD

    return {"loss": SequenceNLL(pad_id=PAD), "metrics": [TokenAccuracy(pad_id=PAD)]}
