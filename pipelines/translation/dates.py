"""Dates written out in several locales, paired with their ISO form."""

from __future__ import annotations

import datetime
import random

LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "pt_BR", "nl_NL")
FORMATS = ("short", "medium", "long", "full")
FIRST_DATE = datetime.date(1950, 1, 1)
LAST_DATE = datetime.date(2049, 12, 31)


def render_date(date: datetime.date, locale: str, style: str) -> str:
    """``format_date`` from Babel, lowercased: ``"9 de marzo de 1987"``."""
    from babel.dates import format_date

    return format_date(date, format=style, locale=locale).lower()


def generate_dates(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` ``(text, "YYYY-MM-DD")`` pairs of distinct dates in 1950-2049.

    Each date gets a random locale of `LOCALES` and format of `FORMATS` (never
    ``short`` for ``en_US``: ``3/9/87`` reads either way). Deterministic in
    ``seed``. The ISO targets are all different, so splitting with
    ``key="target"`` keeps held-out dates out of training.
    """
    days = (LAST_DATE - FIRST_DATE).days + 1
    if not 0 <= n <= days:
        raise ValueError(f"n must be between 0 and {days}, got {n}")
    rng = random.Random(seed)
    pairs = []
    for offset in rng.sample(range(days), n):
        date = FIRST_DATE + datetime.timedelta(days=offset)
        locale = rng.choice(LOCALES)
        formats = FORMATS[1:] if locale == "en_US" else FORMATS
        pairs.append((render_date(date, locale, rng.choice(formats)), date.isoformat()))
    return pairs
