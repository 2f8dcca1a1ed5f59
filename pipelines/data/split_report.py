"""A printable summary of a data split."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pipelines.data.splits import Pair, Splits


def _length_stats(texts: Sequence[str]) -> str:
    if not texts:
        return "-"
    words = sorted(len(text.split()) for text in texts)
    p95 = words[int(0.95 * (len(words) - 1))]
    return (
        f"mean {statistics.fmean(words):.1f}, median {statistics.median(words):g}, "
        f"p95 {p95}, max {words[-1]}"
    )


def summarize(splits: Splits, samples: int = 2) -> str:
    """Pairs per split, words per side, vocabulary sizes and a few sample pairs.

    Words and vocabulary are whitespace tokens; vocabulary counts the training
    split.
    """
    lines = []
    for name, pairs in zip(Splits._fields, splits, strict=True):
        lines.append(f"{name}: {len(pairs)} pairs")
    train: list[Pair] = splits.train
    for side, index in (("source", 0), ("target", 1)):
        texts = [pair[index] for pair in train]
        vocabulary = {word for text in texts for word in text.split()}
        lines.append(
            f"train {side} words: {_length_stats(texts)}; vocabulary {len(vocabulary)}"
        )
    for source, target in train[:samples]:
        lines.append(f"  {source!r} -> {target!r}")
    return "\n".join(lines)


def pair_summary(data, tokenizers, tok, names: tuple[str, str], vocabulary: str) -> str:
    """``data_summary.txt`` of (source, target) pairs: the split report, the
    loading notes, the ``vocabulary`` line, and how many sources and targets
    (``names``, plural) are longer than ``tok.max_source_tokens`` and
    ``tok.max_target_tokens`` in tokens of ``tokenizers`` (the source's and
    the target's)."""
    from pipelines.core.text import token_lengths

    pairs = data.train + data.valid + data.test
    lines = [summarize(Splits(data.train, data.valid, data.test)), *data.notes]
    lines.append(vocabulary)
    for side, name in enumerate(names):
        setting = f"max_{('source', 'target')[side]}_tokens"
        limit = getattr(tok, setting)
        lengths = token_lengths(tokenizers[side], [pair[side] for pair in pairs])
        lines.append(
            f"cut {int((lengths > limit).sum())} {name} longer than {limit} tokens "
            f"(tokenizer.{setting})"
        )
    return "\n".join(lines)
