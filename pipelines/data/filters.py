"""Length filtering of sentence pairs."""

from __future__ import annotations

from collections.abc import Iterable


def filter_length(
    pairs: Iterable[tuple[str, str]], max_source_words: int, max_target_words: int
) -> list[tuple[str, str]]:
    """Pairs with 1 to ``max_*_words`` whitespace-separated words on each side."""
    return [
        (source, target)
        for source, target in pairs
        if 0 < len(source.split()) <= max_source_words
        and 0 < len(target.split()) <= max_target_words
    ]
