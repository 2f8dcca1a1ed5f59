"""Metrics: a registry of evaluation scores by name, and training metrics.

Evaluation metrics are registered by name (`register`) and computed together
(`score`); each returns a dict of values (and, for sacrebleu, the signature
that makes the number reproducible). Tasks list the names they report.

Example:

>>> from pipelines.core.metrics import score
>>> scores = score(["bleu", "chrf", "exact_match"],
...                ["the cat sat on the mat"], ["the cat sat on the mat"])
>>> round(scores["bleu"]), round(scores["chrf"]), scores["exact_match"]
(100, 100, 1.0)
"""

from __future__ import annotations

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
