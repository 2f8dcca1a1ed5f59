"""Deterministic train/valid/test splits by a stable hash of one side."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal, NamedTuple

Pair = tuple[str, str]


class Splits(NamedTuple):
    train: list[Pair]
    valid: list[Pair]
    test: list[Pair]


def bucket(text: str, seed: int = 0) -> float:
    """A number in [0, 1) fixed by ``text`` and ``seed`` alone (SHA-256)."""
    digest = hashlib.sha256(f"{seed}\x00{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_pairs(
    pairs: Sequence[Pair],
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
    seed: int = 0,
    key: Literal["source", "target"] = "source",
    valid_size: int | None = None,
    test_size: int | None = None,
    groups: Sequence[str] | None = None,
) -> Splits:
    """Split ``pairs`` by hashing their source (or target) text.

    A pair goes to test when ``bucket(text) < test_fraction``, to valid when it is
    below ``test_fraction + valid_fraction``, and to train otherwise. So pairs
    with the same key text are always in the same split, a pair's split does not
    change when other pairs are added or removed, and the order within each
    split is the input order. ``key="target"`` suits many-to-one data such as
    dates, where each target must be held out with all its sources.

    ``test_size`` / ``valid_size``, when given, take the pairs with the lowest
    buckets instead: exactly that many pairs, unless pairs sharing a key at the
    boundary are kept together (then a few more), and still stable in the sense
    that a held-out pair only leaves its split for a lower-bucket newcomer.

    ``groups``, when given, is one text per pair hashed instead of ``key``'s
    side: pairs with the same group text are always in the same split.
    """
    if key not in ("source", "target"):
        raise ValueError(f"key must be 'source' or 'target', got {key!r}")
    if not 0 <= valid_fraction + test_fraction <= 1:
        raise ValueError("valid_fraction + test_fraction must be in [0, 1]")
    if groups is not None and len(groups) != len(pairs):
        raise ValueError(f"{len(groups)} groups for {len(pairs)} pairs")
    side = 0 if key == "source" else 1
    texts = groups if groups is not None else [pair[side] for pair in pairs]
    buckets = [bucket(text, seed) for text in texts]
    test_limit = _limit(buckets, 0.0, test_size, test_fraction)
    valid_limit = _limit(buckets, test_limit, valid_size, valid_fraction)
    splits = Splits([], [], [])
    for pair, value in zip(pairs, buckets, strict=True):
        if value < test_limit:
            splits.test.append(pair)
        elif value < valid_limit:
            splits.valid.append(pair)
        else:
            splits.train.append(pair)
    return splits


def split_by_key(examples: Sequence, keys: Sequence[str], data) -> Splits:
    """``examples`` split as `split_pairs` splits pairs keyed by ``keys`` (one
    text per example: equal keys share a split), with the ``data`` section's
    ``valid_fraction``, ``test_fraction`` and ``seed``."""
    keyed = list(zip(keys, examples, strict=True))
    splits = split_pairs(keyed, data.valid_fraction, data.test_fraction, data.seed)
    return Splits(*([e for _, e in part] for part in splits))


def _limit(
    buckets: list[float], start: float, size: int | None, fraction: float
) -> float:
    """The bound above ``start`` that takes ``fraction``, or ``size`` pairs."""
    if size is None:
        return start + fraction
    counts: dict[float, int] = {}
    for value in buckets:
        if value >= start:
            counts[value] = counts.get(value, 0) + 1
    taken = 0
    for value in sorted(counts):
        if taken >= size:
            return value  # the first bucket not taken
        taken += counts[value]
    return 2.0  # everything above start
