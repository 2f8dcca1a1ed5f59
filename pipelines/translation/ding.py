"""German-English example sentences from the Ding dictionary (Debian trans-de-en).

The dictionary is GPL-2+: it is read at run time from the Debian package and no
extract of it is stored in this repository.

Format: one entry a line, ``German :: English``; ``#`` starts a comment. Each side
holds sub-entries separated by `` | `` that correspond one to one (a headword,
its inflections, then example sentences), and each sub-entry may list synonyms
separated by ``; ``. The rule used here:

* entries whose two sides have different numbers of sub-entries are skipped;
* in each sub-entry, markers in braces and brackets (``{m}``, ``{pl}``, ``{v}``,
  ``[coll.]``, ``[Br.]``) and parenthesised notes (``(in sth.)``, ``(deep)``) are
  removed, and whitespace is collapsed;
* of synonyms (``Done!; It's a deal!``) the first one of each side is kept;
* a pair is kept when both sides end with ``.``, ``!`` or ``?`` and the German
  side has at least ``MIN_WORDS`` words: these are the example sentences;
* exact duplicate pairs are kept once, in file order.

Case and punctuation are kept as in the dictionary.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipelines.core.errors import MissingDataError

DING_PATH = "/usr/share/trans/de-en"
MIN_WORDS = 4
SENTENCE_END = (".", "!", "?")
_MARKERS = re.compile(r"\s*(?:\{[^{}]*\}|\[[^\[\]]*\])")
_PARENTHESES = re.compile(r"\s*\([^()]*\)")


def clean_phrase(text: str) -> str:
    """A sub-entry without markers and parenthesised notes, first synonym only."""
    text = _MARKERS.sub("", text)
    while True:  # nested parentheses, innermost first
        stripped = _PARENTHESES.sub("", text)
        if stripped == text:
            break
        text = stripped
    text = text.split("; ")[0]
    return " ".join(text.split())


def is_sentence(german: str, english: str) -> bool:
    return (
        german.endswith(SENTENCE_END)
        and english.endswith(SENTENCE_END)
        and len(german.split()) >= MIN_WORDS
    )


def parse_ding_line(line: str) -> list[tuple[str, str]]:
    """The ``(german, english)`` sentence pairs of one dictionary line."""
    line = line.strip()
    if not line or line.startswith("#") or " :: " not in line:
        return []
    german, english = line.split(" :: ", 1)
    german_parts, english_parts = german.split(" | "), english.split(" | ")
    if len(german_parts) != len(english_parts):
        return []
    pairs = []
    for de, en in zip(german_parts, english_parts, strict=True):
        de, en = clean_phrase(de), clean_phrase(en)
        if is_sentence(de, en):
            pairs.append((de, en))
    return pairs


def load_ding(path: str | Path = DING_PATH) -> list[tuple[str, str]]:
    """``(german, english)`` example sentence pairs of the Ding dictionary.

    Raises `MissingDataError` naming the Debian package when the file is absent.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(
            f"{path} not found: it comes with the Debian package trans-de-en "
            "(GPL-2+, not bundled here); install it with "
            "`apt-get install trans-de-en`"
        )
    seen: set[tuple[str, str]] = set()
    pairs = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            for pair in parse_ding_line(line):
                if pair not in seen:
                    seen.add(pair)
                    pairs.append(pair)
    return pairs
