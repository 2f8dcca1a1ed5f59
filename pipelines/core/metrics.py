"""Translation metrics with sacrebleu: corpus BLEU, chrF, BLEU by source length.

Example:

>>> from pipelines.core.metrics import corpus_scores
>>> scores = corpus_scores(["the cat sat on the mat"], ["the cat sat on the mat"])
>>> round(scores["bleu"]), round(scores["chrf"]), scores["exact_match"]
(100, 100, 1.0)
"""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF

DEFAULT_BUCKETS = (10, 20, 30, 40, 60)


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """sacrebleu corpus BLEU (13a tokenization) and chrF, plus exact match."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"metrics: {len(hypotheses)} hypotheses for {len(references)} references."
        )
    if not hypotheses:
        raise ValueError("metrics: nothing to score (no hypotheses).")
    bleu_metric, chrf_metric = BLEU(), CHRF()
    bleu = bleu_metric.corpus_score(hypotheses, [references])
    chrf = chrf_metric.corpus_score(hypotheses, [references])
    exact = sum(
        h.strip() == r.strip() for h, r in zip(hypotheses, references, strict=True)
    )
    return {
        "bleu": round(bleu.score, 2),
        "chrf": round(chrf.score, 2),
        "exact_match": round(exact / len(references), 4),
        "bleu_signature": str(bleu_metric.get_signature()),
        "chrf_signature": str(chrf_metric.get_signature()),
        "sentences": len(references),
    }


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
            bleu = BLEU().corpus_score(hyps, [refs]).score
            rows.append(
                {"bucket": label, "sentences": len(hyps), "bleu": round(bleu, 2)}
            )
    return rows
