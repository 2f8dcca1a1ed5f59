"""The bundled English-Spanish Bible verse pairs (public domain)."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

BIBLE_PATH = Path(__file__).with_name("bible_en_es.tsv.gz")


def load_bible(path: str | Path | None = None) -> list[tuple[str, str]]:
    """``(english, spanish)`` verse pairs, lowercased, in canonical book order.

    Reads the gzip TSV ``ref<TAB>en<TAB>es`` written by ``extract_bible.py``.
    """
    rows = load_bible_rows(path)
    return [(en, es) for _, en, es in rows]


def load_bible_rows(path: str | Path | None = None) -> list[tuple[str, str, str]]:
    """``(ref, english, spanish)`` rows, e.g. ``("Genesis 1:1", ..., ...)``."""
    path = Path(path) if path is not None else BIBLE_PATH
    with gzip.open(path, "rt", encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader)
        if header != ["ref", "en", "es"]:
            raise ValueError(f"{path}: expected header ref/en/es, got {header}")
        return [(ref, en, es) for ref, en, es in reader]
