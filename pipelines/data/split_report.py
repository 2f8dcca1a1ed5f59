"""A printable summary of a data split."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pipelines.data.splits import Pair, Splits

UNITS = {"word": "words", "char": "characters"}


def _pieces(text: str, unit: str) -> list[str]:
    return list(text) if unit == "char" else text.split()


def _length_stats(texts: Sequence[str], unit: str = "word") -> str:
    if not texts:
        return "-"
    lengths = sorted(len(_pieces(text, unit)) for text in texts)
    p95 = lengths[math.ceil(0.95 * len(lengths)) - 1]  # nearest rank
    return (
        f"mean {statistics.fmean(lengths):.1f}, median {statistics.median(lengths):g}, "
        f"p95 {p95}, max {lengths[-1]}"
    )


def summarize(splits: Splits, samples: int = 2, unit: str = "word") -> str:
    """Pairs per split, lengths per side, the distinct pieces of the training
    split and a few sample pairs.

    ``unit`` is what the model reads: ``"char"`` counts characters (a
    character model's vocabulary is the characters it saw), anything else
    whitespace words (a word or subword model's own vocabulary is its
    tokenizer's, reported apart).

    >>> pairs = [("le 9 mars 1987", "1987-03-09"), ("9 march 1987", "1987-03-09")]
    >>> print(summarize(Splits(pairs, [], []), samples=0, unit="char"))
    train: 2 pairs
    valid: 0 pairs
    test: 0 pairs
    train source characters: mean 13.0, median 13, p95 14, max 14; 13 distinct
    train target characters: mean 10.0, median 10, p95 10, max 10; 7 distinct
    """
    name = UNITS.get(unit, "words")
    lines = []
    for split, pairs in zip(Splits._fields, splits, strict=True):
        lines.append(f"{split}: {len(pairs)} pairs")
    train: list[Pair] = splits.train
    for side, index in (("source", 0), ("target", 1)):
        texts = [pair[index] for pair in train]
        distinct = {piece for text in texts for piece in _pieces(text, unit)}
        lines.append(
            f"train {side} {name}: {_length_stats(texts, unit)}; "
            f"{len(distinct)} distinct"
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
    splits = Splits(data.train, data.valid, data.test)
    lines = [summarize(splits, unit=getattr(tok, "kind", "word")), *data.notes]
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
